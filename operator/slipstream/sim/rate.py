"""Rate scaling: let one simulated engine carry a fleet's trace at a chosen load.

``--target-utilization U`` means: the rate scale at which ``stock``'s busy fraction with
decodes included (pass time of every kind over the makespan) is U within the tolerance,
and stock's KV peak stays below the pool. ``fit_by_slices`` finds it cheaply: it cuts the
trace into ``SLICES`` equal time slices, simulates stock on the first ``SAMPLE`` of each
(a quarter of the trace in all), and steps the scale with ``fit_scale`` on those samples'
busy fraction; a scale whose samples fill the pool is stepped down until they do not.
Its first guess is analytic (``offered_work_s``: each request's prefill alone, cache
replayed in arrival order, plus a batch-1 decode step per output token, over the span),
a lower bound on the scale since batching only saves time; ``scale_for_utilization``
(prefill alone) caps it: decodes only add busy time (though batching small prompts into
one pass saves some, so that cap is not a hard bound).

Each slice is also reported (``SliceLoad``): its offered prefill load and its decode KV
demand against capacity at the fitted scale, and its sampled busy fraction and KV peak.
A slice whose own offered work exceeds capacity is marked ``overload``: no scale that
keeps the whole run at U keeps that slice stable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from slipstream.sim import policies
from slipstream.sim.cost import DECODE, CostModel
from slipstream.sim.engine import Job, simulate, solo_replay
from slipstream.sim.policies import EngineConfig
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Workload

Solo = tuple[Job, ...]
"""``solo_replay``'s jobs, kept: the replay depends on the requests' order, prompts and the
engine's cache, never on the clock, so one replay serves the workload at every rate scale
(``fit_by_slices`` used to replay it three times)."""


def solo_jobs(workload: Workload, profile: Profile, config: EngineConfig) -> Solo:
    """Every request alone, cache replayed in arrival order (``solo_replay``), as a tuple."""
    return tuple(solo_replay(workload, profile, config))


def solo_busy_s(workload: Workload, profile: Profile, config: EngineConfig,
                solo: Solo | None = None) -> float:
    """Seconds of prefill the workload needs, each request alone, cache replayed in order."""
    jobs = solo_replay(workload, profile, config) if solo is None else solo
    return sum(job.solo_s for job in jobs)


def scale_for_utilization(
    workload: Workload, profile: Profile, config: EngineConfig, utilization: float,
    solo: Solo | None = None,
) -> float:
    """The rate scale X at which the estimated prefill busy fraction is ``utilization``."""
    if not 0.0 < utilization < 1.0:
        raise ValueError(f"target utilization must be in (0, 1), got {utilization}")
    span = workload.span_s
    if span <= 0:
        raise ValueError("the workload spans no time: use --rate-scale instead")
    return utilization * span / solo_busy_s(workload, profile, config, solo)


DEFAULT_TOLERANCE = 0.01
"""``--target-utilization U`` is met when stock's simulated prefill busy fraction is
within U +- this (absolute)."""
MAX_RUNS = 8


@dataclass(frozen=True, slots=True)
class RateFit:
    """The rate scale found for a target, and every stock run it took (plain data)."""

    scale: float
    busy: float
    """Stock's simulated prefill busy fraction at ``scale``."""
    runs: tuple[tuple[float, float], ...]
    """(scale, busy fraction) of each stock run, in order."""
    converged: bool


