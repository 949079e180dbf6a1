"""The demo's phases on two twin engines: static settings, and the operator's tuner in the loop.

The requests go round robin to two twin engines (as the load generator spreads them over
the ready pods). For the closed loop, every interval the operator's own tuner
(tune.tuner.tune_once with the operator's guardrails: min samples 50, no dwell) judges
the fleet's last window as Prometheus would show it (tune.observed). A Move starts on
one canary engine at once and on the other one analysis window later (a promotion; the
canary's analysis itself is not modelled), and the engines are re-run with the new
schedule (deterministic, so the past does not change). Between steps the queue mix is
polled every ``mix_poll_s`` (as the operator's ``mix_poll_seconds``: the uncached tokens of
the window's first tokens and of the requests waiting then, by size class), and a jump
(``tune.mixjump``) brings the next step forward to the poll that saw it. A jump while a
canary runs that does not cap harder voids it, as the operator's rollout machine does
(``rollout.machine.voidable``): the canary engine goes back to the fleet's setting at the
poll, the promotion never comes, the cooldown runs from then, the candidate is not tried
again for a cooldown, and the step the jump brings comes at that same poll, on the
rollout as voided (the operator's voiding step decides on the new mix too: a harder cap,
which skips its canary, reaches every engine at that moment).

Used by ``scripts/closed-loop-offline.py`` (the timer-offset sweep) and by the demo's
closing comparison (Auto beside Off and the best static setting, on the same traffic,
judged over whole phases from their first second).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from slipstream.api import buckets, models
from slipstream.api.snapshot import PodSetting, WorkloadSnapshot
from slipstream.controller import settings as controller_settings
from slipstream.demo import loop, phases
from slipstream.rollout import machine
from slipstream.sim import engine, policies, profiles
from slipstream.sim.admission import MODES
from slipstream.sim.workload import Request, Workload, build
from slipstream.tune import (
    candidates,
    deployment,
    guardrails,
    mixjump,
    observed,
    pooling,
    recommend,
    tuner,
)
from slipstream.tune.recommend import policy_name

STOCK = policies.Setting(0, "ceiling", "fcfs")
REFLEX_START = policies.Setting(4096, "reflex", "srpt")
"""A reflex at T 4096 with srpt: stock on uniform traffic, ceiling:4096/srpt from the pass
after a short request waits (``LoopSettings.start`` for a reflex Auto)."""
STOCK_NAME = policy_name(STOCK)
"""Off: what the fleet runs when the tuner never moves (``stock``)."""
REPLICAS = 2
SPEC = candidates.TuningSpec(8192, 1, 1, 2)
"""The demo's tuning bounds (C 8192, page 1, concurrency 1-2: loop.serving_deployment's)."""
STATIC = tuple(policy_name(s) for s in candidates.enumerate_candidates(SPEC))
"""The static settings a ceiling/floor Auto is judged against: every setting it may choose
within the demo's bounds (stock, and T 4096 in either mode, each in every order), so "the
best static setting in hindsight" is the best of what Auto could have left on."""
CONSTANTS = tuple(policy_name(s) for s in candidates.enumerate_candidates(replace(SPEC, modes=MODES)))
"""Every constant a user could leave on within the demo's bounds, the reflex included
(stock, and T 4096 as ceiling, floor or reflex, each in every order): what a reflex Auto,
and any Auto in the randomized sweep, is judged against."""

Schedule = list[tuple[float, policies.Setting]]


@dataclass(frozen=True)
class LoopSettings:
    """The operator's timing and bound, in twin seconds (the demo's ServingDeployment)."""

    interval_s: float = float(models.Tuning.model_fields["interval_seconds"].default)
    cooldown_s: float = float(models.Tuning.model_fields["cooldown_seconds"].default)
    analysis_s: float = float(models.Rollout.model_fields["analysis_window_seconds"].default)
    max_concurrency: int = 2
    rate_factor: float = 1.0
    off: bool = False
    mix_poll_s: float = controller_settings.ControllerSettings().mix_poll_seconds
    """Twin seconds between queue-mix polls (the operator's default); 0: the timer only."""
    start: policies.Setting = REFLEX_START
    """The setting every engine starts on (the ServingDeployment's tuning.threshold,
    engineMode and schedulePolicy; the demo's, ``loop.serving_deployment``, by default);
    its mode picks the modes tuned (``candidates.modes_for``): from ``STOCK`` the
    ceiling and floor tuner runs."""


