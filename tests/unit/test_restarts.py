"""The supervisor's restarts (localkube.restarts) with real child processes that die: the
kubelet's backoff (exponential, capped, reset after a stable run), no zombie left, and
`slipstream cluster status` / `restart` telling what runs. The clock is injected; waits are
on observable state (the process gone, the report) with a deadline, never a fixed sleep."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slipstream.localkube import processes, restarts, supervisor

DEADLINE_S = 20.0


def test_backoff_doubles_up_to_its_cap_and_resets_after_a_stable_run() -> None:
    b = restarts.RestartBackoff(initial_s=1, factor=2, cap_s=10, stable_s=60)
    delays = []
    previous = None
    for _ in range(6):
        previous = b.next_delay(previous, ran_s=0.5)
        delays.append(previous)
    assert delays == [1, 2, 4, 8, 10, 10]
    assert b.next_delay(10, ran_s=59.9) == 10, "a crash loop stays at the cap"
    assert b.next_delay(10, ran_s=60) == 1, "a part that ran stable_s starts over"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Child:
    """A real child process (its own process group, as the stack's parts are)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.component = self._start()
        self.starts = 1

    def _start(self) -> processes.Component:
        argv = [sys.executable, "-c", "import time; time.sleep(300)"]
        return processes.Component("child", argv, self.log)

    def restart(self) -> None:
        self.component.stop()
        self.component = self._start()
        self.starts += 1

    def part(self) -> restarts.Part:
        return restarts.Part("child", lambda: self.component.pid, lambda: self.component.running(), self.restart)


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path / "child.log")
    yield c
    c.component.stop()


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:.0f} s: {what}"
        time.sleep(0.02)


def zombie_or_present(pid: int) -> bool:
    """True while /proc still lists the pid (running, or exited and not reaped)."""
    return Path(f"/proc/{pid}").exists()


def row(keeper: restarts.Keeper) -> dict[str, object]:
    (only,) = keeper.report()
    return only


def kill_and_see_down(keeper: restarts.Keeper, child: Child) -> int:
    pid = child.component.pid
    os.kill(pid, signal.SIGKILL)

    def noticed() -> bool:
        keeper.check()
        return row(keeper)["state"] == "down"

    until(noticed, "the killed child reported down")
    assert not zombie_or_present(pid), f"pid {pid} left as a zombie: the check must reap it"
    return pid


def test_a_child_that_dies_is_reaped_and_restarted_after_a_growing_delay(child: Child) -> None:
    clock = Clock()
    keeper = restarts.Keeper([child.part()], restarts.RestartBackoff(initial_s=1, factor=2, cap_s=4, stable_s=30), clock)
    keeper.check()
    assert row(keeper) == {"name": "child", "pid": child.component.pid, "state": "running", "restarts": 0}

    old = kill_and_see_down(keeper, child)
    assert row(keeper)["restart_in_s"] == 1.0
    clock.t += 0.9
    keeper.check()
    assert child.starts == 1, "restarted before its delay"
    clock.t += 0.1
    keeper.check()
    assert child.starts == 2 and child.component.pid != old and child.component.running()
    assert row(keeper)["state"] == "running" and row(keeper)["restarts"] == 1

    # Dies again within stable_s: twice the delay, then the cap.
    for expected in (2.0, 4.0, 4.0):
        clock.t += 5
        kill_and_see_down(keeper, child)
        assert row(keeper)["restart_in_s"] == expected
        clock.t += expected
        keeper.check()
        assert row(keeper)["state"] == "running"
    assert row(keeper)["restarts"] == 4

    # A stable run: the next crash waits the initial delay again.
    clock.t += 30
    kill_and_see_down(keeper, child)
    assert row(keeper)["restart_in_s"] == 1.0


def test_a_failed_restart_counts_as_a_crash_and_a_requested_one_resets_the_backoff(child: Child) -> None:
    clock = Clock()
    fail = {"once": True}

    def flaky() -> None:
        child.restart()
        if fail.pop("once", False):
            child.component.stop()
            raise RuntimeError("not healthy within 90s")

    part = restarts.Part("child", lambda: child.component.pid, lambda: child.component.running(), flaky)
    keeper = restarts.Keeper([part], restarts.RestartBackoff(initial_s=1, factor=2, cap_s=60, stable_s=30), clock)
    kill_and_see_down(keeper, child)
    clock.t += 1
    keeper.check()
    assert row(keeper)["last_error"] == "not healthy within 90s"
    clock.t += 0.1
    keeper.check()
    assert row(keeper)["state"] == "down" and row(keeper)["restart_in_s"] == 2.0, "the failed start doubles it"
    clock.t += 2
    keeper.check()
    assert row(keeper)["state"] == "running" and "last_error" not in row(keeper)
    before = child.component.pid
    keeper.restart_now("child")
    assert child.component.pid != before and child.component.running() and not zombie_or_present(before)
    kill_and_see_down(keeper, child)
    assert row(keeper)["restart_in_s"] == 1.0, "a requested restart resets the backoff"


# -- `cluster status` and `cluster restart` read the supervisor's state file ---------------------


def status_of(workdir: Path, components: list[dict[str, object]], capsys: pytest.CaptureFixture[str]
              ) -> tuple[int, str]:  # fmt: skip
    supervisor.write_state(workdir, {"supervisor_pid": os.getpid(), "phase": "Ready", "components": components})
    code = supervisor.cmd_status(argparse.Namespace(workdir=str(workdir)))
    return code, capsys.readouterr().out


def test_status_is_ready_only_when_every_component_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    code, out = status_of(tmp_path, [{"name": "etcd", "pid": me, "state": "running", "restarts": 0},
                                     {"name": "operator", "pid": me, "state": "running", "restarts": 1}], capsys)  # fmt: skip
    assert code == 0 and out.startswith("ready"), out
    # The record says running, but the process is gone: down, whatever the record says.
    code, out = status_of(tmp_path, [{"name": "etcd", "pid": me, "state": "running", "restarts": 0},
                                     {"name": "operator", "pid": dead.pid, "state": "running", "restarts": 1}], capsys)  # fmt: skip
    assert code == 1, out
    assert out.startswith("degraded: 1 of 2 component(s) down (operator) (supervisor pid"), out
    assert any(line.split()[:1] == ["DOWN"] and "operator" in line for line in out.splitlines()), out
    code, out = status_of(tmp_path, [{"name": "prometheus", "pid": None, "state": "down", "restarts": 2,
                                      "restart_in_s": 4.0}], capsys)  # fmt: skip
    assert code == 1 and "restart in 4 s" in out, out


def test_restart_names_the_components_it_knows(tmp_path: Path) -> None:
    supervisor.write_state(tmp_path, {"supervisor_pid": os.getpid(), "phase": "Ready",
                                      "components": [{"name": "operator", "pid": os.getpid(), "state": "running"}]})  # fmt: skip
    with pytest.raises(supervisor.ClusterCommandError, match="no component 'operater'; COMPONENT is one of: operator"):
        supervisor.cmd_restart(argparse.Namespace(workdir=str(tmp_path), component="operater"))
    assert not (tmp_path / supervisor.REQUESTS).exists(), "a refused name leaves no request"
    supervisor.request_restart(tmp_path, "operator")
    assert supervisor.take_requests(tmp_path) == ["operator"] and supervisor.take_requests(tmp_path) == []


def test_the_state_file_round_trips(tmp_path: Path) -> None:
    supervisor.write_state(tmp_path, {"components": [{"name": "x"}]})
    assert json.loads((tmp_path / supervisor.STATE).read_text()) == {"components": [{"name": "x"}]}
