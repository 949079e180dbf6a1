"""Guardrails: whether a recommendation may become a step, as one pure function.

Like the VPA updater, ``decide`` re-checks safety at the moment of acting and returns an
explicit decision: ``Move`` (the controller starts a rollout of ``to``), ``Hold`` (stay,
with a machine reason and a human message) or ``Infeasible`` (no allowed candidate meets
the constraints and no step is worth taking; stay, and say so). The checks, in order:

1. a rollout in progress (canary, analysis, promotion or rollback): Hold ``RolloutInProgress``;
2. an invalid snapshot: Hold with the snapshot's own reason (``NoTraffic``, ``StaleMetrics``,
   ``PrometheusUnreachable``, ...) and its detail: fail-static, a failed read never moves;
3. fewer first tokens in the window than ``min_samples`` (on a step a jump of the queue mix
   brought forward, fewer than ``jump_min_samples`` first tokens and requests waiting now):
   Hold ``TooFewSamples``. The window is already the widest the pooling rule allows
   (``tune.pooling``: the interval doubled while it holds too few, never past the last
   change of the fleet's setting nor 16 intervals), so this hold means that even pooled
   evidence is too little;
4. less than ``interval_s`` since the last step: Hold ``Interval`` (one step per interval);
5. less than ``cooldown_s`` since the last step: Hold ``Cooldown``; except (for 4 and 5) on
   a step the queue mix brought forward (``TunerState.mix_jumped``: larger prompts arrived,
   or the mix moved far), which runs the twin and may move then only to a setting that
   caps each prefill harder with a large predicted gain (``jump_gain`` on both samples,
   ``Ranking.sure_gain``): errors cost unequal amounts, and giants that arrive a minute
   after a step would otherwise be served uncapped for the rest of the cooldown;
6. the twin's replay of the window under the running setting disagrees with what the
   engines reported, even after its offered load was refitted (``Ranking.model``,
   ``tune.modelcheck``): Hold ``ModelMismatch``, naming the worst tenant's predicted and
   observed p99 TTFT: a comparison of candidates on a model that does not explain the
   present is a guess;
6b. the best candidate is outside the spec's bounds: Hold ``OutOfBounds`` (cannot happen
   with ``recommend``'s candidates; re-checked because the spec may have changed);
7. the best differs from the current setting and its predicted gain clears the margin
   (relative ``min_gain`` and absolute ``min_gain_abs``, both from the recommender's
   confirming run: ``Ranking.gain``; and ``noise_factor`` times the spread between
   the screening and confirming samples' gains, ``Ranking.gain_spread``: a gain the
   two samples disagree on by more than itself is noise), and the best is not a setting
   left less than ``dwell_cooldowns`` cooldowns ago (``TunerState.left``; else Hold
   ``Dwell``: A -> B -> A within a few cooldowns is flapping): Move, with the recommendation's
   one-line reason. This holds even when no candidate meets every target: the best effort
   still serves the tenants better, and the reason says which targets it misses. Also a
   Move, when no move by gain is made: the *step back* (``step_back_to``). On a
   near-uniform mix (heterogeneity at most ``step_back_max_heterogeneity``) a setting with
   less concurrency than the current one that predicts as well (within
   ``step_back_tolerance``): the best itself, on the confirming sample, or else the least
   concurrent of the candidates the resamples scored, on its robust score against the
   current's. Uniform traffic returns to off even when another mode or order at the
   current concurrency wins the point choice by a hair;
7b. a Move by gain that is not also a step back (which rests on the mix, not on a gain:
   a larger predicted gain must not make it less likely) whose gain does not hold across
   independent resamples (other seeds,
   the neighbouring burst sizes: ``Ranking.resample_gain``, the robust gain of
   ``tune.robust``, below ``min_gain``): Hold ``NotOnResample``: the screen and the
   confirmation share the snapshot's synthesis and burst, so a bias they share would pass
   both, and a gain on one draw that the current setting wins back on another is noise
   (when another candidate is a step back, that gain is set aside and the step back made);
7c. a Move by gain to a harder cap that predicts no tenant a lower p99 TTFT than the
   current setting (``ttft_gain``): Hold ``NoTTFTGain``. The gain is judged on the objective (the worst
   tenant's p99 slowdown by default), which a cap can improve while every tenant's TTFT,
   what users are judged by, stays or gets worse (a trial moved "slowdown 70.5 -> 7.5
   (chat p99 TTFT 9.4 s -> 10.4 s)", skipped its canary as a harder cap, and the p99 rose
   from 10 s to 35 s): such a move is not a move, and so never skips a canary;
8. no allowed candidate meets the targets and the long-prompt bound: ``Infeasible`` (the
   user's targets are out of reach of any setting; status says so);
9. the best is the current setting: Hold ``AtBest``;
10. otherwise the gain is below the margin: Hold ``BelowMargin`` (hysteresis: noisy
    windows do not flap).

A step the queue mix brought forward moves only to a setting that caps harder, or, on
a reflex, to srpt from another order at the same T (``shields``: the reflex caps within
the pass already, and srpt is the order that lets short requests past the long ones in a
capped pass; under fcfs a second giant is admitted before the short ones behind it):
anything else (another order or mode alone, less concurrency) is held ``JumpNotHarder``
until the timer's step. Its window is the short one since the jump, and a change of order on it
would start a canary that keeps the fleet uncapped for an analysis window while the
giants that brought the step queue behind each other. For the same reason its twin run
ranks the ceiling mode only (``tune.tuner.JUMP_MODES``), and, from one prefill at a time,
only the caps (``tune.tuner.ranked_spec``): the best of what it may do, not a best it may
not.

A move by gain that keeps the concurrency (another order or mode alone) is held
``WorseP99TTFT`` when it predicts a worse worst-tenant p99 TTFT (beyond
``step_back_tolerance``): the objective is slowdown, fair to short and long prompts, and
reordering uniform documents (srpt first) lowers the short ones' slowdown by making the
long ones wait, which users read as a worse p99 TTFT for nothing a cap would fix.

The step back to less concurrency on near-uniform traffic is not held by the dwell: it
answers a change of mix, not a noisy ranking. Every move to less concurrency (by gain or by
the step back), and every move of a reflex from srpt to another order (``shields``), is
held ``Calm`` until the traffic has been near-uniform for
``calm_cooldowns`` cooldowns (``TunerState.mixed_at``, the last window that was not, this
one included): one quiet window among random giant prompts (a Poisson stream of one a
minute leaves over a third of the minutes without one) is not the end of them, and lifting a
cap too early costs the next giant's whole queue, while keeping it a little long costs
uniform traffic a fraction of its TTFT.

Steps 1-5 need no twin run: ``gate`` returns their Hold (or None) so a controller can skip
the recommendation's cost when nothing could move anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from slipstream.api.snapshot import TOO_FEW_SAMPLES, WorkloadSnapshot
from slipstream.sim.policies import Setting
from slipstream.tune import mixjump, pooling, robust
from slipstream.tune.candidates import TuningSpec, concurrency, preference
from slipstream.tune.modelcheck import MODEL_MISMATCH
from slipstream.tune.recommend import Prediction, Ranking, describe, reason_line

ROLLOUT_IN_PROGRESS = "RolloutInProgress"
INTERVAL = "Interval"
COOLDOWN = "Cooldown"
OUT_OF_BOUNDS = "OutOfBounds"
AT_BEST = "AtBest"
BELOW_MARGIN = "BelowMargin"
DWELL = "Dwell"
NOT_ON_RESAMPLE = "NotOnResample"
CALM = "Calm"
WORSE_TTFT = "WorseP99TTFT"
NO_TTFT_GAIN = "NoTTFTGain"
JUMP_NOT_HARDER = "JumpNotHarder"


@dataclass(frozen=True, slots=True)
class GuardrailSettings:
    """When a recommendation may become a step; every field with its unit and why."""

    min_samples: int = 50
    """First tokens in the window (count), all tenants. Below ~50 a p99 is the maximum of a
    handful of requests and one slow request would decide the setting."""
    min_gain: float = 0.2
    """Least relative predicted improvement of the objective (fraction of the current
    figure). Consecutive windows of the same traffic differ by ~10% in the twin's
    prediction; twice that keeps noise from moving the setting back and forth."""
    min_gain_abs: float = 0.5
    """Least absolute predicted improvement (slowdown units, or seconds for the TTFT
    objective): 20% of a slowdown of 1.5 is not worth a rollout."""
    step_back_tolerance: float = 0.05
    """Relative band (fraction) within which a setting with less concurrency counts as
    predicting as well as the current one: the tuner then steps back to
    it without a gain, so uniform traffic returns to off. Same band as the recommender's
    ties; far below ``min_gain``, so stepping back and forth needs a real change of mix."""
    step_back_max_heterogeneity: float = 0.1
    """Step back without a gain only when the mix is near-uniform (heterogeneity at most
    this, dimensionless). A calm window of a mixed workload predicts the plainer settings
    as good until the next long prompt arrives, and a step back then costs the worst
    tenant when it comes (windows of builtin:multi-tenant read as low as 0.14)."""
    cooldown_s: float = 600.0
    """Least time between two steps, seconds (``spec.tuning.cooldownSeconds``): a step's
    effect must show in the metrics window before the next is judged."""
    interval_s: float = 60.0
    """The control interval, seconds (``spec.tuning.intervalSeconds``): at most one step per
    interval even with no cooldown."""
    noise_factor: float = 1.0
    """A Move by gain needs the gain to be at least this many times the spread between the
    screening and confirming samples' gains (dimensionless; 0 turns it off). The screen runs
    one window from an empty engine, the confirmation a longer independent sample; where
    they disagree by more than the gain itself the ranking is noise (on the Mooncake + Azure
    traces the screen predicted gains of tens of percent the confirmation did not see)."""
    dwell_cooldowns: float = 3.0
    """No Move by gain back to a setting left less than this many cooldowns ago
    (dimensionless; 0 turns it off): users judge a tuner by never flapping, and a return
    within a few cooldowns means one of the two steps was noise."""
    calm_cooldowns: float = 1.0
    """A move to less concurrency waits until the traffic has been near-uniform
    (heterogeneity at most ``step_back_max_heterogeneity``) for this many cooldowns
    (dimensionless; 0 turns it off). At one 180 s cooldown, a Poisson stream of a giant a
    minute leaves three windows in a row without one 5% of the time (e^-3); reasoned, not
    fitted."""
    jump_min_samples: int = int(mixjump.MIN_REQUESTS)
    """``min_samples`` of a step a jump brought forward (count of first tokens plus requests
    waiting now, ``tune.pooling.evidence``): it judges the traffic since the jump
    (``tune.mixjump.WINDOW_POLLS``, half the default interval's window, widened up to the
    interval when that holds too few), and an engine busy with the giant that caused the
    jump gives no first token meanwhile. The question there is whether giants came, not a
    fine p99, and the queue composition answers it: the floor is the watch's own
    (``mixjump.MIN_REQUESTS``), so a jump the watch could fire on is never held for samples
    on the window it fired on."""
    jump_gain: float = 0.5
    """Least predicted gain (both samples: ``Ranking.sure_gain``) with which a step brought
    forward by a jump of the queue mix may cap harder during the cooldown (the canary's
    risk rule uses the same 50%, ``rollout.machine.SKIP_GAIN``)."""

    def __post_init__(self) -> None:
        if self.min_samples < 1 or min(self.min_gain, self.min_gain_abs, self.step_back_tolerance,
                                       self.step_back_max_heterogeneity) < 0:
            raise ValueError("min_samples must be >= 1 and the gain margins >= 0")
        if self.noise_factor < 0 or self.dwell_cooldowns < 0 or self.calm_cooldowns < 0 or self.jump_gain < 0:
            raise ValueError("noise_factor, dwell_cooldowns, calm_cooldowns and jump_gain must be >= 0")
        if self.cooldown_s < 0 or self.interval_s <= 0:
            raise ValueError("cooldown_s must be >= 0 and interval_s > 0")


@dataclass(frozen=True, slots=True)
class TunerState:
    """What the controller remembers between intervals (kept in the CR status)."""

    current: Setting
    """What the engines run (read back from their gauges)."""
    last_step_at: float | None = None
    """When the last step was decided (seconds on the injected clock), None if never."""
    rollout_in_progress: bool = False
    left: tuple[tuple[Setting, float], ...] = ()
    """Settings stepped away from and when (seconds on the same clock), oldest first: the
    dwell's memory (``stepped``). Empty when the controller keeps none (no dwell)."""
    mixed_at: float | None = None
    """When a window last was not near-uniform (heterogeneity above
    ``step_back_max_heterogeneity``; ``saw``): the calm's memory. None: never seen."""
    mix_jumped: bool = False
    """This step was brought forward by a jump of the queue mix (``tune.mixjump``)."""
    overloaded: str = ""
    """Why the fleet is overloaded (``tune.overload``); "" when it is not. The step then
    takes the setting with the most prefill throughput (``throughput_setting``), not the
    best p99 prediction, which a backlog makes meaningless."""

    def stepped(self, to: Setting, now: float, keep_s: float = float("inf")) -> TunerState:
        """The state after a step to ``to`` at ``now``: the current setting joins ``left``,
        entries older than ``keep_s`` drop out."""
        left = tuple((s, at) for s, at in self.left if now - at < keep_s) + ((self.current, now),)
        return TunerState(to, now, False, left, self.mixed_at, overloaded=self.overloaded)

    def saw(self, heterogeneity: float, now: float, settings: GuardrailSettings) -> TunerState:
        """After judging a window of this heterogeneity at ``now``: ``mixed_at`` moves to
        ``now`` when it was not near-uniform (NaN, no traffic, changes nothing)."""
        if heterogeneity > settings.step_back_max_heterogeneity:
            return replace(self, mixed_at=now)
        return self

    def left_within(self, setting: Setting, now: float, span_s: float) -> float | None:
        """When ``setting`` was last left, if less than ``span_s`` before ``now``; else None."""
        times = [at for s, at in self.left if s == setting and now - at < span_s]
        return max(times) if times else None


