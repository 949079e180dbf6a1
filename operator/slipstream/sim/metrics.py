"""Per-request outcomes and their summary: TTFT, slowdown, inter-token gaps.

Slowdown (TTFT over the same request's TTFT alone on an idle engine with the same cache
state) is the headline: a long cold prompt's TTFT is mostly its own prefill, which no
scheduler can shorten, while a short request's TTFT behind it is mostly queueing. Its
physical limit is 1. In the model it can dip a hair below: alone, a prompt's last chunk
may be compute-bound, while in a shared pass part of it can ride under that pass's
memory-bound floor (at most one weights read is saved so; tests/unit/test_engine.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import compress
from typing import Any

from slipstream.sim.engine import Job, SimResult


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, numpy's default rule."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def nearest_rank(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of the values that are not NaN; NaN for none.
    The rank a p99 of measured latencies is read at, live and in the demo's figures
    (``percentile`` interpolates instead, as numpy does)."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def weighted_percentile(values: Sequence[float], weights: Sequence[int], q: float) -> float:
    """``percentile`` of the multiset holding each value ``weight`` times (same rule).

    Exact without sorting every pair: a high quantile of millions of inter-token gaps
    (``itl_p99``) only needs the pairs at and above its rank, so those are kept by a
    threshold (``_tail_threshold``) and sorted alone; the values below it only shift the
    rank, by their total weight. Same value to the bit as the full sort; a threshold that
    keeps too little falls back to the full sort.
    """
    total = _positive_total(weights)
    if not total:
        return math.nan
    pos = (total - 1) * q / 100.0
    lo = math.floor(pos)
    cut = _tail_threshold(values, weights, q)
    if cut is not None:
        kept = _pairs_at_least(values, weights, cut)
        below = total - sum(w for _, w in kept)
        if below <= lo:
            return _interpolate(kept, lo - below, pos - lo)
    pairs = sorted((v, w) for v, w in zip(values, weights, strict=True) if w > 0)
    return _interpolate(pairs, lo, pos - lo)


def _positive_total(weights: Sequence[int]) -> int:
    """Sum of the positive weights (pairs of weight <= 0 count for nothing)."""
    if not weights:
        return 0
    if min(weights) >= 0:  # the usual case (a weight of 0 adds nothing), at C speed
        return sum(weights)
    return sum(w for w in weights if w > 0)


TAIL_SAMPLE = 4096
"""About this many pairs are sampled to place ``weighted_percentile``'s threshold."""
TAIL_MARGIN = 0.5
"""The threshold sits this many percentiles below q on the sample, so that the sample's
error rarely puts it above the true rank (then the full sort runs, same result)."""


def _tail_threshold(values: Sequence[float], weights: Sequence[int], q: float) -> float | None:
    """A value at or below the q-th weighted percentile, most likely, from an evenly strided
    sample; None where a full sort is as cheap (few pairs, or q not in the upper tail)."""
    if len(values) < 8 * TAIL_SAMPLE or q < 90.0:
        return None
    stride = len(values) // TAIL_SAMPLE
    sample = sorted((v, w) for v, w in zip(values[::stride], weights[::stride], strict=True)
                    if w > 0)
    if not sample:
        return None
    total = sum(w for _, w in sample)
    rank = (total - 1) * (q - TAIL_MARGIN) / 100.0
    seen = 0
    for value, weight in sample:
        seen += weight
        if seen > rank:
            return value
    return sample[0][0]


def _pairs_at_least(values: Sequence[float], weights: Sequence[int], cut: float
                    ) -> list[tuple[float, int]]:
    """The (value, weight) pairs with value >= ``cut`` and weight > 0, sorted."""
    tail = compress(zip(values, weights, strict=True), map(cut.__le__, values))
    return sorted((v, w) for v, w in tail if w > 0)