def fit_scale(target: float, first_guess: float, measure: Callable[[float], float],
              tolerance: float = DEFAULT_TOLERANCE, max_runs: int = MAX_RUNS,
              upper: float | None = None) -> RateFit:
    """The rate scale at which ``measure`` (stock's simulated busy fraction at a scale) is
    within ``tolerance`` of ``target``.

    The busy fraction is about proportional to the scale while the engine keeps up (the
    same prefill work over a span ``scale`` times shorter), so each step multiplies the
    scale by target / measured; once two runs bracket the target, a step that would leave
    the bracket is replaced by its geometric midpoint. The first guess is the analytic
    estimate (``scale_for_utilization``), usually within a few percent of the answer, so
    two or three stock runs are typical. From the second run on, the step is the secant
    through the last two runs (the busy fraction with decodes bends below proportional as
    batching saves steps). ``upper``, when known, is a scale at or above the answer, so a
    step never leaves it. Not converged after ``max_runs``: the closest.
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target utilization must be in (0, 1), got {target}")
    if not 0.0 < tolerance < target:
        raise ValueError(f"utilization tolerance must be in (0, target), got {tolerance}")
    lo = hi = None
    scale = first_guess
    runs: list[tuple[float, float]] = []
    for _ in range(max_runs):
        busy = measure(scale)
        runs.append((scale, busy))
        if abs(busy - target) <= tolerance:
            return RateFit(scale, busy, tuple(runs), True)
        if busy < target:
            lo = scale if lo is None else max(lo, scale)
        else:
            hi = scale if hi is None else min(hi, scale)
        step = scale * target / busy if busy > 0 else scale * 2.0
        if len(runs) >= 2 and runs[-1][1] != runs[-2][1]:
            (x0, b0), (x1, b1) = runs[-2], runs[-1]
            slope = (b1 - b0) / (x1 - x0)
            if slope > 0:  # the secant: busy bends (batching), so proportional steps crawl
                step = x1 + (target - b1) / slope
        if hi is None and upper is not None and step >= upper:
            hi = upper
        if lo is not None and hi is not None and not lo < step < hi:
            step = math.sqrt(lo * hi)
        scale = step
    best = min(runs, key=lambda r: abs(r[1] - target))
    return RateFit(best[0], best[1], tuple(runs), False)


SLICES = 8
"""Equal time slices a trace is cut into, for the fit's samples and the per-slice report."""
SAMPLE = 0.25
"""Share of each slice (its first part) that the fit simulates: a quarter of the trace."""
UTILIZATION_TOLERANCE = 0.02
"""Default tolerance of the slice fit: the whole run then lands within +-0.05."""
KV_HEADROOM = 0.95
"""The fit keeps the samples' KV peak below this share of the pool (the full run's peak
runs a little above its samples')."""


@dataclass(frozen=True, slots=True)
class SliceLoad:
    """The offered load of one equal time slice at the fitted scale, and what stock did."""

    start_s: float
    end_s: float
    """Slice bounds on the scaled clock."""
    requests: int
    offered_prefill_load: float
    """Prefill seconds its requests need alone (cache replayed in order) per second of the
    slice; 1.0 is the engine's whole capacity."""
    decode_kv_demand_tokens: float
    """KV tokens its decoding requests hold on average (Little's law: decoders at the
    step time of that batch, times their mean context), ignoring prefill passes."""
    kv_pool_tokens: int | None
    busy_fraction: float
    """Stock's busy fraction (decodes included) over the slice's sample."""
    peak_kv_tokens: int
    """Stock's KV peak over the slice's sample."""
    overload: bool
    """The slice's own offered work exceeds capacity (prefill load >= 1, or decode KV
    demand >= the pool)."""


@dataclass(frozen=True, slots=True)
class SliceFit:
    """The rate scale fitted on slice samples, how, and each slice's load (plain data)."""

    scale: float
    fit: RateFit
    """The busy-fraction steps (each over all slice samples)."""
    kv_limited: bool
    """The scale was lowered below the busy target to keep stock's KV peak below the pool."""
    slices: tuple[SliceLoad, ...]
    method: str

    @property
    def overload(self) -> bool:
        return any(s.overload for s in self.slices)


def offered_work_s(workload: Workload, profile: Profile, config: EngineConfig,
                   solo: Solo | None = None) -> float:
    """Engine seconds the workload needs with nothing batched: each request's prefill alone
    (cache replayed in order) plus a decode step of batch 1 per output token. An upper
    bound on stock's busy seconds, since batching only saves steps."""
    cost = CostModel(profile)
    total = 0.0
    for job in solo_replay(workload, profile, config) if solo is None else solo:
        r = job.req
        ctx = int(r.prompt_tokens + r.output_tokens / 2)
        total += job.solo_s + r.output_tokens * cost.pass_time(1, ctx, ctx, 0, DECODE)
    return total


def _windows(workload: Workload, n: int) -> list[tuple[float, float]]:
    start = workload.requests[0].arrival_s
    width = workload.span_s / n
    return [(start + k * width, start + (k + 1) * width) for k in range(n)]


def _in(workload: Workload, lo: float, hi: float, last: bool) -> Workload:
    reqs = tuple(r for r in workload.requests
                 if lo <= r.arrival_s < hi or (last and r.arrival_s == hi))
    return replace(workload, requests=reqs)


def _sample_runs(workload: Workload, profile: Profile, config: EngineConfig, n: int,
                 sample: float) -> list[tuple[float, float, int]]:
    """(busy seconds, seconds, KV peak) of stock on the first ``sample`` of each slice."""
    out = []
    for lo, hi in _windows(workload, n):
        part = _in(workload, lo, lo + sample * (hi - lo), False)
        if not part.requests:
            out.append((0.0, 0.0, 0))
            continue
        result = simulate(part, policies.parse("stock", config), profile, config)
        # Over the window from its start (not from its first arrival), or to the drain's end
        # when that is later: the work arriving in the window over the window's time.
        lead = part.requests[0].arrival_s - lo
        window = sample * (hi - lo)
        out.append((result.busy_s, max(window, lead + result.makespan_s), result.peak_kv_tokens))
    return out