@dataclass
class Run:
    """One replay's outcome: every request's result and the moves made (twin seconds)."""

    results: list[loop.Result]
    moves: list[tuple[float, str, str, str]] = field(default_factory=list)
    schedules: list[Schedule] = field(default_factory=list)
    """Per engine, (twin s, setting) of each change it was given."""

    def settled_after(self, start_s: float, end_s: float) -> float:
        """Seconds from ``start_s`` to the last change of any engine's setting before
        ``end_s`` (0: none changed): when every engine runs the setting it ends the span on."""
        changes = [t for schedule in self.schedules for t, _ in schedule if start_s <= t < end_s]
        return max(changes, default=start_s) - start_s


def engine_config() -> policies.EngineConfig:
    return policies.EngineConfig(chunked_prefill_size=8192, page_size=1)


def split(workload: Workload) -> list[list[Request]]:
    """Round robin over the replicas in arrival order: request k to engine k mod REPLICAS,
    as the load generator spreads requests over the ready pods (``enginesim.load``, its
    ``pick``: request k to the (k mod n)-th of the URLs, which the Service's ready-pod
    list gives sorted), so engine k here is the k-th pod URL in sorted order. Each engine
    has its own prefix cache: a later turn hits only where the earlier turn was sent."""
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


def arrivals_of(jobs: Sequence[Sequence[engine.Job]]) -> list[tuple[str, float]]:
    return [(j.req.tenant, j.arrival_s) for js in jobs for j in js]


def waiting_at(jobs: Sequence[Sequence[engine.Job]], now: float) -> list[tuple[str, int]]:
    """(tenant, uncached tokens) of every request arrived by ``now`` with no first token yet:
    what the engines' queue gauges count."""
    return [(j.req.tenant, j.uncached if j.uncached > 0 else j.req.prompt_tokens) for js in jobs for j in js
            if j.arrival_s <= now and not 0 <= j.first_token_s <= now]


