"""When to ask a failing Prometheus again: exponential backoff with a cap, clock injected.

A Prometheus that is down or answering errors is not asked every interval for every
deployment: after the n-th failure in a row the next query waits
``min(max_s, initial_s * 2**(n-1))`` seconds, and the first answer that parses resets it.
While waiting, the observer returns ``PrometheusUnreachable`` snapshots that say when it
will try again, so nothing downstream moves and the condition stays put (one Warning Event
on the transition, not one per interval: the controller's part).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """Failure streak and the time of the next attempt (plain state, no clock of its own)."""

    initial_s: float = 10.0
    """First wait after a failure: about one control interval."""
    max_s: float = 300.0
    """Longest wait: a recovered Prometheus is noticed within five minutes."""
    failures: int = 0
    """Failed reads in a row."""
    next_try_at: float = 0.0
    """Unix seconds before which no query is sent."""
    last_error: str = ""
    failing_since: float | None = None

    def waiting(self, now: float) -> bool:
        """True while a failed read's backoff has not run out."""
        return self.failures > 0 and now < self.next_try_at

    def failed(self, now: float, error: str) -> float:
        """Record a failure at ``now``; return the seconds until the next attempt."""
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = now
        delay = float(min(self.max_s, self.initial_s * 2.0 ** (self.failures - 1)))
        self.next_try_at = now + delay
        self.last_error = error
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.next_try_at = 0.0
        self.last_error = ""
        self.failing_since = None
