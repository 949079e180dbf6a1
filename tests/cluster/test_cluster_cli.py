"""`slipstream cluster up | status | down` as a user runs them: a stack that outlives the
command, and nothing left running afterwards, whether `down` stops a live supervisor,
cleans up after a supervisor killed with SIGKILL, or `up` itself is interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import eventually, processes_mentioning
from slipstream.localkube import binaries

UP_S = 300


def slipstream(*args: str, timeout: float = UP_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slipstream.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def nothing_left(workdir: Path, pids: list[int]) -> None:
    def check() -> None:
        assert not processes_mentioning(str(workdir)), processes_mentioning(str(workdir))
        assert not [p for p in pids if alive(p)], [p for p in pids if alive(p)]

    eventually(check, deadline_s=30, what="every process of the cluster gone")


def test_up_status_down_and_a_killed_supervisor_leave_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    up = slipstream("cluster", "up", f"--workdir={workdir}", "--time-scale=4")
    assert up.returncode == 0, up.stderr
    kubeconfig = workdir / "cluster" / "admin.kubeconfig"
    assert f"export KUBECONFIG={kubeconfig}" in up.stdout.splitlines()
    status = slipstream("cluster", "status", f"--workdir={workdir}")
    assert status.returncode == 0 and "prometheus" in status.stdout and "operator" in status.stdout, status.stdout
    nodes = subprocess.run([str(binaries.default_bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes",
                            "-o", "name"], capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "node/kwok-h200-0" in nodes.stdout
    helm = subprocess.run([str(binaries.default_bin_dir() / "helm"), f"--kubeconfig={kubeconfig}", "list", "-A"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "slipstream" in helm.stdout
    again = slipstream("cluster", "up", f"--workdir={workdir}")
    assert again.returncode == 0 and "already up" in again.stderr

    state = json.loads((workdir / "state.json").read_text())
    pids = [state["supervisor_pid"], *state["pids"].values()]
    # The supervisor dies without cleaning up: `down` still stops every recorded process group.
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    down = slipstream("cluster", "down", f"--workdir={workdir}")
    assert down.returncode == 0, down.stderr
    assert "leftover" in down.stderr
    nothing_left(workdir, pids)
    assert slipstream("cluster", "status", f"--workdir={workdir}").returncode == 3
    assert not (workdir / "state.json").exists()


def test_sigterm_of_up_while_it_starts_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    up = subprocess.Popen([sys.executable, "-m", "slipstream.cli", "cluster", "up", f"--workdir={workdir}"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def apiserver_started() -> list[int]:
        found = [pid for pid, cmd in processes_mentioning(str(workdir)) if "kube-apiserver" in cmd]
        assert found, "no apiserver yet"
        return found

    started = eventually(apiserver_started, deadline_s=120, what="the apiserver started by `up`")
    state = json.loads((workdir / "state.json").read_text())
    up.send_signal(signal.SIGTERM)
    _, err = up.communicate(timeout=120)
    assert up.returncode != 0, err
    nothing_left(workdir, [state["supervisor_pid"], *started])
    assert not (workdir / "state.json").exists()
