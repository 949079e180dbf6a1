"""The soak's operator kill: it fires on a canary in flight, never on a phase it read before waiting for the lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from slipstream.demo import soak
from slipstream.demo.soak_plan import SoakFault


class WatchedLock:
    """A lock that says when someone first tries to take it."""

    def __init__(self) -> None:
        self.lock, self.tried = threading.Lock(), threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.tried.set()
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()


@dataclass
class FakeInjector:
    """What `soak.Killer` uses of the injector: the samples, the twin clock, the lock, the stack."""

    phase: str
    now_s: float = 100.0
    busy: WatchedLock = field(default_factory=WatchedLock)
    killed: list[tuple[float, str]] = field(default_factory=list)
    restarts: int = 0

    def __post_init__(self) -> None:
        self.samplers = SimpleNamespace(fleet=[SimpleNamespace(rollout_phase=self.phase)])
        self.stack = SimpleNamespace(operator=SimpleNamespace(pid=424242), restart_operator=self.restart)

    def twin_now(self) -> float:
        return self.now_s

    def restart(self) -> None:
        self.restarts += 1

    def record(self, fault: SoakFault, start: float, text: str) -> None:
        self.killed.append((start, text))

    def show(self, phase: str) -> None:
        self.samplers.fleet.append(SimpleNamespace(rollout_phase=phase))


@pytest.fixture
def no_kill(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(soak.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(soak.time, "sleep", lambda s: None)
    return sent


def test_a_kill_fires_at_a_canary_in_flight(no_kill: list[Any]) -> None:
    inj = FakeInjector("Analysis")
    killer = soak.Killer(inj, [], deadline_s=1000.0)  # type: ignore[arg-type]
    assert killer.fire(SoakFault(50.0, "operator-kill"))
    assert no_kill == [(424242, soak.signal.SIGKILL)] and inj.restarts == 1
    assert inj.killed == [(100.0, "SIGKILLed with the rollout Analysis (armed at 50 s), started again")]


def test_a_canary_that_ends_while_another_fault_holds_the_lock_is_not_killed_for(no_kill: list[Any]) -> None:
    """The phase is read again once the lock is held: the kill waits for the next canary,
    or, as here, for its deadline, and says which phase it found."""
    inj = FakeInjector("Analysis")
    killer = soak.Killer(inj, [], deadline_s=1000.0)  # type: ignore[arg-type]
    inj.busy.lock.acquire()  # another fault is being injected
    worker = threading.Thread(target=killer.fire, args=(SoakFault(50.0, "operator-kill"),), daemon=True)
    worker.start()
    assert inj.busy.tried.wait(5.0), "the killer saw the canary and waits for the lock"
    inj.show("Idle")  # the canary ended while the killer waited for the lock
    inj.busy.release()
    worker.join(0.5)  # half a second of its 0.2 s polls, with no canary in flight
    assert worker.is_alive(), "it waits on"
    assert no_kill == []
    inj.now_s = 1000.0  # the deadline
    worker.join(5.0)
    assert not worker.is_alive()
    assert inj.killed == [(1000.0, "SIGKILLed with the rollout Idle (armed at 50 s), started again")]
