"""How often the sequential canary rule rolls back a good setting, and how often it catches a bad one.

``slipstream canary-check`` runs `rollout.sequential.evaluate` on twin traffic, offline:

1. The workload is the fleet's traffic. For each pair, the Service's split is drawn (each
   request to a pod uniformly at random, as kube-proxy does, one RNG per pair seed): one
   canary pod, the rest baseline pods.
2. Every pod runs its share on its own twin engine under the same policy. In an A/A pair
   both sides run the same engine; in a slow pair the canary's engine is ``slow_factor``
   times slower (every pass, `slowed`).
3. The analysis starts at an offset into the workload (it differs per pair, so the giant
   prompts fall at different points of the analysis) and is cut into sub-windows. Each
   pod's ``ttft_by_size_class_seconds`` ``_count`` and ``_sum`` increase over a sub-window
   is what Prometheus reads from the engine: the first tokens in it, by tenant and size
   class of their uncached tokens; the baseline pods' are summed, as ``sum by`` does.
4. The rule is evaluated as the rollout machine does: first when the analysis window has
   passed, then at each sub-window up to the limit, where it must decide.

``false_rollback_rate`` is the share of A/A pairs rolled back; ``detection_rate`` the share
of slow pairs rolled back.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slipstream.api import buckets
from slipstream.rollout import sequential
from slipstream.sim import engine, policies
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Workload


@dataclass(frozen=True)
class Check:
    pairs: int = 40
    pods: int = 2
    """Engine pods in the fleet; one is the canary."""
    policy: str = "stock"
    slow_factor: float = 2.0
    sub_window_s: float = 10.0
    analysis_window_s: float = 120.0
    """When the rule is first asked (the machine's analysis window)."""
    limit_s: float = 120.0
    """When it must decide (the machine's analysis limit: one analysis window by default,
    `ControllerSettings.canary_analysis_limit_windows`)."""
    warmup_s: float = 30.0
    """Least offset of an analysis start into the workload (queues fill from empty)."""
    candidate: str = ""
    """If set, a third kind of pair: the canary runs this setting, the baseline ``policy``
    (a real rollout's canary: how often, and how soon, the rule promotes it)."""


def slowed(profile: Profile, factor: float) -> Profile:
    """The same engine ``factor`` times slower in every pass (compute, memory, overheads)."""
    return replace(
        profile,
        name=f"{profile.name}-x{factor:g}",
        peak_flops=profile.peak_flops / factor,
        attn_flops_per_s=profile.attn_flops_per_s / factor,
        mem_bandwidth=profile.mem_bandwidth / factor,
        host_bandwidth=profile.host_bandwidth / factor,
        overhead_s=profile.overhead_s * factor,
        decode_overhead_s=profile.decode_overhead_s * factor if profile.decode_overhead_s >= 0 else -1.0,
        mixed_overhead_s=profile.mixed_overhead_s * factor if profile.mixed_overhead_s >= 0 else -1.0,
    )


def split_pods(workload: Workload, pods: int, seed: int) -> list[Workload]:
    """The Service's random split of the fleet's requests over ``pods`` pods."""
    rng = random.Random(seed)
    shares: list[list] = [[] for _ in range(pods)]
    for req in workload.requests:
        shares[rng.randrange(pods)].append(req)
    return [replace(workload, name=f"{workload.name}@pod{k}", requests=tuple(s)) for k, s in enumerate(shares)]


FirstTokens = list[tuple[float, sequential.Cell, float]]
"""(first-token time, cell, TTFT) of one side's requests, by time."""


def first_tokens_of(results: Sequence[engine.SimResult]) -> FirstTokens:
    out = []
    for result in results:
        for job in result.jobs:
            if job.first_token_s < 0:
                continue
            cls = buckets.size_class(job.req.prompt_tokens - job.cached)
            out.append((job.first_token_s, (job.req.tenant, cls), job.first_token_s - job.arrival_s))
    return sorted(out)


def cells_of(tokens: FirstTokens, start_s: float, end_s: float) -> dict[sequential.Cell, sequential.CellHistogram]:
    """The ``_count`` and ``_sum`` increase of each cell over [start_s, end_s)."""
    count: dict[sequential.Cell, int] = defaultdict(int)
    total: dict[sequential.Cell, float] = defaultdict(float)
    for t, cell, ttft in tokens:
        if start_s <= t < end_s:
            count[cell] += 1
            total[cell] += ttft
    return {c: sequential.CellHistogram(count[c], total[c]) for c in count}


def judge_pair(canary: FirstTokens, baseline: FirstTokens, start_s: float, check: Check,
            rule: sequential.SequentialRule) -> tuple[sequential.SequentialResult, float]:  # fmt: skip
    """The rule's outcome as the machine reaches it, and when (seconds after the start)."""
    n = max(1, math.ceil(check.limit_s / check.sub_window_s))
    windows = []
    for k in range(n):
        a, b = start_s + k * check.sub_window_s, start_s + (k + 1) * check.sub_window_s
        windows.append(sequential.SubWindow(a, b, cells_of(canary, a, b), cells_of(baseline, a, b)))
    first = max(1, math.ceil(check.analysis_window_s / check.sub_window_s))
    for k in range(first, n + 1):
        result = sequential.evaluate(windows[:k], rule, final=k == n, pods=(1, check.pods - 1))
        if result.outcome != "Continue":
            return result, k * check.sub_window_s
    raise AssertionError("the final evaluation always decides")


def run(workload: Workload, profile: Profile, config: policies.EngineConfig, check: Check,
        rule: sequential.SequentialRule) -> dict[str, object]:  # fmt: skip
    """Every pair, A/A and slow, and the rates (the JSON ``canary-check`` prints)."""
    if check.pods < 2:
        raise ValueError("pods must be >= 2: a canary and at least one baseline pod")
    if check.limit_s < check.analysis_window_s:
        raise ValueError("limit_s must be >= analysis_window_s")
    span = workload.span_s
    room = span - check.limit_s - check.warmup_s
    if room < 0:
        raise ValueError(f"the workload spans {span:.0f} s: it needs warmup + limit = "
                         f"{check.warmup_s + check.limit_s:.0f} s")
    slow = slowed(profile, check.slow_factor)
    outcomes: dict[str, list[dict[str, object]]] = {"aa": [], "slow": []}
    kinds = [("aa", profile, check.policy), ("slow", slow, check.policy)]
    if check.candidate:
        outcomes["candidate"] = []
        kinds.append(("candidate", profile, check.candidate))
    for k in range(check.pairs):
        shares = split_pods(workload, check.pods, seed=k + 1)
        start = workload.requests[0].arrival_s + check.warmup_s + (room * ((k * 0.618034) % 1.0))
        base_runs = [engine.simulate(w, policies.parse(check.policy, config), profile, config) for w in shares[1:]]
        baseline = first_tokens_of(base_runs)
        for kind, canary_profile, canary_policy in kinds:
            run_ = engine.simulate(shares[0], policies.parse(canary_policy, config), canary_profile, config)
            result, at = judge_pair(first_tokens_of([run_]), baseline, start, check, rule)
            outcomes[kind].append({"seed": k + 1, "start_s": round(start, 1), "outcome": result.outcome,
                                   "decided_after_s": at, "observations": result.observations,
                                   "slower": result.slower, "llr": round(result.llr, 3)})
    def rate(kind: str) -> float:
        rows = outcomes[kind]
        return sum(r["outcome"] == "Rollback" for r in rows) / len(rows) if rows else math.nan

    def mean_time(kind: str) -> float:
        rows = outcomes[kind]
        return round(sum(float(r["decided_after_s"]) for r in rows) / len(rows), 1) if rows else math.nan

    extra: dict[str, object] = {}
    if check.candidate:
        extra = {"candidate": check.candidate, "candidate_promote_rate": 1.0 - rate("candidate")}
    return {
        "workload": workload.name,
        "policy": check.policy,
        "pairs": check.pairs,
        "pods": check.pods,
        "slow_factor": check.slow_factor,
        "sub_window_s": check.sub_window_s,
        "analysis_window_s": check.analysis_window_s,
        "limit_s": check.limit_s,
        "rule": {"tolerance_percent": rule.tolerance_percent, "min_samples": rule.min_samples,
                 "step": rule.step, "alpha": rule.alpha, "beta": rule.beta},
        "false_rollback_rate": rate("aa"),
        "detection_rate": rate("slow"),
        **extra,
        "mean_decision_s": {kind: mean_time(kind) for kind in outcomes},
        "pairs_detail": outcomes,
    }
