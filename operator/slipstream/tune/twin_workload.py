"""A snapshot turned back into requests the twin can run: the tuner's "what if".

Per tenant: Poisson arrivals at the tenant's observed rate, uncached prompt lengths drawn
from its ``sglang:uncached_prompt_tokens_histogram`` (stratified over the buckets, so a
1% tail of long prompts is 1% of the sample and not left to luck, and a tail thinner than
one request of the sample is in it once, ``with_tail``; uniform inside a
bucket, the +Inf bucket around the mean its share of ``_sum`` implies), and a cached
prefix per request placed in the prefix cache when the request arrives
(``Request.warm_blocks``).

When the snapshot has the engines' queue mix (``WorkloadSnapshot.queue_mix``, no
``mix_fallback``), it is the source: the rate is the tenant's arrival rate (requests
starving in the queue count, as they load the engine), the requests waiting now join the
lengths drawn (``with_queued``: a giant still prefilling is part of the window's traffic
before its first token), a tenant with requests waiting but none through yet draws its
lengths from the queue's composition, and each request's cached
prefix follows the cached-per-uncached ratio of its own size class, so a long cold prompt
stays cold while short chat turns keep their hits (a class with no first token in the
window is cold). Without the mix (an older engine) the rate is the first-token rate and one
cache-hit ratio per tenant applies to every request.

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
from dataclasses import dataclass

from slipstream.api import buckets
from slipstream.api.snapshot import Histogram, TenantMix, TenantWindow, WorkloadSnapshot
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
               burst: int = 1, max_span_s: float | None = None, waiting: bool = True) -> Workload:
    """The twin workload of one valid snapshot (see the module doc). Empty when no traffic.

    ``burst`` > 1 makes arrivals come in groups of that many at once (a compound Poisson
    process with the same mean rate): real traffic is burstier than Poisson (the Azure code
    trace's requests come in clumps), and the recommender fits this to what the current
    setting's TTFT histogram shows. ``max_span_s`` caps the span (default: the window);
    ``math.inf`` replays the window's mix for as long as ``max_requests`` takes.
    ``waiting`` False leaves the requests waiting now out of the lengths (``with_queued``):
    the replay the model check sets beside the observed TTFT, which counts first tokens only.
    """
    if burst < 1:
        raise ValueError(f"burst must be >= 1, got {burst}")
    sources = _sources(snapshot, waiting)
    # The twin is one engine: a deployment's traffic is spread over its pods.
    engines = max(1, len(snapshot.pods))
    rate = sum(src.rate for src in sources) / engines
    if not sources or rate <= 0:
        return build(f"{snapshot.deployment}@twin", [])
    span = min(snapshot.window_s if max_span_s is None else max_span_s, max_requests / rate)
    rng = random.Random(seed)
    reqs: list[Request] = []
    for k, src in enumerate(sources):
        tenant_rate = src.rate / engines
        n = max(1, round(tenant_rate * span))
        draw = inverse_cdf(src.lengths)
        lengths = with_tail([max(1, round(draw((i + rng.random()) / n))) for i in range(n)], src.lengths, draw, rng)
        rng.shuffle(lengths)
        outputs = [1] * n
        if src.outputs is not None and src.outputs.total > 0 and src.outputs.finite:
            draw_out = inverse_cdf(src.outputs)
            outputs = [max(1, round(draw_out((i + rng.random()) / n))) for i in range(n)]
            rng.shuffle(outputs)
        base = (k + 1) * BLOCK_SPACE
        at = 0.0
        for i, uncached in enumerate(lengths):
            if i % burst == 0:
                at += rng.expovariate(tenant_rate / burst)
            cached = round(uncached * src.cached_per_uncached(uncached))
            blocks: tuple[int, ...]
            sizes: tuple[int, ...]
            if cached:
                blocks, sizes, warm = (base + 2 * i, base + 2 * i + 1), (cached, uncached), 1
            else:
                blocks, sizes, warm = (base + 2 * i + 1,), (uncached,), 0
            reqs.append(Request(f"{src.name}-{i}", src.name, at, cached + uncached, outputs[i],
                                blocks, sizes, warm))
    return build(f"{snapshot.deployment}@twin", reqs)


def with_tail(lengths: list[int], hist: Histogram, draw: Callable[[float], float], rng: random.Random) -> list[int]:
    """``lengths`` (stratified draws, ascending by stratum) with the window's longest
    prompts in them: when the top non-empty bucket holds less than one request's share of
    the ``n`` drawn, whether a stratum lands in it is luck (one giant among a minute of two
    engines' chat turns is half a giant per engine), and those are the prompts a threshold
    is for. The last (largest) stratum is then drawn from inside that bucket: a tail the
    window saw is in the replay, rounded up, the side on which a twin's error costs least."""
    filled = [(lo, count) for lo, _, count in hist.buckets() if count > 0]
    if len(filled) < 2 or not lengths or hist.total <= 0 or max(lengths) > filled[-1][0]:
        return lengths
    share = filled[-1][1] / hist.total
    lengths[-1] = max(1, round(draw(1.0 - share * rng.random())))
    return lengths


MAX_CACHED_PER_UNCACHED = MAX_HIT_RATIO / (1.0 - MAX_HIT_RATIO)


@dataclass(frozen=True, slots=True)
class _Source:
    """One tenant as the twin replays it: rate, lengths, outputs and its cache rule."""

    name: str
    rate: float
    lengths: Histogram
    outputs: Histogram | None
    ratio_by_class: dict[str, float] | None
    """Cached per uncached token by size class (the queue mix); None: ``tenant_ratio``."""
    tenant_ratio: float

    def cached_per_uncached(self, uncached: int) -> float:
        if self.ratio_by_class is None:
            return self.tenant_ratio
        return self.ratio_by_class.get(buckets.size_class(uncached), 0.0)


def _sources(snapshot: WorkloadSnapshot, waiting: bool = True) -> list[_Source]:
    """The tenants the twin replays (see the module doc for which figures each uses)."""
    observed = snapshot.mix_fallback is None and bool(snapshot.queue_mix)
    out: list[_Source] = []
    named: set[str] = set()
    for t in snapshot.tenants:
        if not (t.requests_per_s > 0 and t.uncached_tokens.total > 0 and t.uncached_tokens.finite):
            continue
        mix = snapshot.mix_of(t.name) if observed else None
        named.add(t.name)
        out.append(_Source(
            t.name,
            mix.arrivals_per_s if mix is not None and mix.arrivals_per_s > 0 else t.requests_per_s,
            with_queued(t.uncached_tokens, mix) if mix is not None and waiting else t.uncached_tokens,
            t.output_tokens,
            _class_ratios(mix) if mix is not None else None,
            _tenant_ratio(t),
        ))
    for mix in snapshot.queue_mix if observed and waiting else ():
        queued = queued_lengths(mix)
        if mix.name not in named and mix.arrivals_per_s > 0 and queued is not None:
            out.append(_Source(mix.name, mix.arrivals_per_s, queued, None, _class_ratios(mix), 0.0))
    return out


def lengths_of(snapshot: WorkloadSnapshot, waiting: bool = True) -> dict[str, Histogram]:
    """Each replayed tenant's uncached-length histogram: what ``synthesize`` draws from."""
    return {src.name: src.lengths for src in _sources(snapshot, waiting)}


def _tenant_ratio(t: TenantWindow) -> float:
    hit = min(MAX_HIT_RATIO, max(0.0, t.cache_hit_ratio or 0.0))
    return hit / (1.0 - hit)


def _class_ratios(mix: TenantMix) -> dict[str, float]:
    return {c.name: min(MAX_CACHED_PER_UNCACHED, max(0.0, ratio)) for c in mix.classes
            if (ratio := c.cached_per_uncached) is not None}


def with_queued(hist: Histogram, mix: TenantMix) -> Histogram:
    """``hist`` (the uncached lengths of the window's first tokens) with the requests that
    wait now added, each class's at its mean: a giant still prefilling, and the requests
    starving behind it, are the window's traffic too, before any of them has a first token."""
    counts, total, tokens = list(hist.counts), hist.total, hist.sum
    for c in mix.classes:
        if not c.queued > 0:
            continue
        mean = c.queued_tokens / c.queued
        for i, bound in enumerate(hist.bounds):
            if mean <= bound:
                counts[i] += c.queued
        total += c.queued
        tokens += c.queued_tokens
    return Histogram(hist.bounds, tuple(counts), total, tokens)


def queued_lengths(mix: TenantMix) -> Histogram | None:
    """The waiting queue's uncached lengths as a histogram over the size classes (its
    bounds the classes' upper bounds, its sum the waiting tokens); None when none waits."""
    if not mix.queued > 0:
        return None
    bounds = tuple(upper for _, upper in buckets.SIZE_CLASSES if math.isfinite(upper))
    counts, seen = [], 0.0
    for c in mix.classes[: len(bounds)]:
        seen += c.queued
        counts.append(seen)
    return Histogram(bounds, tuple(counts), mix.queued, sum(c.queued_tokens for c in mix.classes))