@dataclass(frozen=True, slots=True)
class Move:
    """Roll ``to`` out: the predicted gain clears the margin and nothing forbids a step."""

    from_: Setting
    to: Setting
    reason: str
    recommendation: Ranking | None
    """The twin's ranking; None on a move an overload made (``under_overload``: no twin run)."""
    kind: str = "Move"


@dataclass(frozen=True, slots=True)
class Hold:
    """Stay: ``reason`` is a condition-style word, ``message`` the human sentence."""

    reason: str
    message: str
    recommendation: Ranking | None = None
    kind: str = "Hold"


@dataclass(frozen=True, slots=True)
class Infeasible:
    """Stay: no allowed candidate meets the targets and the long-prompt bound, and none
    improves on the current setting by the margin either."""

    message: str
    recommendation: Ranking
    reason: str = "Infeasible"
    kind: str = "Infeasible"


Decision = Move | Hold | Infeasible


def other_way(decision: Decision, chunked_prefill_size: int) -> bool:
    """Whether a step the queue mix brought forward found the jump going the other way: it
    held ``JumpNotHarder`` and its best runs fewer prefills at once than the current setting
    (the giants are gone: a looser cap, which only the timer's step may make, after the
    calm). No later look at the same jump would move, so it is not retried
    (``tune.mixjump.MixWatch.stepped``)."""
    rec = decision.recommendation
    return (isinstance(decision, Hold) and decision.reason == JUMP_NOT_HARDER and rec is not None
            and concurrency(rec.best.setting, chunked_prefill_size)
            < concurrency(rec.current.setting, chunked_prefill_size))