def mix_at(jobs: Sequence[Sequence[engine.Job]], now: float, window_s: float) -> mixjump.Mix | None:
    """The queue mix the engines' size-class series would show at ``now``: the uncached
    tokens of the window's first tokens plus those of the requests waiting at ``now``."""
    work: dict[str, float] = {}
    requests = 0
    for js in jobs:
        for j in js:
            done = now - window_s < j.first_token_s <= now
            waiting = j.arrival_s <= now and not 0 <= j.first_token_s <= now
            if done or waiting:
                tokens = float(j.uncached if j.uncached > 0 else j.req.prompt_tokens)
                name = buckets.size_class(tokens)
                work[name] = work.get(name, 0.0) + tokens
                requests += 1
    return mixjump.shares(work, requests)


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
                lset: LoopSettings = LoopSettings(), log: Callable[[str], None] | None = None,
                canary: int = 0) -> Run:  # fmt: skip
    """The phases with the operator's tuner deciding every interval from ``offset_s`` on;
    each Move starts on engine ``canary`` (its index in the round robin, ``split``) and
    reaches the others an analysis window later, or on every engine at once when the
    operator's risk rule skips the canary (``skips_canary``). Which engine is the canary matters: the
    operator canaries the first pod by name, which is either engine at random, and on the
    demo's phases a canary on the engine that holds the phase's first giants rescues the
    heterogeneous phase's tail an analysis window sooner than one on the other."""
    cfg = engine_config()
    profile = profiles.load(phases.PROFILE)
    spec = candidates.TuningSpec(8192, 1, 1, lset.max_concurrency, 2.0, modes=candidates.modes_for(lset.start.mode))
    settings = tuner.TunerSettings(spec, guardrails.GuardrailSettings(
        min_samples=50, cooldown_s=lset.cooldown_s, interval_s=lset.interval_s * 0.9, dwell_cooldowns=0))
    per_engine = split(workload)
    schedules: list[Schedule] = [[] for _ in range(REPLICAS)]
    state = guardrails.TunerState(lset.start)
    if lset.start != STOCK:
        schedules = [[(0.0, lset.start)] for _ in range(REPLICAS)]
    rollout_until, now, jumped = -1.0, offset_s, False
    moves: list[tuple[float, str, str, str]] = []
    watch = mixjump.MixWatch()
    canarying: guardrails.TunerState | None = None
    """The state before the move whose canary a jump would void, while it runs."""
    blocked: tuple[policies.Setting, float] | None = None
    """A voided candidate and when it may be tried again (the machine's ``retry_after_s``)."""
    jobs = run_engines(per_engine, schedules, profile, cfg)
    while now < spans[-1].end_s:
        seen = first_tokens(jobs)
        window = pooled_window(seen, jobs, now, state, settings.guardrails, lset, jumped)
        snap = observed.with_queue_mix(observed.snapshot_of("sd", seen, now, window), seen,
                                       arrivals_of(jobs), waiting_at(jobs, now))
        snap = as_prometheus_reads(snap, REPLICAS, lset.rate_factor)
        decision = tuner.tune_once(snap, replace(state, rollout_in_progress=now < rollout_until, mix_jumped=jumped),
                                   settings, profile, cfg, now)  # fmt: skip
        state = state.saw(recommend.window_heterogeneity(snap, profile, spec.chunked_prefill_size), now,
                          settings.guardrails)
        phase = next((p.name for p in spans if p.holds(now)), "?")
        if isinstance(decision, guardrails.Move) and blocked is not None and decision.to == blocked[0] \
                and now < blocked[1]:
            if log:
                log(f"{now:7.0f} [{phase}] Hold: {policy_name(decision.to)} was voided; not tried again yet")
        elif isinstance(decision, guardrails.Move) and not lset.off:
            moves.append((now, policy_name(decision.from_), policy_name(decision.to), decision.reason))
            if log:
                log(f"{now:7.0f} [{phase}] Move {moves[-1][1]} -> {moves[-1][2]}: {decision.reason}")
            skipped = skips_canary(decision, state)
            for k in range(REPLICAS):
                schedules[k].append((now if k == canary or skipped else now + lset.analysis_s, decision.to))
            rollout_until = now if skipped else now + lset.analysis_s
            if log and skipped:
                log(f"{now:7.0f} [{phase}] {skipped}")
            canarying = None if skipped or not voids_canary(decision) else state
            # The cooldown runs from the promotion (tune.deployment.last_step_at), as the operator's.
            state = state.stepped(decision.to, rollout_until)
            jobs = run_engines(per_engine, schedules, profile, cfg)
        elif log:
            log(f"{now:7.0f} [{phase}] {decision.reason}: {getattr(decision, 'message', '')[:160]}")
        watch = watch.stepped(mix_at(jobs, now, lset.interval_s), decision.recommendation is not None,
                              guardrails.settles(decision, cfg.chunked_prefill_size), jumped)
        voids = canarying if canarying is not None and now < rollout_until else None
        now, watch, jumped = next_step(jobs, now, rollout_until, watch, lset, log, voids is not None)
        if voids is not None and jumped and now < rollout_until:  # the jump voided the canary (module doc)
            if log:
                log(f"{now:7.0f} canary of {policy_name(state.current)} voided: back to {policy_name(voids.current)}")
            blocked = (state.current, now + max(lset.cooldown_s, lset.analysis_s))
            for k in range(REPLICAS):  # the promotion not yet reached never comes
                schedules[k] = [(t, s) for t, s in schedules[k] if t <= now]
            schedules[canary].append((now, voids.current))
            state = replace(state, current=voids.current, left=voids.left, last_step_at=now)
            rollout_until, canarying = now, None
            jobs = run_engines(per_engine, schedules, profile, cfg)
            # The jump's step comes now, on the rollout as voided (the next turn of the loop).
    return Run(results_of(jobs, workload), moves, schedules)


def voids_canary(move: guardrails.Move) -> bool:
    """Whether a queue-mix jump voids this move's canary (``rollout.machine.voidable``)."""
    status = models.RolloutStatus(phase="Canary", candidate=deployment.engine_setting(move.to),
                                  baseline=deployment.engine_setting(move.from_))  # fmt: skip
    return machine.voidable(status, engine_config().chunked_prefill_size)


def skips_canary(move: guardrails.Move, state: guardrails.TunerState) -> str:
    """The operator's risk rule (``rollout.machine.skip_canary``) for this move: why it goes
    to every engine at once, or "" (the canary runs). Proven settings are those a promotion
    left (``state.left``); the twin's rollouts are never rolled back."""
    def es(s: policies.Setting) -> models.EngineSetting:
        return deployment.engine_setting(s)

    target = machine.RolloutTarget(es(move.to), move.reason, canary=True, gain=move.recommendation.sure_gain,
                                   proven=tuple(es(s) for s, _ in state.left))
    return machine.skip_canary(target, models.RolloutStatus(), es(state.current), engine_config().chunked_prefill_size)


