"""Restart what dies, as the kubelet restarts a container: with a capped exponential backoff.

The rule, for each part of a stack (a control-plane component, Prometheus, the operator,
the engine-pod runner):

1. each pass asks the part whether it runs; asking reaps an exited child
   (``Popen.poll``), so a dead process never lingers as a zombie;
2. when it is found down, the delay before the next start is ``RestartBackoff.next_delay``:
   ``initial_s`` after a part that had run for ``stable_s`` or more (or never
   restarted), else the previous delay times ``factor``, at most ``cap_s``;
3. once the delay has passed the part is restarted (its restart stops what is left
   of the old process group, then starts it with the same command line, ports and
   data, and waits until it is healthy); a restart that fails counts as a run of
   zero seconds, so the next delay doubles;
4. ``restart_now`` (``slipstream cluster restart NAME``) restarts a part at once and
   resets its backoff: a restart asked for is not a crash.

``Keeper`` is plain bookkeeping over an injected clock, so its schedule is tested
without sleeping; the parts do the I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartBackoff:
    """The kubelet's CrashLoopBackOff, scaled to a stack on one machine."""

    initial_s: float = 1.0
    """Seconds before the first restart. The kubelet waits 10 s; here a crashed operator
    holds a rollout in flight, and 1 s is still enough to keep a crash loop off the CPU."""

    factor: float = 2.0
    """Each further restart within ``stable_s`` waits this many times longer (the kubelet's)."""

    cap_s: float = 60.0
    """Longest wait between restarts (the kubelet's is 300 s): a part broken for good costs
    one start a minute, and a fixed one is back within a minute."""

    stable_s: float = 120.0
    """A part that ran this long before it died starts again after ``initial_s``: its last
    crash is not part of a loop (the kubelet resets after 10 minutes, twice its cap)."""

    def next_delay(self, previous_s: float | None, ran_s: float) -> float:
        """Seconds to wait before starting a part that ran ``ran_s`` s after the last delay
        ``previous_s`` (None: it has not been restarted yet, or its backoff was reset)."""
        if previous_s is None or ran_s >= self.stable_s:
            return self.initial_s
        return min(self.cap_s, previous_s * self.factor)


@dataclass(frozen=True)
class Part:
    """One restartable part of a stack, as three callables (the part keeps its process)."""

    name: str
    pid: Callable[[], int | None]
    """Its process id now (also its process group's), None when it has none."""
    running: Callable[[], bool]
    """Whether it runs; must reap an exited child (``Popen.poll``)."""
    restart: Callable[[], None]
    """Stop what is left of it, start it again and wait until it is healthy; raise if not."""


@dataclass
class _Record:
    started_at: float
    restarts: int = 0
    delay_s: float | None = None
    down_since: float | None = None
    due_at: float | None = None
    last_error: str = ""


class Keeper:
    """Restarts each part that has died, after its backoff; one ``check()`` per pass."""

    def __init__(
        self, parts: Sequence[Part], backoff: RestartBackoff | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.parts = {part.name: part for part in parts}
        self.backoff = backoff or RestartBackoff()
        self.clock = clock
        now = clock()
        self._records = {name: _Record(started_at=now) for name in self.parts}

    def check(self) -> None:
        """One pass: note each part found down, restart those whose delay has passed."""
        for name, part in self.parts.items():
            record = self._records[name]
            if part.running():
                continue
            now = self.clock()
            if record.down_since is None:
                record.down_since = now
                record.delay_s = self.backoff.next_delay(record.delay_s, now - record.started_at)
                record.due_at = now + record.delay_s
                log.warning("supervisor: %s is down; restarting it in %.0f s", name, record.delay_s)
            if record.due_at is not None and now >= record.due_at:
                self._restart(name, part, record)

    def restart_now(self, name: str) -> None:
        """Restart ``name`` at once and reset its backoff. Raises KeyError for an unknown name."""
        part = self.parts[name]
        record = self._records[name]
        record.delay_s = None
        self._restart(name, part, record)

    def _restart(self, name: str, part: Part, record: _Record) -> None:
        try:
            part.restart()
        except Exception as exc:  # noqa: BLE001 - counted as a run of zero seconds; the next waits longer
            record.last_error = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            log.warning("supervisor: restarting %s failed: %s", name, exc)
        else:
            record.restarts += 1
            record.last_error = ""
            log.info("supervisor: %s restarted (pid %s, restart %d)", name, part.pid(), record.restarts)
        record.started_at = self.clock()
        record.down_since = record.due_at = None

    def report(self) -> list[dict[str, Any]]:
        """One plain record per part, for the state file and ``cluster status``."""
        now = self.clock()
        out = []
        for name, part in self.parts.items():
            record = self._records[name]
            down = record.down_since is not None or not part.running()
            row: dict[str, Any] = {
                "name": name, "pid": part.pid(), "state": "down" if down else "running",
                "restarts": record.restarts,
            }  # fmt: skip
            if down and record.due_at is not None:
                row["restart_in_s"] = round(max(0.0, record.due_at - now), 1)
            if record.last_error:
                row["last_error"] = record.last_error
            out.append(row)
        return out