def settles(decision: Decision, chunked_prefill_size: int) -> bool:
    """Whether a step settles a queue-mix jump its window shows: it moved, or found the jump
    going the other way (``other_way``); otherwise the jump is retried
    (``tune.mixjump.MixWatch.stepped``'s ``settled``)."""
    return isinstance(decision, Move) or other_way(decision, chunked_prefill_size)


def gate(snapshot: WorkloadSnapshot, state: TunerState, settings: GuardrailSettings,
         now: float) -> Hold | None:
    """Checks 1-5 of the module doc: the Hold that applies before any twin run, or None."""
    if state.rollout_in_progress:
        return Hold(ROLLOUT_IN_PROGRESS, "a rollout is in progress: no new step until it ends")
    if not snapshot.valid:
        assert snapshot.invalid is not None
        return Hold(snapshot.invalid, snapshot.detail or f"metrics not usable: {snapshot.invalid}")
    need = min(settings.min_samples, settings.jump_min_samples) if state.mix_jumped else settings.min_samples
    if (have := pooling.evidence(snapshot, state.mix_jumped)) < need:
        what = "first tokens and requests waiting" if state.mix_jumped else "first tokens"
        return Hold(TOO_FEW_SAMPLES, f"{have:.0f} {what} in the {snapshot.window_s:.0f} s window (the widest "
                    f"the pooling rule allows), fewer than the {need} needed")
    if state.last_step_at is not None:
        since = now - state.last_step_at
        if since < settings.interval_s and not state.mix_jumped:
            return Hold(INTERVAL, f"last step {since:.0f} s ago: one step per {settings.interval_s:.0f} s interval")
        if since < settings.cooldown_s and not state.mix_jumped:
            return Hold(COOLDOWN, f"last step {since:.0f} s ago, cooldown {settings.cooldown_s:.0f} s")
    return None