def next_step(jobs: Sequence[Sequence[engine.Job]], now: float, rollout_until: float, watch: mixjump.MixWatch,
              lset: LoopSettings, log: Callable[[str], None] | None,
              voidable: bool = False) -> tuple[float, mixjump.MixWatch, bool]:  # fmt: skip
    """(when the next step runs, the watch, whether a jump brought it forward): one interval
    on, or at the first mix poll that saw a jump. While a rollout is in flight the operator
    steps every few seconds anyway and takes no new decision: no polls, unless a jump would
    void its canary (``voidable``; a poll that fires before ``rollout_until`` voids it)."""
    step_at = now + lset.interval_s
    poll = now if watch.look_now else now + lset.mix_poll_s  # tune.mixjump.MixWatch.look_now
    while lset.mix_poll_s > 0 and poll < step_at:
        if poll >= rollout_until or voidable:
            watch, fired = watch.see(mix_at(jobs, poll, lset.interval_s))
            if fired:
                if log:
                    log(f"{poll:7.0f} queue mix jumped: stepping {step_at - poll:.0f} s before the timer")
                return poll, watch, True
        poll += lset.mix_poll_s
    return step_at, watch, False


def ranked_static(workload: Workload, spans: Sequence[phases.Phase]) -> list[tuple[str, float]]:
    """(policy name, whole-run worst-tenant p99 TTFT) of every constant (``CONSTANTS``, the
    reflex included) on the twin, best first: the static settings in hindsight."""
    scored = [(name, figures(static(workload, name), spans)["whole"]) for name in CONSTANTS]
    return sorted(scored, key=lambda x: x[1])


def worst_tenant_p99(results: Sequence[loop.Result], start_s: float, end_s: float) -> float:
    """The worst tenant's p99 TTFT over [start_s, end_s), whole (no settling exclusion)."""
    return max(loop.tenant_p99(results, start_s, end_s).values(), default=float("nan"))


def figures(run: Run, spans: Sequence[phases.Phase]) -> dict[str, float]:
    """Worst-tenant p99 TTFT per phase and over the whole run (twin seconds)."""
    out = {p.name: worst_tenant_p99(run.results, p.start_s, p.end_s) for p in spans}
    out["whole"] = worst_tenant_p99(run.results, spans[0].start_s, spans[-1].end_s)
    return out


# --- Per-phase judgement: Auto against the best static setting of each phase ----------------

FIRST_S = 60.0
"""Twin seconds after a phase change over which Auto's reaction is judged (one interval)."""


@dataclass(frozen=True)
class SpanFigures:
    """One run's worst-tenant p99 TTFT (twin s): per phase, over each phase's first
    ``FIRST_S`` (or the whole phase when shorter), and over the whole run."""

    phases: tuple[float, ...]
    firsts: tuple[float, ...]
    whole: float


def span_figures(run: Run, spans: Sequence[phases.Phase], first_s: float = FIRST_S) -> SpanFigures:
    return SpanFigures(
        tuple(worst_tenant_p99(run.results, p.start_s, p.end_s) for p in spans),
        tuple(worst_tenant_p99(run.results, p.start_s, min(p.end_s, p.start_s + first_s)) for p in spans),
        worst_tenant_p99(run.results, spans[0].start_s, spans[-1].end_s))


def static_figures(workload: Workload, spans: Sequence[phases.Phase],
                   first_s: float = FIRST_S) -> dict[str, SpanFigures]:  # fmt: skip
    """Every constant's figures (``CONSTANTS``, the reflex included), each left on over the
    whole workload (one run each)."""
    return {name: span_figures(static(workload, name), spans, first_s) for name in CONSTANTS}


@dataclass(frozen=True)
class PhaseJudgement:
    """Auto in one phase against the phase's oracle: the static setting best in that phase."""

    name: str
    kind: str
    auto_s: float
    """Auto's worst-tenant p99 TTFT over the whole phase."""
    oracle: str
    oracle_s: float
    """The least of the ``CONSTANTS``' worst-tenant p99 over the phase (each run over
    the whole workload, so a phase starts on what the setting left of the one before)."""
    first_s: float
    """Auto's worst-tenant p99 over the phase's first ``FIRST_S``."""
    first_oracle_s: float
    """The least static worst-tenant p99 over the same first seconds."""
    change: bool
    """The phase starts at a phase change (every phase but the first)."""

    @property
    def vs_oracle(self) -> float:
        return self.auto_s / self.oracle_s

    @property
    def first_vs_oracle(self) -> float:
        return self.first_s / self.first_oracle_s


