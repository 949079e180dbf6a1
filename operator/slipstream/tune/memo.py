"""Reuse a deployment's last recommendation while its workload has not moved.

A recommendation costs a fraction of a CPU second (45 candidates on the twin), and the
operator asks for one per deployment per interval: for hundreds of deployments that is
cores of twin runs alone (docs/reliability.md, "Scale", has the figure). Steady
traffic gives nearly the same snapshot interval after interval, and the twin, fed the same
workload, predicts the same. So each deployment keeps its last recommendation with a
fingerprint of what the twin read from the snapshot, and re-runs the twin only when

- the workload moved from the snapshot the twin last ran on by more than the sampling
  noise of a window (and at least the twin's resolution): a tenant's rate, TTFT p99 or
  prompt-length mean, a histogram's shape (a two-sample Kolmogorov-Smirnov bound), a
  cache-hit ratio by 0.02, a tenant came or went (``fingerprint``); or
- the current setting, the spec's bounds, the recommender's settings or the twin's
  profile or engine config changed; or
- the recommendation is older than its lifetime: ``max_age_s`` less up to ``jitter`` of it,
  drawn per entry from a hash of the deployment and the time it was made (a bound on how
  long anything may be reused, whatever the fingerprint says). The spread is there because
  the runs a fleet makes together (the first round after a start) would otherwise all
  expire together, ``max_age_s`` later, and queue hundreds of twin runs at once; spread,
  they come back over ``jitter x max_age_s`` and spread further each round.

The guardrails still judge every interval's fresh snapshot (gate before, decide after): only
the twin's predictions are reused. Pure: no clock of its own (``now`` is passed in).
"""

from __future__ import annotations

import math
import threading
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Any

from slipstream.api.snapshot import Histogram, WorkloadSnapshot

RELATIVE = math.log(1.05)
"""Rates, p99s and means always count as the same within 5% (the recommender's tie band)."""
SHARE = 0.01
"""Histogram cumulative shares always count as the same within a percentage point."""
RATIO = 0.02
"""Cache-hit ratios count as the same within 0.02."""
KS_95 = 1.36
"""Two samples' cumulative shares differ beyond noise (95%) when they differ by more than
1.36 x sqrt(2 / n) (Kolmogorov-Smirnov, n samples each)."""


def _noise(n: float, scale: float) -> float:
    """Sampling noise of a figure estimated from ``n`` samples (scale / sqrt(n))."""
    return scale / math.sqrt(max(n, 1.0))


@dataclass(frozen=True)
class Fingerprint:
    """What the recommender reads from a snapshot: the parts that must be equal, and the
    numbers that may differ by their tolerance (their sampling noise, at least the twin's
    resolution). Compared with the snapshot the twin last ran on, so a slow drift adds up
    and re-runs it."""

    exact: tuple[Any, ...]
    values: array[float]
    tolerances: array[float]
    """Plain doubles (8 bytes each, not a float object each): the memo keeps one
    fingerprint per deployment between intervals."""

    def close_to(self, other: Fingerprint) -> bool:
        return self.exact == other.exact and all(
            abs(a - b) < max(ta, tb)
            for a, b, ta, tb in zip(self.values, other.values, self.tolerances, other.tolerances, strict=True)
        )


