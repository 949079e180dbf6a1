"""The recommender: run every candidate on the twin over the snapshot's workload, pick one.

Steps (each a function below, plain data between them):

1. ``synthesize`` the snapshot into a twin workload (``twin_workload``) and ``calibrate``
   its burstiness: the current setting runs on Poisson arrivals, then on bursts of 2, 4,
   8, ... until its predicted per-tenant p99 TTFT stops getting closer (log error) to what
   the snapshot's TTFT histograms show for that same setting. Real traffic is burstier
   than Poisson; on the Azure code trace stock's p99 TTFT is 14 s at 27% prefill load,
   which Poisson arrivals at the same rate predict as well under 1 s;
   ``check`` the fitted replay against the observation (``tune.modelcheck``): every
   tenant's predicted p99 within ``model_band`` of its observed one, else other draws of
   the window are checked (other seeds: where a giant lands in a replay is luck; and with
   the requests waiting now) and the closest kept, then the offered load is refitted (a
   few more runs of the current setting) and checked again; a twin that still disagrees
   is reported in ``Ranking.model`` and the guardrails hold. When the engines' queue mix
   shows requests waiting now, the fit runs with and without them and keeps the closer (a
   giant still prefilling has no first token, yet the requests behind it show its wait),
   and the what-if below replays them in any case, at the fitted burst, seed and rate (a
   giant still prefilling is the window's traffic, and the one request the threshold is for);
2. ``predict`` each candidate (the screen): one deterministic twin run per candidate,
   on the same workload;
3. ``choose``: among the candidates inside the spec's bounds that meet every attainable
   per-tenant p99 TTFT target and keep the longest prompts' slowdown within the bound,
   the one with the least objective (default: the worst tenant's p99 slowdown, TTFT over
   the same request's TTFT alone). Candidates within ``tie_tolerance`` of the least are
   ties, won by the preferred (least concurrency, then srpt, fcfs, lpm, then ceiling;
   ``candidates.preference``): uniform traffic, where
   every candidate predicts the same, stays at off.

4. ``confirm``: the best screened candidates, the current setting and off in every order
   run again on a longer, independent sample of the same mix (``confirm_requests``,
   replayed past the window's span), and the choice and its gain come from that run: a
   short run from an empty engine cannot see a backlog or a full KV pool building up,
   and a second sample takes the winner's curse out of the gain;
5. ``robust_choice``: the few best confirmed candidates (``robust_top``), the point
   choice of step 3, the current setting and the best of those with the least
   concurrency, when less than the current's (``least_concurrency``: the guardrails'
   step back is judged on these draws), run again on ``robust_draws`` independent
   resamples (other seeds, the fitted burst size's neighbours on the ladder), and the
   choice is the one whose worst regret across the draws (its objective over that draw's
   best) is least (``tune.robust``, which states the rule): one window is consistent with
   several workloads, and a cap that costs 5% on a draw without giants is worth it when
   no cap costs 10x on a draw with them. Its robust gain over the current setting is
   ``resample_gain``, which the guardrails hold a move to (``NotOnResample``).

A target is *attainable* when the tenant's own p99 TTFT alone (its prompts' prefill on an
idle engine) is below it: no scheduler can bring a 600K-token prompt under 2 s, so such a
target is reported, not used to veto every candidate. When no candidate meets the
constraints the recommendation is marked infeasible and carries the best effort (the least
objective among those within the long-prompt bound, else among all).

The long-prompt bound: the p99 slowdown of the longest decile of prompts (by uncached
tokens) may not exceed ``max(long_prompt_slowdown_max, long_prompt_slowdown_factor x the
same figure under off/fcfs)``: shortest-first orders and concurrency help short prompts
by delaying long ones, and this is how far they may.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slipstream.api.snapshot import Histogram, WorkloadSnapshot
from slipstream.sim import engine, policies
from slipstream.sim.metrics import percentile, weighted_percentile
from slipstream.sim.policies import EngineConfig, Setting
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Workload
from slipstream.tune import modelcheck, robust, twin_workload
from slipstream.tune.candidates import TuningSpec, concurrency, enumerate_candidates, preference
from slipstream.tune.heterogeneity import heterogeneity
from slipstream.tune.twin_workload import synthesize

OBJECTIVES = ("worst_tenant_slowdown_p99", "worst_tenant_ttft_p99")
BASELINE = Setting(0, "ceiling", "fcfs")
"""Off, fcfs: SGLang as shipped, the reference of the long-prompt bound."""


@dataclass(frozen=True, slots=True)
class RecommenderSettings:
    """How the recommender runs; every field with its unit and why."""

    max_requests: int = 150
    """Requests in the window's replay (count): the model check's and the burst fit's, and
    the screen, which every candidate runs on. Its span is the snapshot's window (shorter
    if the window holds more). Bounds one run to a few ms so ~45 candidates fit in about a
    tenth of a second; 150 still puts one or two of a 1% tail in, and the screen only picks
    the shortlist that the confirming run re-ranks."""
    confirm_requests: int = 1200
    """Requests in the confirming workload (count; 0 turns the stage off): an independent
    sample of the same mix, replayed for as long as it takes (beyond the window), on which
    the shortlist runs and the choice is made. A short run starts from an empty engine and
    cannot see a backlog or a full KV pool that builds over minutes: on the Mooncake + Azure
    traces a 120 s screen ranked ceiling:4096/srpt 16 and stock/srpt 40, a 200 s run 264 and
    40. Being a second sample it also takes the winner's curse out of the gain: the least of
    45 noisy estimates is biased low."""
    shortlist: int = 4
    """Best screened candidates (count) the confirming run re-checks, besides the current
    setting and off in every order."""
    robust_draws: int = 2
    """Independent resamples (count; 0 turns the robust choice off: the point choice on the
    confirming sample, and no resample) the best confirmed candidates and the current
    setting run on besides the confirming sample (``tune.robust``): another seed each, at
    the fitted burst size's neighbours on the ladder (above, then below: the fit's own
    uncertainty), at the calibrated rate."""
    robust_requests: int = 400
    """Requests in each resample (count), replayed past the window's span like the
    confirming sample. A third of its length: the resamples run only the top few
    candidates, and their job is to show a draw with giants (or without), not a finer
    figure."""
    robust_top: int = 3
    """Best confirmed candidates (count, by the confirming sample's objective among those
    the constraints admit) that run on the resamples, besides the current setting."""
    robust_quantile: float = 1.0
    """Which of a candidate's per-draw regrets is its score (quantile; 1.0: the worst
    draw). With three draws anything lower ignores the draw with the giants."""
    max_step_factor: float = 2.0
    """Most concurrency a step may reach, as a multiple of the current (off counts as 1; 0
    turns the limit off); fewer is never limited. More concurrent prefills hold more KV,
    a risk a window-long twin run sees late; stepping up by at most double lets each step
    show in the metrics before the next (a step from off straight to concurrency 4 can
    leave giant prompts' reservations crowding out everything else)."""
    seed: int = 0
    """Seed of the workload's RNG: the same snapshot gives the same recommendation."""
    objective: str = "worst_tenant_slowdown_p99"
    """What is minimised: the worst tenant's p99 slowdown (default: fair to short and long
    prompts alike), or the worst tenant's p99 TTFT (seconds)."""
    tie_tolerance: float = 0.05
    """Relative band (fraction) within which candidates count as equal and the preferred wins:
    the twin's figures on a 300-request sample are not finer than that."""
    long_prompt_slowdown_max: float = 10.0
    """Absolute part of the long-prompt bound (slowdown, dimensionless): the longest decile
    may wait up to 9x its own prefill time before it counts as starved."""
    long_prompt_slowdown_factor: float = 1.5
    """Relative part (multiple of the same figure under off/fcfs): under overload even stock
    exceeds the absolute bound, and a candidate may then be at most this much worse."""
    bursts: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    """Arrival burst sizes (requests arriving together) tried when fitting the twin to the
    current setting's observed p99 TTFT, in order; the search stops at the first that fits
    worse than the one before. (1,) turns the fit off."""
    calibration_min_samples: int = 20
    """First tokens a tenant needs in the window (count) for its observed p99 TTFT to be
    fitted: fewer and the p99 is one request's luck."""
    model_band: float = 4.0
    """Factor (either way) within which the twin's replay of the window under the running
    setting must match each tenant's observed p99 TTFT before its candidates are believed
    (``tune.modelcheck``; 0 turns the check off). Room for about one TTFT bucket (1.5-2.5x
    apart) of a correct model's miss; a reasoned choice, not yet measured."""
    model_calibration_runs: int = 3
    """Twin runs of the running setting (count) the offered-load calibration may spend
    when the first check disagrees (arrivals x0.5, x0.25, ... or x2, x4, ...)."""
    model_draws: int = 3
    """Other draws of the window (other seeds; count) the model check tries before the
    offered-load calibration when the first disagrees, each with and without the requests
    waiting now when some wait (``checked``): where a giant lands in a replay is luck."""
    orders: tuple[str, ...] = policies.QUEUE_ORDERS
    """Admission orders tried, of those the spec allows (``TuningSpec.orders``: by default
    fcfs, lpm and srpt)."""
    modes: tuple[str, ...] = ("ceiling", "floor", "reflex")
    """Engine modes tried, of those the spec allows (``TuningSpec.modes``: ceiling and floor,
    or the reflex alone for a reflex spec)."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.max_requests < 10:
            raise ValueError("max_requests must be >= 10")
        if self.robust_draws < 0 or self.robust_top < 1 or self.robust_requests < 10:
            raise ValueError("robust_draws must be >= 0, robust_top >= 1 and robust_requests >= 10")
        if not 0.0 < self.robust_quantile <= 1.0:
            raise ValueError(f"robust_quantile must be in (0, 1], got {self.robust_quantile}")


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """One tenant under one candidate, predicted by the twin."""

    name: str
    requests: int
    ttft_p99_s: float
    slowdown_p99: float
    solo_ttft_p99_s: float
    """p99 TTFT of the same requests alone: the floor no setting goes under."""
    target_s: float

    @property
    def attainable(self) -> bool:
        return self.solo_ttft_p99_s <= self.target_s

    @property
    def meets_target(self) -> bool:
        return not self.attainable or self.ttft_p99_s <= self.target_s


@dataclass(frozen=True, slots=True)
class Prediction:
    """The twin's figures for one candidate."""

    setting: Setting
    concurrency: int
    allowed: bool
    """Inside the spec's bounds."""
    tenants: tuple[TenantFigures, ...]
    worst_tenant_slowdown_p99: float
    worst_tenant_ttft_p99_s: float
    long_prompt_slowdown_p99: float
    within_long_bound: bool = True

    @property
    def meets_targets(self) -> bool:
        return all(t.meets_target for t in self.tenants)

    def objective(self, name: str) -> float:
        return self.worst_tenant_slowdown_p99 if name == OBJECTIVES[0] else self.worst_tenant_ttft_p99_s

    def worst_tenant(self) -> TenantFigures | None:
        return max(self.tenants, key=lambda t: t.slowdown_p99, default=None)

    def tenant(self, name: str) -> TenantFigures | None:
        return next((t for t in self.tenants if t.name == name), None)


@dataclass(frozen=True, slots=True)
class Ranking:
    """The choice, every candidate's predicted figures, and why in one line."""

    best: Prediction
    current: Prediction
    predictions: tuple[Prediction, ...]
    heterogeneity: float
    feasible: bool
    """Some allowed candidate meets every attainable target and the long-prompt bound."""
    objective: str
    long_prompt_bound: float
    requests: int
    """Requests in the synthetic workload."""
    reason: str
    burst: int = 1
    """Arrival burst size the twin was fitted to (1: Poisson)."""
    fit_error: float = math.nan
    """Mean |log(predicted / observed)| of the current setting's per-tenant p99 TTFT at
    ``burst`` (0 is a perfect fit; NaN when no tenant had enough samples)."""
    confirmed: tuple[Prediction, ...] = ()
    """The shortlist re-run on the longer, independent confirming sample; ``best`` and
    ``current`` are from these (``predictions`` holds the screen of every candidate)."""
    resample_gain: float = math.nan
    """The robust gain of best over current (``tune.robust``: 1 - best's worst per-draw
    regret over the current's) across the confirming sample and the independent resamples
    (other seeds, the fit's neighbouring burst sizes), not the one sample a point choice is
    made on; NaN when not measured (best is current, or the robust choice is off)."""
    model: modelcheck.ModelCheck | None = None
    """The twin's replay of the window under the running setting beside the observed p99
    TTFT, after the offered-load calibration (``tune.modelcheck``); the guardrails hold
    ``ModelMismatch`` when it disagrees. None: not checked."""
    regrets: tuple[robust.Scored[Setting], ...] = ()
    """The candidates that ran on the resamples, each with its regret per draw (the
    confirming sample first) and its score (``tune.robust``); empty when the robust choice
    is off."""

    @property
    def gain(self) -> float:
        """Relative predicted improvement of the objective over the current setting."""
        cur = self.current.objective(self.objective)
        new = self.best.objective(self.objective)
        return (cur - new) / cur if cur > 0 and math.isfinite(cur) and math.isfinite(new) else 0.0

    @property
    def screen_gain(self) -> float:
        """The same relative gain (best over current) on the screening sample: a second,
        independent estimate of it (equal to ``gain`` when there is no confirming run)."""
        by = {p.setting: p for p in self.predictions}
        cur, new = by.get(self.current.setting), by.get(self.best.setting)
        if cur is None or new is None:
            return self.gain
        a, b = cur.objective(self.objective), new.objective(self.objective)
        return (a - b) / a if a > 0 and math.isfinite(a) and math.isfinite(b) else 0.0

    @property
    def gain_spread(self) -> float:
        """How far the two samples disagree on the gain (fraction, >= 0): the noise estimate
        the guardrails hold a gain against. Both samples run every candidate on the same
        requests (common random numbers), so this is the spread of the difference itself."""
        return abs(self.screen_gain - self.gain)

    def kept(self) -> Ranking:
        """What the guardrails and the controller read of it, and nothing else: ``best``,
        ``current``, of the screen the same two settings (``screen_gain``), and of the
        confirming shortlist the few candidates the resamples scored (``regrets``: the step
        back's, ``guardrails.step_back_to``); the other candidates' figures dropped. Every
        property above gives the same; what the tuner memo keeps per deployment between
        intervals (a full one, 45 candidates' per-tenant figures, would be most of an entry)."""
        two = {self.best.setting, self.current.setting}
        scored = {s.candidate for s in self.regrets}
        return replace(self, predictions=tuple(p for p in self.predictions if p.setting in two),
                       confirmed=tuple(p for p in self.confirmed if p.setting in scored))

    @property
    def sure_gain(self) -> float:
        """The lesser of ``gain`` and ``resample_gain`` (where measured): the gain the
        canary's risk rule reads (``rollout.machine.skip_canary``), so a skip needs both
        independent samples to predict it."""
        return min(self.gain, self.resample_gain) if math.isfinite(self.resample_gain) else self.gain

    @property
    def gain_abs(self) -> float:
        """Absolute predicted improvement (objective units)."""
        diff = self.current.objective(self.objective) - self.best.objective(self.objective)
        return diff if math.isfinite(diff) else 0.0


def twin_config(config: EngineConfig, spec: TuningSpec, workload: Workload) -> EngineConfig:
    """The engine config the candidates run on: the spec's C and page, a cache that keeps
    every synthetic prefix (the observed hit ratio is already the engine's real one)."""
    need = sum(r.prompt_tokens for r in workload.requests)
    return replace(config, chunked_prefill_size=spec.chunked_prefill_size, page_size=spec.page_size,
                   cache_tokens=max(config.cache_tokens, need + 1))


def policy_name(setting: Setting) -> str:
    """The twin's policy name of a setting, e.g. ``floor:2048/srpt`` or ``stock``."""
    kind = f"{setting.mode}:{setting.threshold}" if setting.threshold else "stock"
    return kind if setting.order == "fcfs" else f"{kind}/{setting.order}"


def predict(workload: Workload, setting: Setting, profile: Profile, config: EngineConfig,
            spec: TuningSpec) -> Prediction:
    """One twin run of ``setting`` on ``workload`` and its figures."""
    return replay(workload, setting, profile, config, spec)[0]


def replay(workload: Workload, setting: Setting, profile: Profile, config: EngineConfig,
           spec: TuningSpec) -> tuple[Prediction, engine.SimResult]:
    """``predict``, and the run itself (its requests, for ``window_p99``)."""
    result = engine.simulate(workload, policies.parse(policy_name(setting), config), profile, config)
    return prediction_of(result, setting, spec), result


def prediction_of(result: engine.SimResult, setting: Setting, spec: TuningSpec) -> Prediction:
    """A twin run's figures (``Prediction``)."""
    by_tenant: dict[str, list[engine.Job]] = {}
    for job in result.jobs:
        by_tenant.setdefault(job.req.tenant, []).append(job)
    tenants = []
    for name, jobs in by_tenant.items():
        ttft = [j.first_token_s - j.arrival_s for j in jobs]
        slow = [(j.first_token_s - j.arrival_s) / j.solo_s for j in jobs if j.solo_s > 0]
        tenants.append(TenantFigures(name, len(jobs), percentile(ttft, 99), percentile(slow, 99),
                                     percentile([j.solo_s for j in jobs], 99), spec.target_for(name)))
    longest = sorted(result.jobs, key=lambda j: j.uncached)[-max(1, len(result.jobs) // 10):]
    long_slow = percentile([(j.first_token_s - j.arrival_s) / j.solo_s for j in longest if j.solo_s > 0], 99)
    return Prediction(
        setting, concurrency(setting, spec.chunked_prefill_size), spec.allows(setting), tuple(tenants),
        max((t.slowdown_p99 for t in tenants), default=math.nan),
        max((t.ttft_p99_s for t in tenants), default=math.nan),
        long_slow,
    )


def choose(predictions: Sequence[Prediction], settings: RecommenderSettings,
           chunked_prefill_size: int) -> tuple[Prediction, bool]:
    """(best, feasible) by the rules of the module doc."""
    pool = eligible(predictions)
    ok = [p for p in pool if p.within_long_bound and p.meets_targets]
    least = min(p.objective(settings.objective) for p in pool)
    ties = [p for p in pool if p.objective(settings.objective) <= least * (1 + settings.tie_tolerance)]
    best = min(ties, key=lambda p: preference(p.setting, chunked_prefill_size))
    return best, bool(ok)


def recommend(snapshot: WorkloadSnapshot, current: Setting, spec: TuningSpec, profile: Profile,
              config: EngineConfig | None = None,
              settings: RecommenderSettings | None = None) -> Ranking:
    """The recommendation for a valid snapshot (ValueError on an invalid or empty one)."""
    settings = settings or RecommenderSettings()
    if not snapshot.valid:
        raise ValueError(f"snapshot of {snapshot.deployment} is not valid: {snapshot.invalid}")
    base = config or EngineConfig()
    fit = calibrate(snapshot, current, spec, profile, base, settings)
    burst = fit.burst
    seed, workload, current_run, model = checked(snapshot, fit, current, spec, profile, base, settings)
    if waits(snapshot) and not model.waiting:  # the what-if counts the requests waiting now
        workload = synthesize(snapshot, settings.max_requests, seed, burst)
        workload = workload.scaled(model.rate_factor) if model.rate_factor != 1.0 else workload
        current_run = predict(workload, current, profile, twin_config(base, spec, workload), spec)
    cfg = twin_config(base, spec, workload)
    runs = {current: current_run}
    runs.update({s: predict(workload, s, profile, cfg, spec)
                 for s in (BASELINE, *enumerate_candidates(stepped(spec, current, settings), settings.orders,
                                                           settings.modes)) if s not in runs})
    screened = marked_long_bound(tuple(runs.values()), settings)
    confirmed = screened
    if settings.confirm_requests:
        longer = synthesize(snapshot, settings.confirm_requests, settings.seed + 1, burst, max_span_s=math.inf)
        longer = longer.scaled(model.rate_factor) if model.rate_factor != 1.0 else longer
        lcfg = twin_config(base, spec, longer)
        confirmed = marked_long_bound(tuple(predict(longer, s, profile, lcfg, spec)
                                  for s in shortlist(screened, current, settings, spec.chunked_prefill_size)),
                            settings)
    point, feasible = choose(confirmed, settings, spec.chunked_prefill_size)
    cur = next(p for p in confirmed if p.setting == current)
    best, again, scored = robust_choice(snapshot, confirmed, cur, point, burst, model, spec, profile, base, settings)
    mix = window_heterogeneity(snapshot, profile, spec.chunked_prefill_size)
    bound = next(p for p in confirmed if p.setting == BASELINE).long_prompt_slowdown_p99
    return Ranking(best, cur, screened, mix, feasible, settings.objective,
                          long_bound(bound, settings), len(workload.requests),
                          reason_line(mix, cur, best, feasible), burst, fit.error, confirmed, again, model, scored)


def waits(snapshot: WorkloadSnapshot) -> bool:
    """Whether the engines' queue mix shows requests waiting now (``twin_workload.with_queued``)."""
    return snapshot.mix_fallback is None and any(m.queued > 0 for m in snapshot.queue_mix)


def eligible(predictions: Sequence[Prediction]) -> list[Prediction]:
    """The pool ``choose`` picks from: the allowed candidates that meet every attainable
    target and the long-prompt bound, else those within the bound, else all allowed."""
    allowed = [p for p in predictions if p.allowed] or list(predictions)
    ok = [p for p in allowed if p.within_long_bound and p.meets_targets]
    return ok or [p for p in allowed if p.within_long_bound] or allowed


def draw_bursts(burst: int, ladder: tuple[int, ...], n: int) -> list[int]:
    """The burst sizes of ``n`` resamples: the fitted one's neighbours on the ladder, above
    then below, alternating outwards (the fit's uncertainty); the fitted size itself where
    the ladder has no more neighbours (another seed still draws other requests)."""
    ladder = ladder or (1,)
    at = ladder.index(burst) if burst in ladder else 0
    out: list[int] = []
    for step in range(1, n + 1):
        offset = (step + 1) // 2 * (1 if step % 2 else -1)
        k = at + offset
        out.append(ladder[k] if 0 <= k < len(ladder) else 2 * burst if k >= len(ladder) else burst)
    return out


def robust_choice(snapshot: WorkloadSnapshot, confirmed: Sequence[Prediction], cur: Prediction, point: Prediction,
                  burst: int, model: modelcheck.ModelCheck, spec: TuningSpec, profile: Profile,
                  config: EngineConfig, settings: RecommenderSettings
                  ) -> tuple[Prediction, float, tuple[robust.Scored[Setting], ...]]:
    """(best, robust gain over the current setting, every resampled candidate scored): the
    rule of ``tune.robust`` over the confirming sample and ``robust_draws`` resamples
    (another seed each, ``draw_bursts``, the calibrated rate), run by the ``robust_top`` best
    of ``eligible`` (by the confirming objective), the point choice and the current setting
    only: the rest of the shortlist lost the confirming run already. The gain is NaN when
    the best is the current setting; with no resamples the point choice stands (gain NaN)."""
    if not settings.robust_draws:
        return point, math.nan, ()
    c = spec.chunked_prefill_size
    pool = eligible(confirmed)
    top = sorted(pool, key=lambda p: (p.objective(settings.objective), preference(p.setting, c)))
    runs = list(dict.fromkeys([p.setting for p in top[: settings.robust_top]] + [point.setting, cur.setting]
                              + [p.setting for p in least_concurrency(pool, cur.setting, c, settings)]))
    by = {p.setting: p for p in confirmed}
    figures = {s: [by[s].objective(settings.objective)] for s in runs}
    for k, size in enumerate(draw_bursts(burst, settings.bursts, settings.robust_draws)):
        draw = synthesize(snapshot, settings.robust_requests, settings.seed + 2 + k, size, max_span_s=math.inf)
        draw = draw.scaled(model.rate_factor) if model.rate_factor != 1.0 else draw
        cfg = twin_config(config, spec, draw)
        for s in runs:
            figures[s].append(predict(draw, s, profile, cfg, spec).objective(settings.objective))
    admitted = {p.setting for p in pool}
    chosen, scored = robust.choose(figures, lambda s: preference(s, c), settings.robust_quantile,
                                   settings.tie_tolerance, eligible=lambda s: s in admitted)
    at = next(x for x in scored if x.candidate == cur.setting)
    again = math.nan if chosen.candidate == cur.setting else robust.gain(chosen, at)
    return by[chosen.candidate], again, tuple(scored)


def least_concurrency(pool: Sequence[Prediction], current: Setting, chunked_prefill_size: int,
                      settings: RecommenderSettings) -> list[Prediction]:
    """The best (by the confirming objective) of ``pool``'s candidates with the least
    concurrency, when that is less than the current setting's; else nothing. It runs on the
    resamples beside the top few, so that the guardrails' step back
    (``guardrails.step_back_to``) judges the way back on the same draws as the current
    setting: on calm traffic a same-concurrency variant often wins the point choice by a
    hair, and then off would have no score to step back on."""
    c = chunked_prefill_size
    fewer = [p for p in pool if concurrency(p.setting, c) < concurrency(current, c)]
    if not fewer:
        return []
    least = min(concurrency(p.setting, c) for p in fewer)
    return [min((p for p in fewer if concurrency(p.setting, c) == least),
                key=lambda p: (p.objective(settings.objective), preference(p.setting, c)))]


def checked(snapshot: WorkloadSnapshot, fit: Fit, current: Setting, spec: TuningSpec, profile: Profile,
            config: EngineConfig, settings: RecommenderSettings
            ) -> tuple[int, Workload, Prediction, modelcheck.ModelCheck]:
    """(seed, workload, current setting's run on it, the check): the model check of
    ``tune.modelcheck`` on the calibrated replay (its p99 as ``window_p99`` counts it).
    When it disagrees, ``model_draws`` other draws of the window at the same burst (and
    each with the requests waiting now, when some wait) are checked too and the closest
    kept; then, still outside the band, its offered load is refitted (at most
    ``model_calibration_runs`` more twin runs)."""
    observed = observed_range(snapshot, settings)
    workload, current_run, waited = fit.workload, fit.run, fit.waiting
    first = replace(modelcheck.check(window_p99(snapshot, fit.result), observed, settings.model_band),
                    waiting=waited)
    seed = settings.seed
    for draw_seed, waiting, draws in other_draws(snapshot, settings, fit.waiting):
        if first.agrees or first.worst is None:
            break
        wl = synthesize(snapshot, settings.max_requests, draw_seed, fit.burst, waiting=waiting)
        run, result = replay(wl, current, profile, twin_config(config, spec, wl), spec)
        got = modelcheck.check(window_p99(snapshot, result), observed, settings.model_band)
        if got.worst is not None and got.worst.error < first.worst.error:
            seed, workload, current_run, waited, first = draw_seed, wl, run, waiting, replace(got, waiting=waiting)
        first = replace(first, draws=draws)
    replays: dict[float, Prediction] = {}  # by the scaled workload's rate_scale

    def rerun(scaled: Workload) -> dict[str, float]:
        run, result = replay(scaled, current, profile, twin_config(config, spec, scaled), spec)
        replays[scaled.rate_scale] = run
        return window_p99(snapshot, result)

    factor, model = modelcheck.calibrated(workload, rerun, first, observed, settings.model_calibration_runs)
    if factor == 1.0:
        return seed, workload, current_run, model
    return seed, workload.scaled(factor), replays[workload.rate_scale * factor], model


def other_draws(snapshot: WorkloadSnapshot, settings: RecommenderSettings,
                waited: bool = False) -> list[tuple[int, bool, int]]:
    """(seed, with the requests waiting now, draws tried so far) of the model check's other
    draws, in the order tried: each other seed with the waiting requests as the fit had
    them (``waited``), then without, when some wait (the fit already tried the first seed
    both ways). Seeds from ``seed + 1000`` on, apart from the confirming and robust
    samples' (``seed + 1``, ``seed + 2`` ...), which must stay independent of the draw the
    check keeps."""
    variants = (waited, not waited) if waits(snapshot) else (False,)
    seeds = [settings.seed + 1000 + k for k in range(max(0, settings.model_draws))]
    pairs = [(s, w) for s in seeds for w in variants]
    return [(s, w, k + 1) for k, (s, w) in enumerate(pairs)]


def observed_range(snapshot: WorkloadSnapshot, settings: RecommenderSettings) -> dict[str, modelcheck.Observed]:
    """``observed_p99`` with each p99's rank range (``modelcheck.rank_range``): what the
    model check sets the replay against."""
    out, p99 = {}, observed_p99(snapshot, settings)
    for t in snapshot.tenants:
        if t.name in p99:
            low, high = modelcheck.rank_range(t.ttft.total)
            out[t.name] = modelcheck.Observed(p99[t.name], t.ttft.quantile(low), t.ttft.quantile(high))
    return out


def observed_p99(snapshot: WorkloadSnapshot, settings: RecommenderSettings) -> dict[str, float]:
    """Per-tenant observed p99 TTFT of the tenants with enough first tokens to have one."""
    return {t.name: t.ttft_p99_s for t in snapshot.tenants
            if t.ttft.total >= settings.calibration_min_samples and t.ttft.finite
            and math.isfinite(t.ttft_p99_s) and t.ttft_p99_s > 0}


def stepped(spec: TuningSpec, current: Setting, settings: RecommenderSettings) -> TuningSpec:
    """The spec's bounds narrowed to one step up from the current setting: concurrency at
    most ``max_step_factor`` times the current (off counts as 1); down is not limited."""
    if not settings.max_step_factor:
        return spec
    cur = concurrency(current, spec.chunked_prefill_size)
    top = max(spec.min_concurrency, min(spec.max_concurrency, int(cur * settings.max_step_factor)))
    return replace(spec, max_concurrency=top)


def long_bound(baseline_long_slowdown: float, settings: RecommenderSettings) -> float:
    """The longest prompts' p99 slowdown a candidate may reach (module doc)."""
    return max(settings.long_prompt_slowdown_max, settings.long_prompt_slowdown_factor * baseline_long_slowdown)


def marked_long_bound(preds: tuple[Prediction, ...], settings: RecommenderSettings) -> tuple[Prediction, ...]:
    """The predictions marked against the long-prompt bound of their own run of off/fcfs."""
    base = next(p for p in preds if p.setting == BASELINE)
    bound = long_bound(base.long_prompt_slowdown_p99, settings)
    return tuple(replace(p, within_long_bound=p.long_prompt_slowdown_p99 <= bound) for p in preds)


def shortlist(screened: Sequence[Prediction], current: Setting, settings: RecommenderSettings,
              chunked_prefill_size: int) -> list[Setting]:
    """What the longer run confirms: the best ``shortlist`` allowed candidates of the screen,
    the current setting, off/fcfs (the bound's reference) and off in every order (the
    settings that hold the least KV, which a short screen flatters least)."""
    allowed = sorted((p for p in screened if p.allowed),
                     key=lambda p: (p.objective(settings.objective), preference(p.setting, chunked_prefill_size)))
    picks = [p.setting for p in allowed[: settings.shortlist]]
    picks += [current, BASELINE]
    picks += [p.setting for p in screened if p.allowed and p.setting.threshold == 0]
    return list(dict.fromkeys(picks))


@dataclass(frozen=True, slots=True)
class Fit:
    """The calibration run kept (``calibrate``): the burst and the replay it fitted best."""

    burst: int
    workload: Workload
    run: Prediction
    """The current setting's figures on ``workload``."""
    error: float
    """``fit_error`` of ``run`` (NaN when no tenant had an observed p99)."""
    waiting: bool
    """The replay counts the requests waiting now."""
    result: engine.SimResult
    """The run itself, for ``window_p99``."""


def calibrate(snapshot: WorkloadSnapshot, current: Setting, spec: TuningSpec, profile: Profile,
              config: EngineConfig, settings: RecommenderSettings) -> Fit:
    """Step 1 of the module doc. When requests wait, the ladder runs twice, without them
    and with them, and the closer fit is kept: a giant still prefilling has no first token,
    yet the requests behind it show its wait, and a fit without it would explain that wait
    with bursts."""
    fits = [ladder(snapshot, current, spec, profile, config, settings, waiting)
            for waiting in ((False, True) if waits(snapshot) else (False,))]
    best = fits[0]
    for fit in fits[1:]:
        if fit.error < best.error:
            best = fit
    return best


def ladder(snapshot: WorkloadSnapshot, current: Setting, spec: TuningSpec, profile: Profile,
           config: EngineConfig, settings: RecommenderSettings, waiting: bool) -> Fit:
    """The burst ladder of ``calibrate`` on one replay of the window (with or without the
    requests waiting now): bursts of 1, 2, 4, ... until the fit stops improving."""
    observed = observed_p99(snapshot, settings)
    best: Fit | None = None
    for burst in settings.bursts or (1,):
        workload = synthesize(snapshot, settings.max_requests, settings.seed, burst, waiting=waiting)
        if not workload.requests:
            raise ValueError(f"snapshot of {snapshot.deployment} has no tenant traffic to replay")
        run, result = replay(workload, current, profile, twin_config(config, spec, workload), spec)
        err = fit_error(run, observed)
        if best is not None and not err < best.error:
            break
        best = Fit(burst, workload, run, err, waiting, result)
        if math.isnan(err):
            break
    assert best is not None
    return best


TAIL_WEIGHT_SCALE = 100
"""A replayed request's weight in ``window_p99`` (an integer, so that the rounded-up tail
can weigh a fraction of one request)."""


def window_p99(snapshot: WorkloadSnapshot, result: engine.SimResult) -> dict[str, float]:
    """Per-tenant p99 TTFT of a replay of the window, as the engines' histograms counted the
    window: over the requests that got a first token in it (``tail_weights``). One giant in
    a minute over two engines is half a giant per engine: the replay holds one, so that the
    candidates meet it, and among a tenant's 50 replayed requests its own prefill would be
    the replay's p99, while the engines saw it as 1 of 100 and their p99 is the requests
    around it; and a giant still waiting has no first token at all. The model check
    compares like with like."""
    lengths = twin_workload.lengths_of(snapshot, waiting=False)
    by_tenant: dict[str, list[engine.Job]] = {}
    for job in result.jobs:
        by_tenant.setdefault(job.req.tenant, []).append(job)
    out = {}
    for name, jobs in by_tenant.items():
        weights = tail_weights(lengths.get(name), jobs)
        out[name] = weighted_percentile([j.first_token_s - j.arrival_s for j in jobs], weights, 99)
    return out


def tail_weights(hist: Histogram | None, jobs: Sequence[engine.Job]) -> list[int]:
    """Each replayed request's weight in ``window_p99``, ``hist`` being the tenant's lengths
    of the window's first tokens: ``TAIL_WEIGHT_SCALE`` each; none for a request longer
    than every first token of the window (it waits now: ``twin_workload.with_queued``);
    less for those in the top non-empty bucket when the replay holds more of them than
    the bucket's share of the requests (``twin_workload.with_tail`` rounded it up)."""
    weights = [TAIL_WEIGHT_SCALE] * len(jobs)
    if hist is None or hist.total <= 0:
        return weights
    filled = [(lo, hi, count) for lo, hi, count in hist.buckets() if count > 0]
    if not filled:
        return weights
    lower, upper, count = filled[-1]
    for k, job in enumerate(jobs):
        if job.uncached > upper:
            weights[k] = 0
    if len(filled) < 2:
        return weights
    tail = [k for k, job in enumerate(jobs) if lower < job.uncached <= upper]
    expected = count / hist.total * sum(1 for w in weights if w)
    if len(tail) > expected:
        for k in tail:
            weights[k] = max(1, round(TAIL_WEIGHT_SCALE * expected / len(tail)))
    return weights


def fit_error(run: Prediction, observed: dict[str, float]) -> float:
    """Mean |log(predicted / observed)| p99 TTFT over the tenants observed; NaN if none."""
    errs = [abs(math.log(max(t.ttft_p99_s, 1e-3) / observed[t.name])) for t in run.tenants if t.name in observed]
    return sum(errs) / len(errs) if errs else math.nan


def window_heterogeneity(snapshot: WorkloadSnapshot, profile: Profile | None, chunked_prefill_size: int) -> float:
    """The heterogeneity of the window's uncached prompt lengths (``tune.heterogeneity``;
    NaN with no traffic): cheap, no twin run, so every step can note it (``TunerState.saw``)."""
    return heterogeneity(snapshot.uncached_tokens or merged_uncached(snapshot), profile, chunked_prefill_size)


def merged_uncached(snapshot: WorkloadSnapshot) -> Histogram | None:
    """The deployment's uncached-token histogram as the sum of its tenants' (same bounds)."""
    hists = [t.uncached_tokens for t in snapshot.tenants if t.uncached_tokens.total > 0]
    if not hists or any(h.bounds != hists[0].bounds for h in hists):
        return hists[0] if hists else None
    return Histogram(hists[0].bounds,
                     tuple(sum(h.counts[i] for h in hists) for i in range(len(hists[0].bounds))),
                     sum(h.total for h in hists), sum(h.sum for h in hists))


def describe(setting: Setting, chunked_prefill_size: int) -> str:
    """``off, order fcfs`` or ``T 2048 (concurrency 4, ceiling, order srpt)``."""
    if not setting.threshold:
        return f"off, order {setting.order}"
    return (f"T {setting.threshold} (concurrency {concurrency(setting, chunked_prefill_size)}, "
            f"{setting.mode}, order {setting.order})")


def reason_line(mix: float, cur: Prediction, best: Prediction, feasible: bool) -> str:
    """One line for status, Events and logs, e.g. ``heterogeneity 0.81, predicted ...``."""
    worst = cur.worst_tenant()
    mixed = "n/a" if math.isnan(mix) else f"{mix:.2f}"
    line = (f"heterogeneity {mixed}, predicted worst-tenant p99 slowdown "
            f"{cur.worst_tenant_slowdown_p99:.1f} -> {best.worst_tenant_slowdown_p99:.1f}")
    if worst is not None:
        after = best.tenant(worst.name)
        if after is not None:
            line += f" ({worst.name} p99 TTFT {worst.ttft_p99_s:.1f} s -> {after.ttft_p99_s:.1f} s)"
    if not feasible:
        missed = [t.name for t in best.tenants if not t.meets_target]
        line += "; no candidate meets every target" + (f" (misses {', '.join(missed)})" if missed else "")
    return line