OVERLOADED = "Overloaded"
"""The Hold's reason while the fleet is overloaded (`tune.overload`), and the condition
type, its reason and the Warning Event's (`controller.tuning`): True names the growing
backlog and that more replicas are needed (modes that observe only too)."""


def shields(to: Setting, current: Setting) -> bool:
    """Whether ``to`` is a reflex at ``current``'s T in srpt where ``current`` is the same
    reflex in another order: a step a queue-mix jump may take as it takes a harder cap
    (module doc). On a randomized workload (``random:9``, twin) a reflex left in fcfs by a
    calm chat phase served the giants after it at 15.4 s worst-tenant p99 TTFT for the
    three intervals a timer step took to put srpt back, against srpt's 1.4 s with this
    rule. The reverse step (``shields(current, to)``) is a loosening: it waits for calm
    traffic as a step to fewer prefills at once does (``Calm``, module doc)."""
    return (to.mode == current.mode == "reflex" and to.threshold == current.threshold
            and to.order == "srpt" != current.order)


def throughput_setting(current: Setting, spec: TuningSpec) -> Setting | None:
    """The setting with the most prefill throughput from ``current``: one that leaves no
    pass budget idle. Stock (one prefill at a time, the whole budget), a floor (idle budget
    handed to the partial prefills) and a reflex (uncapped without short requests; a capped
    round that refuses a new request hands its idle budget to the partials, and a queue
    that grows is one the engine refuses: sim/admission.py, reflex step 3) leave none:
    None, stay. A ceiling cap does, when fewer than C // T prefills are partial: its floor
    at the same T and order (same concurrency, so no other risk), else stock in the same
    order, when the spec allows it; else None."""
    if concurrency(current, spec.chunked_prefill_size) == 1 or current.mode in ("floor", "reflex"):
        return None
    options = [Setting(current.threshold, "floor", current.order)] if "floor" in spec.modes else []
    options.append(Setting(0, current.mode, current.order))
    return next((s for s in options if spec.allows(s)), None)