@dataclass(frozen=True)
class RunJudgement:
    """One Auto run judged per phase and whole, against the best static setting and Off."""

    phases: tuple[PhaseJudgement, ...]
    auto_s: float
    best_static: str
    best_static_s: float
    off_s: float
    moves: int = 0

    @property
    def vs_best(self) -> float:
        return self.auto_s / self.best_static_s

    @property
    def vs_off(self) -> float:
        return self.auto_s / self.off_s

    @property
    def off_vs_best(self) -> float:
        return self.off_s / self.best_static_s

    def worst_phase(self) -> PhaseJudgement:
        return max(self.phases, key=lambda p: p.vs_oracle)

    def worst_first(self) -> PhaseJudgement | None:
        """The phase after a change whose first seconds went worst against the oracle's."""
        return max((p for p in self.phases if p.change), key=lambda p: p.first_vs_oracle, default=None)

    def worst_first_s(self) -> float:
        """Auto's slowest worst-tenant p99 over the first seconds after a phase change."""
        return max((p.first_s for p in self.phases if p.change), default=math.nan)


def _least(statics: dict[str, SpanFigures], figure: Callable[[SpanFigures], float]) -> tuple[str, float]:
    """(setting, figure) of the static setting whose ``figure`` is least (NaN ones skipped)."""
    named = [(name, figure(f)) for name, f in statics.items() if not math.isnan(figure(f))]
    return min(named, key=lambda x: x[1], default=("?", float("nan")))


def judge(auto: SpanFigures, statics: dict[str, SpanFigures], spans: Sequence[phases.Phase],
          moves: int = 0, off: str = STOCK_NAME) -> RunJudgement:  # fmt: skip
    """Auto's figures against each phase's oracle, the best static over the whole run and Off."""
    judged = []
    for k, p in enumerate(spans):
        oracle, oracle_s = _least(statics, lambda f, k=k: f.phases[k])
        _, first_oracle_s = _least(statics, lambda f, k=k: f.firsts[k])
        judged.append(PhaseJudgement(p.name, p.kind, auto.phases[k], oracle, oracle_s, auto.firsts[k],
                                     first_oracle_s, k > 0))  # fmt: skip
    best, best_s = _least(statics, lambda f: f.whole)
    return RunJudgement(tuple(judged), auto.whole, best, best_s, statics[off].whole, moves)


def judgement_lines(j: RunJudgement, first_s: float = FIRST_S) -> list[str]:
    """Per phase, Auto against that phase's best constant (the oracle), over the phase and
    over its first ``first_s`` after a change; then the whole run against the best constant
    and Off: what the demo, loopbench and the closed-loop test print."""
    lines = [f"  {p.name:18s} Auto {p.auto_s:6.2f} s, oracle {p.oracle} {p.oracle_s:.2f} s: {p.vs_oracle:.2f}x"
             + (f"; first {first_s:g} s {p.first_s:.2f} s against {p.first_oracle_s:.2f} s: "
                f"{p.first_vs_oracle:.2f}x" if p.change else "") for p in j.phases]  # fmt: skip
    lines.append(f"  whole run          Auto {j.auto_s:6.2f} s, best constant {j.best_static} {j.best_static_s:.2f} s: "
                 f"{j.vs_best:.2f}x; Off {j.off_s:.2f} s: {j.vs_off:.2f}x")  # fmt: skip
    return lines


def judge_loop(workload: Workload, spans: Sequence[phases.Phase], offset_s: float,
               statics: dict[str, SpanFigures] | None = None, lset: LoopSettings = LoopSettings(),
               canary: int = 0) -> RunJudgement:  # fmt: skip
    """``closed_loop`` at ``offset_s``, judged (``statics``: ``static_figures``, computed when absent)."""
    statics = static_figures(workload, spans) if statics is None else statics
    run = closed_loop(workload, spans, offset_s, lset, canary=canary)
    return judge(span_figures(run, spans), statics, spans, len(run.moves))


def pooled_window(seen: Sequence[policies.FirstToken], jobs: Sequence[Sequence[engine.Job]], now: float,
                  state: guardrails.TunerState, guard: guardrails.GuardrailSettings, lset: LoopSettings,
                  jumped: bool) -> float:
    """The window a step at ``now`` judges, as the operator's loop reads it (``tune.pooling``):
    the interval, doubled while it holds too few first tokens, never past the last change
    of the fleet's setting (the promotion; the traffic's start at 0) nor 16 intervals; a
    jump's own window widens up to the interval, counting the requests waiting now."""
    since = max(0.0, state.last_step_at) if state.last_step_at is not None else 0.0
    times = [f.first_token_s for f in seen]
    if jumped:
        windows = pooling.jump_ladder(mixjump.window_s(lset.mix_poll_s, lset.interval_s), lset.interval_s, now, since)
        need = min(guard.min_samples, guard.jump_min_samples)
        return pooling.pick(windows, times, now, need, len(waiting_at(jobs, now)))[0]
    return pooling.pick(pooling.ladder(lset.interval_s, now, since), times, now, guard.min_samples)[0]