def fingerprint(snapshot: WorkloadSnapshot, calibration_min_samples: int) -> Fingerprint:
    """The snapshot as the recommender sees it: per tenant the rate (tolerance 2/sqrt(n)
    relative, n first tokens), the TTFT p99 the twin is calibrated to (1/sqrt(n/100): a
    p99 rests on the top 1% of the window), the prompt and output length histograms
    (cumulative shares within the KS bound, mean within 2/sqrt(n)) and the cache-hit ratio;
    and, when the engines export it, the queue mix (arrivals, each size class's requests and
    cached share), from which the twin's workload is then made. Anything not finite must
    match exactly."""
    exact: list[Any] = [round(snapshot.window_s, 3)]
    values: list[float] = []
    tolerances: list[float] = []

    def log(value: float, tolerance: float) -> None:
        if math.isfinite(value) and value > 0:
            exact.append("+")
            values.append(math.log(value))
            tolerances.append(max(RELATIVE, tolerance))
        else:
            exact.append(str(value))

    def histogram(hist: Histogram | None) -> None:
        if hist is None or not hist.finite or hist.total <= 0:
            exact.append(None if hist is None else ("empty", hist.bounds, str(hist.total)))
            return
        exact.append(hist.bounds)
        values.extend(c / hist.total for c in hist.counts)
        tolerances.extend([max(SHARE, KS_95 * math.sqrt(2 / hist.total))] * len(hist.counts))
        log(hist.sum / hist.total, _noise(hist.total, 2.0))

    for t in sorted(snapshot.tenants, key=lambda t: t.name):
        calibrated = t.ttft.total >= calibration_min_samples and t.ttft.finite
        exact.extend((t.name, calibrated, t.cache_hit_ratio is None))
        log(t.requests_per_s, _noise(t.ttft.total if t.ttft.finite else 0.0, 2.0))
        if calibrated:
            log(t.ttft_p99_s, _noise(t.ttft.total / 100, 1.0))
        histogram(t.uncached_tokens)
        histogram(t.output_tokens)
        if t.cache_hit_ratio is not None:
            values.append(t.cache_hit_ratio)
            tolerances.append(RATIO)
    histogram(snapshot.uncached_tokens)
    exact.append(snapshot.mix_fallback)
    for m in sorted(snapshot.queue_mix, key=lambda m: m.name):
        # The twin's workload is made from the mix when there is one (tune/twin_workload.py):
        # arrivals, each class's requests (through and waiting) and its cached share.
        arrived = m.arrivals_per_s * snapshot.window_s
        exact.append(m.name)
        log(m.arrivals_per_s, _noise(arrived, 2.0))
        for c in m.classes:
            seen = c.first_tokens + c.queued
            exact.append(c.name)
            log(seen, _noise(seen, 2.0))
            ratio = c.cached_per_uncached
            exact.append(ratio is None)
            if ratio is not None:
                values.append(ratio / (1.0 + ratio))  # cached share of the prompt, in [0, 1]
                tolerances.append(RATIO)
    return Fingerprint(tuple(exact), array("d", values), array("d", tolerances))


@dataclass(frozen=True, slots=True)
class Entry:
    """A deployment's last twin run: what it was made under and from, and until when it
    may be reused."""

    key: tuple[Any, ...]
    seen: Fingerprint
    made: float
    expires: float
    recommendation: Any


def lifetime(name: str, made: float, max_age_s: float, jitter: float) -> float:
    """How long the run ``name`` made at ``made`` may be reused: ``max_age_s`` times
    1 - jitter x u, u in [0, 1) from a hash of both (deterministic, so a test or a replay
    gets the same; spread across deployments, and different each round)."""
    u = zlib.crc32(f"{name}@{made!r}".encode()) / 2**32
    return max_age_s * (1.0 - jitter * u)


@dataclass
class Memo:
    """The last recommendation of each deployment, by deployment name."""

    max_age_s: float
    """Longest a recommendation is reused (seconds of the caller's clock)."""
    jitter: float = 1 / 3
    """Share of ``max_age_s`` by which an entry's lifetime is shortened at most (``lifetime``)."""
    entries: dict[str, Entry] = field(default_factory=dict)
    runs: int = 0
    reused: int = 0
    pruned_at: float = -math.inf
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """The operator reads the memo on its event loop (``tuner.without_twin``) and writes it
    from the tuner pool's threads (``tuner.with_twin``), several at once: every read and
    write of ``entries`` and the counters holds this lock. Held only for a dict look-up or a
    prune of stale entries, never across a twin run, so the event loop never waits on it
    for longer than that. Entries are replaced whole and the recommendations are frozen:
    what ``get`` returned is never changed afterwards."""

    def get(self, name: str, key: tuple[Any, ...], seen: Fingerprint, now: float) -> Any | None:
        """The recommendation stored for ``name`` if made under ``key`` (setting, spec,
        profile: equal), from a snapshot close to ``seen``, and within its lifetime."""
        with self.lock:
            found = self.entries.get(name)
            if found is None or found.key != key or not found.seen.close_to(seen):
                return None
            if not found.made <= now < found.expires:
                return None
            self.reused += 1
            return found.recommendation

    def put(self, name: str, key: tuple[Any, ...], seen: Fingerprint, now: float, recommendation: Any) -> None:
        """Store a fresh recommendation; expired entries (deleted deployments) go."""
        with self.lock:
            self.runs += 1
            if now - self.pruned_at >= self.max_age_s:
                self.entries = {n: e for n, e in self.entries.items() if now < e.expires}
                self.pruned_at = now
            expires = now + lifetime(name, now, self.max_age_s, self.jitter)
            self.entries[name] = Entry(key, seen, now, expires, recommendation)
