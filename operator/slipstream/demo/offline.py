"""The demo's phases on two twin engines: static settings, and the operator's tuner in the loop.

The requests go round robin to two twin engines (as the load generator spreads them over
the ready pods). For the closed loop, every interval the operator's own tuner
(tune.tuner.tune_once with the operator's guardrails: min samples 50, no dwell) judges
the fleet's last window as Prometheus would show it (tune.observed). A Move starts on
one canary engine at once and on the other one analysis window later (a promotion; the
canary's analysis itself is not modelled), and the engines are re-run with the new
schedule (deterministic, so the past does not change).

Used by ``scripts/closed-loop-offline.py`` (the timer-offset sweep) and by the demo's
closing comparison (Auto beside Off and the best static setting, on the same traffic,
judged over whole phases from their first second).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from slipstream.api.snapshot import PodSetting, WorkloadSnapshot
from slipstream.demo import loop, phases
from slipstream.sim import engine, policies, profiles
from slipstream.sim.workload import Request, Workload, build
from slipstream.tune import candidates, guardrails, observed, tuner
from slipstream.tune.recommend import policy_name

STOCK = policies.Setting(0, "ceiling", "fcfs")
REPLICAS = 2
STATIC = ("stock", "stock/srpt", "ceiling:4096/srpt", "floor:4096/srpt")
"""The static settings the demo compares Auto with (concurrency <= 2: the demo's bound)."""

Schedule = list[tuple[float, policies.Setting]]


@dataclass(frozen=True)
class LoopSettings:
    """The operator's timing and bound, in twin seconds (the demo's ServingDeployment)."""

    interval_s: float = 60.0
    cooldown_s: float = 180.0
    analysis_s: float = 120.0
    max_concurrency: int = 2
    rate_factor: float = 1.0
    off: bool = False


@dataclass
class Run:
    """One replay's outcome: every request's result and the moves made (twin seconds)."""

    results: list[loop.Result]
    moves: list[tuple[float, str, str, str]] = field(default_factory=list)


def engine_config() -> policies.EngineConfig:
    return policies.EngineConfig(chunked_prefill_size=8192, page_size=1)


def split(workload: Workload) -> list[list[Request]]:
    """Round robin over the replicas, as the load generator spreads requests over pods."""
    return [[r for i, r in enumerate(workload.requests) if i % REPLICAS == k] for k in range(REPLICAS)]


def run_engines(per_engine: Sequence[Sequence[Request]], schedules: Sequence[Schedule],
                profile: profiles.Profile, cfg: policies.EngineConfig) -> list[list[engine.Job]]:
    """Each engine's jobs, its setting changed at the scheduled times."""
    out = []
    for k, requests in enumerate(per_engine):
        pending = sorted(schedules[k], key=lambda x: x[0])

        def control(view: policies.RoundView, pending: Schedule = pending) -> policies.Setting | None:
            got = None
            while pending and pending[0][0] <= view.now_s:
                got = pending.pop(0)[1]
            return got

        policy = policies.parse("stock", cfg, controller=control, interval_s=1.0)
        out.append(list(engine.simulate(build(f"engine-{k}", list(requests)), policy, profile, cfg).jobs))
    return out


def first_tokens(jobs: Sequence[Sequence[engine.Job]]) -> list[policies.FirstToken]:
    return sorted((policies.FirstToken(j.req.tenant, j.arrival_s, j.first_token_s, j.req.prompt_tokens, j.uncached,
                                       j.req.output_tokens)
                   for js in jobs for j in js if j.first_token_s >= 0), key=lambda f: f.first_token_s)  # fmt: skip


def as_prometheus_reads(snap: WorkloadSnapshot, replicas: int, rate_factor: float) -> WorkloadSnapshot:
    """The fleet's snapshot with its pods listed (the twin divides rates by them), rates
    multiplied by ``rate_factor`` (8: what the operator saw of a x8 stack before it divided)."""
    snap = replace(snap, pods=tuple(PodSetting(f"pod-{k}", 0, "ceiling", "fcfs") for k in range(replicas)))
    if rate_factor == 1 or not snap.valid:
        return snap
    tenants = tuple(replace(t, requests_per_s=t.requests_per_s * rate_factor) for t in snap.tenants)
    return replace(snap, tenants=tenants, window_s=snap.window_s / rate_factor)


def results_of(jobs: Sequence[Sequence[engine.Job]], workload: Workload) -> list[loop.Result]:
    arrivals = {r.rid: r.arrival_s for r in workload.requests}
    return [loop.Result(j.req.tenant, j.rid, arrivals[j.rid], j.first_token_s - j.arrival_s, j.first_token_s >= 0)
            for js in jobs for j in js]  # fmt: skip


def static(workload: Workload, name: str) -> Run:
    """The phases under one setting left on throughout (a policy name: stock, ceiling:4096/srpt)."""
    cfg = engine_config()
    profile = profiles.load(phases.PROFILE)
    jobs = [list(engine.simulate(build(f"engine-{k}", part), policies.parse(name, cfg), profile, cfg).jobs)
            for k, part in enumerate(split(workload))]  # fmt: skip
    return Run(results_of(jobs, workload))


def closed_loop(workload: Workload, spans: Sequence[phases.Phase], offset_s: float,
                lset: LoopSettings = LoopSettings(), log: Callable[[str], None] | None = None) -> Run:
    """The phases with the operator's tuner deciding every interval from ``offset_s`` on."""
    cfg = engine_config()
    profile = profiles.load(phases.PROFILE)
    spec = candidates.TuningSpec(8192, 1, 1, lset.max_concurrency, 2.0)
    settings = tuner.TunerSettings(spec, guardrails.GuardrailSettings(
        min_samples=50, cooldown_s=lset.cooldown_s, interval_s=lset.interval_s * 0.9, dwell_cooldowns=0))
    per_engine = split(workload)
    schedules: list[Schedule] = [[] for _ in range(REPLICAS)]
    state = guardrails.TunerState(STOCK)
    rollout_until, now = -1.0, offset_s
    moves: list[tuple[float, str, str, str]] = []
    jobs = run_engines(per_engine, schedules, profile, cfg)
    while now < spans[-1].end_s:
        snap = observed.snapshot_of("sd", first_tokens(jobs), now, lset.interval_s)
        snap = as_prometheus_reads(snap, REPLICAS, lset.rate_factor)
        decision = tuner.tune_once(snap, replace(state, rollout_in_progress=now < rollout_until),
                                   settings, profile, cfg, now)  # fmt: skip
        phase = next((p.name for p in spans if p.holds(now)), "?")
        if isinstance(decision, guardrails.Move) and not lset.off:
            moves.append((now, policy_name(decision.from_), policy_name(decision.to), decision.reason))
            if log:
                log(f"{now:7.0f} [{phase}] Move {moves[-1][1]} -> {moves[-1][2]}: {decision.reason}")
            schedules[0].append((now, decision.to))
            for k in range(1, REPLICAS):
                schedules[k].append((now + lset.analysis_s, decision.to))
            rollout_until = now + lset.analysis_s
            state = state.stepped(decision.to, now)
            jobs = run_engines(per_engine, schedules, profile, cfg)
        elif log:
            log(f"{now:7.0f} [{phase}] {decision.reason}: {getattr(decision, 'message', '')[:160]}")
        now += lset.interval_s
    return Run(results_of(jobs, workload), moves)


def worst_tenant_p99(results: Sequence[loop.Result], start_s: float, end_s: float) -> float:
    """The worst tenant's p99 TTFT over [start_s, end_s), whole (no settling exclusion)."""
    return max(loop.tenant_p99(results, start_s, end_s).values(), default=float("nan"))


def figures(run: Run, spans: Sequence[phases.Phase]) -> dict[str, float]:
    """Worst-tenant p99 TTFT per phase and over the whole run (twin seconds)."""
    out = {p.name: worst_tenant_p99(run.results, p.start_s, p.end_s) for p in spans}
    out["whole"] = worst_tenant_p99(run.results, spans[0].start_s, spans[-1].end_s)
    return out