def _interpolate(pairs: Sequence[tuple[float, int]], lo: int, frac: float) -> float:
    """The value at expanded rank ``lo`` of sorted ``pairs``, interpolated ``frac`` of the way
    to the next: the walk ``percentile``'s rule takes over weights."""
    seen = 0
    lo_value = hi_value = pairs[-1][0]
    for k, (value, weight) in enumerate(pairs):
        if seen + weight > lo:
            lo_value = value
            hi_value = value if seen + weight > lo + 1 else pairs[min(k + 1, len(pairs) - 1)][0]
            break
        seen += weight
    return lo_value + (hi_value - lo_value) * frac


def itl_p99(result: SimResult) -> float | None:
    """p99 of every inter-token gap of every stream (None when nothing decoded)."""
    values = [*result.step_gaps, *result.entry_gaps]
    weights = [*result.step_weights, *([1] * len(result.entry_gaps))]
    p = weighted_percentile(values, weights, 99)
    return None if math.isnan(p) else p


def request_rows(result: SimResult) -> list[dict[str, Any]]:
    """The ``requests`` list of the JSON contract, in arrival order."""
    rows = []
    for job in result.jobs:
        ttft = job.first_token_s - job.arrival_s
        served = not job.rejected  # refused: its prompt cannot fit the KV pool
        rows.append({
            "id": job.rid,
            "tenant": job.req.tenant,
            "arrival_s": round(job.arrival_s, 6),
            "uncached_tokens": job.uncached,
            "first_token_s": round(job.first_token_s, 6) if served else None,
            "ttft_s": round(ttft, 6) if served else None,
            "solo_ttft_s": round(job.solo_s, 6),
            "slowdown": round(ttft / job.solo_s, 6) if served and job.solo_s > 0 else None,
            "max_itl_s": None if job.max_itl_s is None else round(job.max_itl_s, 6),
        })
    return rows


def _group(jobs: Sequence[Job]) -> dict[str, float]:
    ttft = [j.first_token_s - j.arrival_s for j in jobs]
    slow = [(j.first_token_s - j.arrival_s) / j.solo_s for j in jobs if j.solo_s > 0]
    return {
        "requests": len(jobs),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "slowdown_p50": percentile(slow, 50),
        "slowdown_p99": percentile(slow, 99),
    }


def summarize(result: SimResult) -> dict[str, Any]:
    """The ``summary`` object of the JSON contract (plus a few engine totals)."""
    jobs = [j for j in result.jobs if not j.rejected]
    out: dict[str, Any] = _group(jobs)
    tenants: dict[str, list[Job]] = {}
    for j in jobs:
        tenants.setdefault(j.req.tenant, []).append(j)
    out["per_tenant"] = {name: _group(group) for name, group in tenants.items()}
    out["worst_tenant_slowdown_p99"] = max(
        (g["slowdown_p99"] for g in out["per_tenant"].values()), default=math.nan
    )
    itl = [j.max_itl_s for j in jobs if j.max_itl_s is not None]
    # p99 over requests of each request's longest gap (the stall a user feels once)
    out["max_itl_p99_s"] = percentile(itl, 99) if itl else None
    out["itl_p99_s"] = itl_p99(result)
    out["prefill_tokens_per_s"] = (
        result.prefill_tokens / result.makespan_s if result.makespan_s > 0 else 0.0
    )
    longest = sorted(jobs, key=lambda j: j.uncached)[-max(1, len(jobs) // 10):]
    out["longest_decile_slowdown_p99"] = _group(longest)["slowdown_p99"]
    out["prefill_busy_fraction"] = (
        result.prefill_busy_s / result.makespan_s if result.makespan_s > 0 else 0.0
    )
    out["busy_fraction"] = result.busy_s / result.makespan_s if result.makespan_s > 0 else 0.0
    out["kv_pool_tokens"] = result.kv_pool_tokens
    out["peak_kv_tokens"] = result.peak_kv_tokens
    out["retractions"] = result.retractions
    out["rejected"] = result.rejected
    out["passes"] = result.passes
    out["makespan_s"] = result.makespan_s
    return out
