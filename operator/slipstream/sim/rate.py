"""Rate scaling: let one simulated engine carry a fleet's trace at a chosen load.

``--target-utilization U`` picks the rate scale at which ``stock`` keeps the prefill
budget busy a fraction U of the time. The estimate is analytic, so it costs no extra
simulation: replay the trace through the prefix cache alone (arrival order, stock's
whole-request admission), add up each request's prefill time alone on an idle engine,
and divide by the trace's span. Batching several small requests into one pass makes
stock's real busy fraction a little lower; the simulated figure is printed beside it.
"""

from __future__ import annotations

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