def _decoders(cost: CostModel, out_tokens: float, context: float, span: float) -> float:
    """Mean decoding requests L with L = output tokens per second x step time at batch L."""
    if span <= 0 or out_tokens <= 0:
        return 0.0
    rate = out_tokens / span
    level = 1.0
    for _ in range(50):
        b = max(1, round(level))
        step = cost.pass_time(b, int(b * context), int(b * context), 0, DECODE)
        new = rate * step
        if new > 1e7 or abs(new - level) < 1e-3 * max(level, 1.0):
            return new
        level = 0.5 * (level + new)
    return level


def slice_loads(workload: Workload, profile: Profile, config: EngineConfig,
                runs: Sequence[tuple[float, float, int]], solo_jobs: Solo | None = None
                ) -> tuple[SliceLoad, ...]:
    """Each slice's offered load at the workload's scale, with its stock sample's figures
    (``solo_jobs``: the replay at any scale, ``Solo``)."""
    n = len(runs)
    jobs = solo_replay(workload, profile, config) if solo_jobs is None else solo_jobs
    solo = {job.req.rid: job.solo_s for job in jobs}
    cost = CostModel(profile)
    pool = config.kv_pool_tokens if config.kv_pool_tokens is not None else profile.kv_pool_tokens
    pool = pool or None
    out = []
    for k, ((lo, hi), (busy, makespan, peak)) in enumerate(zip(_windows(workload, n), runs,
                                                             strict=True)):
        part = _in(workload, lo, hi, k == n - 1)
        span = hi - lo
        reqs = part.requests
        out_tokens = float(sum(r.output_tokens for r in reqs))
        context = (sum((r.prompt_tokens + r.output_tokens / 2) * r.output_tokens for r in reqs)
                   / out_tokens) if out_tokens else 0.0
        prefill = sum(solo[r.rid] for r in reqs) / span if span > 0 else 0.0
        demand = _decoders(cost, out_tokens, context, span) * context
        out.append(SliceLoad(lo, hi, len(reqs), prefill, demand, pool,
                             busy / makespan if makespan > 0 else 0.0, peak,
                             prefill >= 1.0 or (pool is not None and demand >= pool)))
    return tuple(out)


def fit_by_slices(workload: Workload, profile: Profile, config: EngineConfig, target: float,
                  tolerance: float = UTILIZATION_TOLERANCE, n: int = SLICES,
                  sample: float = SAMPLE) -> SliceFit:
    """The rate scale at which stock's busy fraction (decodes included) over the slice
    samples is ``target`` and their KV peak stays below the pool."""
    solo = solo_jobs(workload, profile, config)
    upper = scale_for_utilization(workload, profile, config, target, solo)
    guess = min(upper, target * workload.span_s / offered_work_s(workload, profile, config, solo))
    pool = config.kv_pool_tokens if config.kv_pool_tokens is not None else profile.kv_pool_tokens
    seen: dict[float, list[tuple[float, float, int]]] = {}

    def runs_at(x: float) -> list[tuple[float, float, int]]:
        if x not in seen:
            seen[x] = _sample_runs(workload.scaled(x), profile, config, n, sample)
        return seen[x]

    def busy_at(x: float) -> float:
        runs = runs_at(x)
        total = sum(m for _, m, _ in runs)
        return sum(b for b, _, _ in runs) / total if total > 0 else 0.0

    # ``upper`` is no hard bound: batching small requests into one pass saves time too.
    fit = fit_scale(target, guess, busy_at, tolerance)
    scale = fit.scale
    kv_limited = False
    if pool:
        limit = KV_HEADROOM * pool
        for _ in range(MAX_RUNS):
            if max(p for _, _, p in runs_at(scale)) < limit:
                break
            kv_limited = True
            scale *= 0.8
    scaled = workload.scaled(scale)
    method = (f"stock simulated on the first {sample:.0%} of each of {n} equal time slices; "
              f"{len(seen)} sample set(s); analytic first guess {guess:.4g} (offered work, "
              f"nothing batched), bound {upper:.4g} (prefill alone)")
    return SliceFit(scale, fit, kv_limited, slice_loads(scaled, profile, config, runs_at(scale),
                                                          solo), method)
