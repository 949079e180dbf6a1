"""Rate scaling: let one simulated engine carry a fleet's trace at a chosen load.

``--target-utilization U`` means: the rate scale at which ``stock``'s simulated prefill
busy fraction (prefill pass time over the run's makespan) is U within ``DEFAULT_TOLERANCE``.
``fit_scale`` finds it by running stock at a few scales; its first guess is analytic
(``scale_for_utilization``): replay the trace through the prefix cache alone (arrival
order, stock's whole-request admission), add up each request's prefill time alone on an
idle engine, and divide by the trace's span. That guess alone ran a little low (batching
several small requests into one pass saves passes), which is why the runs follow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from slipstream.sim.engine import solo_replay
from slipstream.sim.policies import EngineConfig
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Workload


def solo_busy_s(workload: Workload, profile: Profile, config: EngineConfig) -> float:
    """Seconds of prefill the workload needs, each request alone, cache replayed in order."""
    return sum(job.solo_s for job in solo_replay(workload, profile, config))


def scale_for_utilization(
    workload: Workload, profile: Profile, config: EngineConfig, utilization: float
) -> float:
    """The rate scale X at which the estimated prefill busy fraction is ``utilization``."""
    if not 0.0 < utilization < 1.0:
        raise ValueError(f"target utilization must be in (0, 1), got {utilization}")
    span = workload.span_s
    if span <= 0:
        raise ValueError("the workload spans no time: use --rate-scale instead")
    return utilization * span / solo_busy_s(workload, profile, config)


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
              tolerance: float = DEFAULT_TOLERANCE, max_runs: int = MAX_RUNS) -> RateFit:
    """The rate scale at which ``measure`` (stock's simulated busy fraction at a scale) is
    within ``tolerance`` of ``target``.

    The busy fraction is about proportional to the scale while the engine keeps up (the
    same prefill work over a span ``scale`` times shorter), so each step multiplies the
    scale by target / measured; once two runs bracket the target, a step that would leave
    the bracket is replaced by its geometric midpoint. The first guess is the analytic
    estimate (``scale_for_utilization``), usually within a few percent of the answer, so
    two or three stock runs are typical. Not converged after ``max_runs``: the closest.
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
        if lo is not None and hi is not None and not lo < step < hi:
            step = math.sqrt(lo * hi)
        scale = step
    best = min(runs, key=lambda r: abs(r[1] - target))
    return RateFit(best[0], best[1], tuple(runs), False)