def under_overload(state: TunerState, spec: TuningSpec) -> Decision:
    """The decision of a step on an overloaded fleet (after the gate): Move to the setting
    with the most prefill throughput, or Hold ``Overloaded`` when the fleet runs it already."""
    c = spec.chunked_prefill_size
    to = throughput_setting(state.current, spec)
    if to is None:
        idle = concurrency(state.current, c) > 1 and state.current.mode not in ("floor", "reflex")
        why = "the spec allows no setting that leaves less budget idle" if idle else "already leaves no prefill budget idle"
        return Hold(OVERLOADED, f"{state.overloaded}; {describe(state.current, c)} stays: {why}")
    return Move(state.current, to, f"overloaded: {state.overloaded}; {describe(to, c)} leaves no prefill budget "
                "idle (the most prefill throughput), where the p99 prediction a backlog makes meaningless would "
                "rank another", None)  # fmt: skip


def cooling(state: TunerState, settings: GuardrailSettings, now: float) -> bool:
    """Whether the last step is less than a cooldown (or an interval) ago."""
    wait = max(settings.cooldown_s, settings.interval_s)
    return state.last_step_at is not None and now - state.last_step_at < wait


def decide(snapshot: WorkloadSnapshot, recommendation: Ranking | None, state: TunerState,
           spec: TuningSpec, settings: GuardrailSettings, now: float) -> Decision:
    """The decision for this interval (module doc); ``recommendation`` may be None only when
    ``gate`` holds (the caller skipped the twin)."""
    held = gate(snapshot, state, settings, now)
    if held is not None:
        return Hold(held.reason, held.message, recommendation)
    if recommendation is None:
        raise ValueError("decide needs a recommendation when no guardrail holds")
    rec = recommendation
    if rec.model is not None and not rec.model.agrees:
        return Hold(MODEL_MISMATCH, f"the twin does not explain the window: {rec.model.describe()}", rec)
    c = spec.chunked_prefill_size
    best = rec.best.setting
    if not spec.allows(best):
        return Hold(OUT_OF_BOUNDS, f"{describe(best, c)} is outside the spec's bounds", rec)
    cur = rec.current.objective(rec.objective)
    new = rec.best.objective(rec.objective)
    spread = rec.gain_spread
    margin = max(settings.min_gain, settings.noise_factor * spread)
    dwell_s = settings.dwell_cooldowns * settings.cooldown_s
    left_at = state.left_within(best, now, dwell_s)
    by_gain = best != state.current and rec.gain_abs >= settings.min_gain_abs and rec.gain >= margin
    fewer = concurrency(best, c) < concurrency(state.current, c)
    harder = concurrency(best, c) > concurrency(state.current, c)
    jump_ok = harder or shields(best, state.current)
    back = None if state.mix_jumped else step_back_to(rec, state.current, c, settings)
    step_back = back is not None and back.setting == best
    if by_gain and not step_back and math.isfinite(rec.resample_gain) and rec.resample_gain < settings.min_gain:
        if back is None:
            return Hold(NOT_ON_RESAMPLE, f"predicted gain {rec.gain:.0%} of {describe(best, c)} is "
                        f"{rec.resample_gain:.0%} across independent resamples (below {settings.min_gain:.0%}): "
                        f"{rec.reason}", rec)  # fmt: skip
        by_gain = False  # not a gain: the step back below judges the move
    ttft_now, ttft_best = rec.current.worst_tenant_ttft_p99_s, rec.best.worst_tenant_ttft_p99_s
    if by_gain and harder and not ttft_gain(rec):
        # Check 7c: a harder cap is a cost every tenant pays; it must buy some tenant p99 TTFT.
        return Hold(NO_TTFT_GAIN, f"{describe(best, c)} caps harder than {describe(state.current, c)} but "
                    f"predicts no tenant a better p99 TTFT: {rec.reason}", rec)  # fmt: skip
    if cooling(state, settings, now):  # only a step the mix brought forward gets here
        if by_gain and left_at is None and jump_ok and rec.sure_gain >= settings.jump_gain:
            return Move(state.current, best, f"{rec.reason}; the queue mix jumped, so it does not wait out "
                        "the cooldown", rec)  # fmt: skip
        since = now - state.last_step_at if state.last_step_at is not None else 0.0
        return Hold(COOLDOWN, f"last step {since:.0f} s ago, cooldown {settings.cooldown_s:.0f} s: the queue "
                    f"mix jumped, but only a harder cap with a predicted gain of at least "
                    f"{settings.jump_gain:.0%} skips it ({rec.reason})", rec)  # fmt: skip
    if state.mix_jumped and best != state.current and not jump_ok:
        return Hold(JUMP_NOT_HARDER, f"{describe(best, c)} does not cap harder than {describe(state.current, c)}: "
                    "a step the queue mix brought forward moves only to a harder cap, and anything else waits "
                    f"for the timer's step: {rec.reason}", rec)  # fmt: skip
    same_cap = best != state.current and concurrency(best, c) == concurrency(state.current, c)
    worse = by_gain and same_cap and ttft_best > ttft_now * (1 + settings.step_back_tolerance)
    by_gain_now = by_gain and left_at is None and not worse
    # Leaving a reflex's srpt is loosening too: the order is the reflex's shield (``shields``).
    unshield = shields(state.current, best)
    loosen = best if (fewer or unshield) and by_gain else back.setting if back is not None and not by_gain_now else None
    if loosen is not None:
        mixed = now if rec.heterogeneity > settings.step_back_max_heterogeneity else state.mixed_at
        calm_s = settings.calm_cooldowns * settings.cooldown_s
        if mixed is not None and now - mixed < calm_s:
            what = "would leave srpt, the order that lets short requests past long ones," if unshield and \
                loosen == best else "would run fewer prefills at once,"
            return Hold(CALM, f"{describe(loosen, c)} {what} but the traffic was "
                        f"heterogeneous {now - mixed:.0f} s ago: a cap is loosened only after {calm_s:.0f} s of "
                        f"near-uniform traffic: {rec.reason}", rec)  # fmt: skip
    if by_gain_now:
        return Move(state.current, best, rec.reason, rec)
    if back is not None:
        return stepping_back(rec, back, state.current, c)
    if worse:
        return Hold(WORSE_TTFT, f"{describe(best, c)} changes only the order or mode and predicts a worse "
                    f"worst-tenant p99 TTFT ({ttft_now:.2f} s -> {ttft_best:.2f} s): {rec.reason}", rec)  # fmt: skip
    if by_gain and left_at is not None:
        return Hold(DWELL, f"{describe(best, c)} was left {now - left_at:.0f} s ago: no return within "
                    f"{dwell_s:.0f} s ({settings.dwell_cooldowns:g} cooldowns): {rec.reason}", rec)
    if not rec.feasible:
        return Infeasible(f"no setting within concurrency {spec.min_concurrency}-{spec.max_concurrency} "
                          f"meets every target and the long-prompt bound: {rec.reason}", rec)
    if best == state.current:
        return Hold(AT_BEST, f"{describe(best, c)} is already the best: {rec.reason}", rec)
    return Hold(BELOW_MARGIN, f"predicted gain {rec.gain:.0%} ({cur:.2f} -> {new:.2f}) is below the "
                f"margin ({margin:.0%}: {settings.min_gain:.0%}, or {settings.noise_factor:g} x the samples' "
                f"spread {spread:.0%}; and {settings.min_gain_abs:g}): {rec.reason}", rec)


