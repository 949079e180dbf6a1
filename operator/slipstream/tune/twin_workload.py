"""A snapshot turned back into requests the twin can run: the tuner's "what if".

Per tenant: Poisson arrivals at the tenant's observed rate, uncached prompt lengths drawn
from its ``sglang:uncached_prompt_tokens_histogram`` (stratified over the buckets, so a
1% tail of long prompts is 1% of the sample and not left to luck; uniform inside a
bucket, the +Inf bucket around the mean its share of ``_sum`` implies), and a cached
prefix per request sized by the tenant's cache-hit ratio, placed in the prefix cache when
the request arrives (``Request.warm_blocks``).

Size is bounded (``max_requests``): the span is the snapshot's window, shortened so the
whole synthetic load holds at most that many requests, which keeps one candidate's run at
a few milliseconds. Output lengths are drawn from the tenant's generation-token histogram
when the snapshot has one (decodes hold KV, and a full pool holds up admission), else one
token each (no decodes).

Arrivals may come in bursts (``burst``), fitted by the recommender to the current
setting's observed TTFT. The snapshot counts the whole deployment; the twin is one engine, so rates are divided by
the number of pods the snapshot lists (one when it lists none). Deterministic: one seeded ``random.Random`` per call.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from slipstream.api.snapshot import Histogram, WorkloadSnapshot
from slipstream.sim.workload import BLOCK_SPACE, Request, Workload, build
from slipstream.tune.heterogeneity import representative_lengths

MAX_HIT_RATIO = 0.99
"""A 100% hit would make a prompt's cached prefix infinite; SGLang computes at least one
token of every prompt anyway."""


def inverse_cdf(hist: Histogram) -> Callable[[float], float]:
    """u in [0, 1) -> tokens: uniform inside each non-empty bucket.

    A bucket whose mean is known (the +Inf one, or the only one) is narrowed to an interval
    centred on that mean, so uniform traffic stays uniform in the twin.
    """
    known = dict(zip(_lowers(hist), representative_lengths(hist), strict=False))
    rows: list[tuple[float, float, float, float]] = []  # (cum. before, cum. after, low, high)
    seen = 0.0
    nonempty = [(lo, hi, n) for lo, hi, n in hist.buckets() if n > 0]
    for lo, hi, n in nonempty:
        if not math.isfinite(hi) or len(nonempty) == 1:
            mean = known[lo][0]
            half = mean - lo if not math.isfinite(hi) else min(mean - lo, hi - mean)
            lo, hi = mean - max(0.0, half), mean + max(0.0, half)
        rows.append((seen, seen + n, lo, hi))
        seen += n

    def at(u: float) -> float:
        rank = u * seen
        for before, after, lo, hi in rows:
            if rank < after:
                return lo + (hi - lo) * (rank - before) / (after - before)
        return rows[-1][3]

    return at


def _lowers(hist: Histogram) -> list[float]:
    return [lo for lo, _, n in hist.buckets() if n > 0]


def synthesize(snapshot: WorkloadSnapshot, max_requests: int = 300, seed: int = 0,
               burst: int = 1, max_span_s: float | None = None) -> Workload:
    """The twin workload of one valid snapshot (see the module doc). Empty when no traffic.

    ``burst`` > 1 makes arrivals come in groups of that many at once (a compound Poisson
    process with the same mean rate): real traffic is burstier than Poisson (the Azure code
    trace's requests come in clumps), and the recommender fits this to what the current
    setting's TTFT histogram shows. ``max_span_s`` caps the span (default: the window);
    ``math.inf`` replays the window's mix for as long as ``max_requests`` takes.
    """
    if burst < 1:
        raise ValueError(f"burst must be >= 1, got {burst}")
    tenants = [t for t in snapshot.tenants if t.requests_per_s > 0 and t.uncached_tokens.total > 0
               and t.uncached_tokens.finite]
    # The twin is one engine: a deployment's traffic is spread over its pods.
    engines = max(1, len(snapshot.pods))
    rate = sum(t.requests_per_s for t in tenants) / engines
    if not tenants or rate <= 0:
        return build(f"{snapshot.deployment}@twin", [])
    span = min(snapshot.window_s if max_span_s is None else max_span_s, max_requests / rate)
    rng = random.Random(seed)
    reqs: list[Request] = []
    for k, tenant in enumerate(tenants):
        tenant_rate = tenant.requests_per_s / engines
        n = max(1, round(tenant_rate * span))
        draw = inverse_cdf(tenant.uncached_tokens)
        lengths = [max(1, round(draw((i + rng.random()) / n))) for i in range(n)]
        rng.shuffle(lengths)
        outputs = [1] * n
        if tenant.output_tokens is not None and tenant.output_tokens.total > 0 and tenant.output_tokens.finite:
            draw_out = inverse_cdf(tenant.output_tokens)
            outputs = [max(1, round(draw_out((i + rng.random()) / n))) for i in range(n)]
            rng.shuffle(outputs)
        hit = min(MAX_HIT_RATIO, max(0.0, tenant.cache_hit_ratio or 0.0))
        base = (k + 1) * BLOCK_SPACE
        at = 0.0
        for i, uncached in enumerate(lengths):
            if i % burst == 0:
                at += rng.expovariate(tenant_rate / burst)
            cached = round(uncached * hit / (1.0 - hit))
            if cached:
                blocks, sizes, warm = (base + 2 * i, base + 2 * i + 1), (cached, uncached), 1
            else:
                blocks, sizes, warm = (base + 2 * i + 1,), (uncached,), 0
            reqs.append(Request(f"{tenant.name}-{i}", tenant.name, at, cached + uncached, outputs[i],
                                blocks, sizes, warm))
    return build(f"{snapshot.deployment}@twin", reqs)
