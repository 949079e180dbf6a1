"""Reuse a deployment's last recommendation while its workload has not moved.

A recommendation costs ~0.2-0.7 s of CPU (45 candidates on the twin), and the operator
asks for one per deployment per interval: 500 deployments at a 60 s interval would need
about three cores for the twin alone (measured in docs/reliability.md, "Scale"). Steady
traffic gives nearly the same snapshot interval after interval, and the twin, fed the same
workload, predicts the same. So each deployment keeps its last recommendation with a
fingerprint of what the twin read from the snapshot, and re-runs the twin only when

- the workload moved from the snapshot the twin last ran on: a tenant's rate, p99 TTFT or
  prompt-length mean by 5% or more, a bucket's cumulative share of a histogram by a
  percentage point or more, a cache-hit ratio by 0.02 or more, a tenant came or went; or
- the current setting, the spec's bounds, the recommender's settings or the twin's
  profile or engine config changed; or
- the recommendation is older than ``max_age_s`` (a bound on how long anything may be
  reused, whatever the fingerprint says).

The guardrails still judge every interval's fresh snapshot (gate before, decide after): only
the twin's predictions are reused. Pure: no clock of its own (``now`` is passed in).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from slipstream.api.snapshot import Histogram, WorkloadSnapshot

RELATIVE = math.log(1.05)
"""Rates, p99s and means may differ by less than 5% (the recommender's tie band)."""
SHARE = 0.01
"""A histogram bucket's cumulative share may differ by less than a percentage point."""
RATIO = 0.02
"""A cache-hit ratio may differ by less than 0.02."""


@dataclass(frozen=True)
class Fingerprint:
    """What the recommender reads from a snapshot: the parts that must be equal, and the
    numbers that may move a little (compared with the snapshot the twin last ran on, so a
    slow drift adds up and re-runs it)."""

    exact: tuple[Any, ...]
    logs: tuple[float, ...]
    shares: tuple[float, ...]
    ratios: tuple[float, ...]

    def close_to(self, other: Fingerprint) -> bool:
        return (
            self.exact == other.exact
            and all(abs(a - b) < RELATIVE for a, b in zip(self.logs, other.logs, strict=True))
            and all(abs(a - b) < SHARE for a, b in zip(self.shares, other.shares, strict=True))
            and all(abs(a - b) < RATIO for a, b in zip(self.ratios, other.ratios, strict=True))
        )


def fingerprint(snapshot: WorkloadSnapshot, calibration_min_samples: int) -> Fingerprint:
    """The snapshot as the recommender sees it (rates, TTFT p99 where calibrated, prompt and
    output length histograms, cache-hit ratios). Anything not finite must match exactly."""
    exact: list[Any] = [round(snapshot.window_s, 3)]
    logs: list[float] = []
    shares: list[float] = []
    ratios: list[float] = []

    def number(value: float) -> None:
        if math.isfinite(value) and value > 0:
            logs.append(math.log(value))
            exact.append("+")
        else:
            exact.append(str(value))

    def histogram(hist: Histogram | None) -> None:
        if hist is None or not hist.finite or hist.total <= 0:
            exact.append(None if hist is None else ("empty", hist.bounds, str(hist.total)))
            return
        exact.append(hist.bounds)
        shares.extend(c / hist.total for c in hist.counts)
        number(hist.sum / hist.total)

    for t in sorted(snapshot.tenants, key=lambda t: t.name):
        calibrated = t.ttft.total >= calibration_min_samples and t.ttft.finite
        exact.extend((t.name, calibrated, t.cache_hit_ratio is None))
        number(t.requests_per_s)
        if calibrated:
            number(t.ttft_p99_s)
        histogram(t.uncached_tokens)
        histogram(t.output_tokens)
        if t.cache_hit_ratio is not None:
            ratios.append(t.cache_hit_ratio)
    histogram(snapshot.uncached_tokens)
    return Fingerprint(tuple(exact), tuple(logs), tuple(shares), tuple(ratios))


@dataclass
class Memo:
    """The last recommendation of each deployment, by deployment name."""

    max_age_s: float
    """Longest a recommendation is reused (seconds of the caller's clock)."""
    entries: dict[str, tuple[tuple[Any, ...], Fingerprint, float, Any]] = field(default_factory=dict)
    runs: int = 0
    reused: int = 0
    pruned_at: float = -math.inf
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """The operator's loops call from worker threads."""

    def get(self, name: str, key: tuple[Any, ...], seen: Fingerprint, now: float) -> Any | None:
        """The recommendation stored for ``name`` if made under ``key`` (setting, spec,
        profile: equal), from a snapshot close to ``seen``, and younger than max_age_s."""
        with self.lock:
            found = self.entries.get(name)
            if found is None or found[0] != key or not found[1].close_to(seen):
                return None
            if not 0 <= now - found[2] < self.max_age_s:
                return None
            self.reused += 1
            return found[3]

    def put(self, name: str, key: tuple[Any, ...], seen: Fingerprint, now: float, recommendation: Any) -> None:
        """Store a fresh recommendation; entries unused for max_age_s (deleted deployments) go."""
        with self.lock:
            self.runs += 1
            if now - self.pruned_at >= self.max_age_s:
                self.entries = {n: e for n, e in self.entries.items() if now - e[2] < self.max_age_s}
                self.pruned_at = now
            self.entries[name] = (key, seen, now, recommendation)