def ttft_gain(rec: Ranking) -> bool:
    """Whether the best candidate predicts some tenant a lower p99 TTFT than the current
    setting does (check 7c): by more than a TTFT bucket's rounding, 1%."""
    now = {t.name: t.ttft_p99_s for t in rec.current.tenants}
    return any(t.ttft_p99_s < 0.99 * now[t.name] for t in rec.best.tenants if t.name in now)


def step_back_to(rec: Ranking, current: Setting, chunked_prefill_size: int,
                 settings: GuardrailSettings) -> Prediction | None:
    """The setting with less concurrency that predicts as well as the current one, on a
    near-uniform mix (heterogeneity at most ``step_back_max_heterogeneity``); None if none.

    The best itself when it has less concurrency and its confirming figure is within
    ``step_back_tolerance`` of the current's. Otherwise, of the candidates the resamples
    scored (``Ranking.regrets``; the recommender runs the least-concurrency one there,
    ``recommend.least_concurrency``) the least concurrent (``candidates.preference``) that
    is allowed, within the long-prompt bound, and whose robust score is within the
    tolerance of the current's. Why the second: on calm traffic every candidate predicts
    about the same, and a variant with the current's concurrency (another mode or order)
    often wins the point choice by a percent or two; the way back to off would then not
    count as a step back, and the fleet would keep a cap the traffic no longer needs for
    as long as those near-ties last. Scores are worst-draw regrets, so "within the
    tolerance of the current's" reads every draw, not only the one sample the point
    figure comes from, whose noise alone can put off several percent behind."""
    c = chunked_prefill_size
    if not rec.heterogeneity <= settings.step_back_max_heterogeneity:
        return None
    tol = 1 + settings.step_back_tolerance
    cur_c = concurrency(current, c)
    best = rec.best
    if best.setting != current and concurrency(best.setting, c) < cur_c \
            and best.objective(rec.objective) <= rec.current.objective(rec.objective) * tol:
        return best
    scores = {s.candidate: s.score for s in rec.regrets}
    at = scores.get(current, math.nan)
    if math.isnan(at):
        return None
    by = {p.setting: p for p in rec.confirmed}
    options = [p for s, score in scores.items() if (p := by.get(s)) is not None
               and concurrency(s, c) < cur_c and p.allowed and p.within_long_bound and score <= at * tol]
    return min(options, key=lambda p: preference(p.setting, c)) if options else None


def stepping_back(rec: Ranking, back: Prediction, current: Setting, chunked_prefill_size: int) -> Move:
    """The Move of a step back to ``back``: when it is not the recommendation's best, the
    recommendation is restated with ``back`` as its best (gain, reason and the robust gain
    about ``back``), so status, Events and the canary's risk rule read what is rolled out."""
    if back.setting != rec.best.setting:
        scores = {s.candidate: s for s in rec.regrets}
        again = robust.gain(scores[back.setting], scores[current]) \
            if back.setting in scores and current in scores else math.nan
        rec = replace(rec, best=back, resample_gain=again,
                      reason=reason_line(rec.heterogeneity, rec.current, back, rec.feasible))
    return Move(current, back.setting, f"{rec.reason}; less concurrency predicts as well", rec)
