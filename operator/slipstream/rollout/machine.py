"""The rollout state machine: canary -> analysis -> promote | roll back, as one pure function.

`advance(state, fleet, target, pods, policy, now, analysis)` looks at what every engine pod
reports it runs and returns an explicit `RolloutDecision` (the VPA updater's style): which pods to
set to which setting through their admin API, what the ConfigMap (the setting new pods start
with) must hold, the setting the fleet runs, the rollout state to persist in the CR status,
and the Events to record. It does no I/O and takes the clock as an argument, so every
transition is a unit test on plain data and a restarted operator resumes from the persisted
state alone.

The rollout, step by step:

1. Idle. When the target differs from the fleet's setting, start a rollout. With a canary
   (mode Auto) the first `canary_replicas` pods that run the fleet's setting become
   canaries (phase Canary); without one (a user's Fixed edit, Off) go straight to Promoting.
   An Auto candidate skips its canary only by the risk rule `skip_canary` (a large predicted
   gain, not rolled back since, and proven on this deployment or capping harder than the
   fleet): straight to Promoting, with a CanarySkipped Event that says why.
   A candidate that was rolled back is not tried again before `retry_after_s`. While Idle,
   any pod that reports another setting than the fleet's (a pod started from a stale
   ConfigMap, an engine restarted, a hand edit) is set back to the fleet's setting.
2. Canary. Set the candidate on the canaries. When all of them report it, phase Analysis
   starts its clock. A canary that keeps failing (`max_attempts` rounds of admin calls) or
   that goes away rolls the rollout back.
3. Analysis. After `analysis_window_s`, compare the canaries' per-tenant p99 TTFT with the
   baseline pods' (`analysis.compare`): any tenant worse by more than
   `max_regression_percent`, or no figures to judge by, rolls back; otherwise promote. A
   sequential verdict may be undecided: the analysis then goes on, step by step, until
   `analysis_limit_factor` windows (plus any scrape gap in it, up to as much again), where
   an undecided verdict rolls back. A target that
   changed meanwhile rolls back too (the next rollout starts from the fleet).
   A queue-mix jump during phases Canary or Analysis voids a canary that does not cap
   harder than the fleet (`voidable`): its candidate was chosen for the mix before the
   jump, and the fleet would serve the new mix on the old setting for the rest of the
   window (a Normal CanaryVoided Event, not a failed analysis). The voiding step's target
   is the tuner's judgement of the new mix: one that may skip its canary (a harder cap)
   goes to every pod at once, in the same step; otherwise the canary pods go back and the
   next step decides.
4. Promoting. The ConfigMap takes the candidate first (a pod starting now gets it), then
   every pod is set to it. When every pod reports it, the candidate is the fleet's setting
   (phase Idle, result Promoted). A pod that keeps failing rolls the whole fleet back.
5. RollingBack. The ConfigMap returns to the baseline and every pod not on it is set back.
   When all report the baseline: Idle, result RolledBack. Pods that cannot be reached are
   retried every step; nothing else can be done without a restart, which is never done.

"Reports" always means read back from the engine (`/get_server_info`), never what was
asked: a pod whose read failed counts as not on any setting.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from slipstream.api import models
from slipstream.api.models import EngineSetting
from slipstream.rollout import analysis as analysis_

Action = Literal[
    "Hold", "Correct", "StartCanary", "ApplyCanary", "StartAnalysis", "Analyse", "Promote",
    "Promoted", "RollBack", "RolledBack",
]  # fmt: skip


@dataclass(frozen=True)
class Pod:
    """One ready engine pod, as read back this step."""

    name: str
    setting: EngineSetting | None
    """What it reports it runs; None when the read failed."""
    error: str = ""
    """Why the read failed, or why the last change of this pod failed (for messages)."""
    version: str = ""
    """The SGLang version it reports (``version`` in /get_server_info); "" if none."""
    kv_pool_tokens: int | None = None
    """Its KV pool in tokens (``max_total_num_tokens`` in /get_server_info); None when the
    read failed or the answer held no usable value (``kv_pool_problem`` says which)."""
    kv_pool_problem: str = ""
    """Why an answered read gave no pool ("" when it gave one, or the read failed)."""


@dataclass(frozen=True)
class RolloutTarget:
    """The setting the fleet should run, and why (the tuner's reason or "spec")."""

    setting: EngineSetting
    reason: str
    canary: bool
    """Roll out through canaries and analysis (Auto); False applies it to every pod at once
    (a user's own Fixed edit, Off: the user asked for exactly this)."""
    gain: float = 0.0
    """The tuner's predicted relative gain (0.5: the worst tenant's objective halves), the
    lesser of its confirming run's and its independent resample's; 0 when not predicted."""
    proven: tuple[EngineSetting, ...] = ()
    """Settings this deployment's whole fleet ran until a promotion left them
    (status.leftSettings): the risk rule's record of what is proven here."""


@dataclass(frozen=True)
class RolloutPolicy:
    canary_replicas: int = 1
    """Pods that try a candidate first (spec.tuning.rollout.canaryReplicas)."""
    analysis_window_s: float = 300.0
    """Seconds canaries and baseline are compared (spec.tuning.rollout.analysisWindowSeconds)."""
    max_regression_percent: float = 5.0
    """Largest p99 TTFT regression any tenant may show on the canaries (spec)."""
    analysis_limit_factor: float = 3.0
    """An undecided (sequential) verdict keeps the analysis going up to this many analysis
    windows; at the limit the rule must decide (`analysis_final`)."""
    max_attempts: int = 3
    """Rounds of admin calls per phase before giving up: an engine that refuses three times
    (5xx, timeout, connection refused) is not going to take the setting; roll back."""
    retry_after_s: float = 600.0
    """Least seconds before a rolled-back candidate is tried again (the tuner's cooldown)."""
    chunked_prefill_size: int = 8192
    """C, to word Events in concurrency (C // T) as well as T."""


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class RolloutDecision:
    action: Action
    state: models.RolloutStatus
    """The rollout state to persist in status.rollout."""
    fleet: EngineSetting
    """The setting the fleet runs after this step (status.threshold, mode, schedulePolicy)."""
    configmap: EngineSetting
    """The setting a newly started pod must get (the ConfigMap's data)."""
    apply: dict[str, EngineSetting] = field(default_factory=dict)
    """Pod name -> setting to set now through its admin API."""
    events: tuple[Event, ...] = ()
    message: str = ""

    @property
    def in_flight(self) -> bool:
        return self.state.phase != "Idle"


# -- time as it is kept in status ---------------------------------------------------------


def stamp(t: float) -> str:
    """Unix seconds -> the RFC 3339 timestamp status keeps (second precision)."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def finished(state: models.RolloutStatus, result: Literal["Promoted", "RolledBack"], now: float) -> models.RolloutStatus:
    """``state`` as a rollout that ended at ``now`` with ``result``: phase Idle, no canaries.
    The tuner's cooldown runs from ``finishedAt`` (`tune.deployment.last_step_at`)."""
    return state.model_copy(update={"phase": "Idle", "result": result, "finished_at": stamp(now), "canary_pods": [],
                                    "attempts": 0})  # fmt: skip


# -- wording ---------------------------------------------------------------------------------


def describe_change(before: EngineSetting, after: EngineSetting, c: int) -> str:
    """`4096 -> 2048 (concurrency 2 -> 4, order srpt)`: what an Event says first."""
    conc = models.prefills_at_once
    if before.schedule_policy != after.schedule_policy:
        order = f"order {before.schedule_policy} -> {after.schedule_policy}"
    else:
        order = f"order {after.schedule_policy}"
    mode = [f"mode {before.mode} -> {after.mode}"] if before.mode != after.mode else []
    if before.threshold == after.threshold:  # only the order or the mode moves
        return f"threshold {after.threshold} (concurrency {conc(c, after.threshold)}): " + ", ".join([order, *mode])
    parts = [f"concurrency {conc(c, before.threshold)} -> {conc(c, after.threshold)}", order, *mode]
    return f"{before.threshold} -> {after.threshold} ({', '.join(parts)})"


def show(setting: EngineSetting) -> str:
    return f"threshold={setting.threshold} mode={setting.mode} schedulePolicy={setting.schedule_policy}"


def explain(pod: Pod) -> str:
    """What is wrong with a pod that is not on the expected setting."""
    if pod.setting is None:
        return pod.error or "its setting could not be read"
    runs = "runs " + show(pod.setting)
    return f"{runs}; {pod.error}" if pod.error else runs


# -- the risk rule ---------------------------------------------------------------------------

SKIP_GAIN = 0.5
"""Least predicted gain (relative; 0.5 halves the worst tenant's objective) with which a
candidate may skip its canary (`skip_canary`)."""


def skip_canary(target: RolloutTarget, state: models.RolloutStatus, fleet: EngineSetting,
                chunked_prefill_size: int) -> str:
    """Why `target` may go to every pod without a canary, or "" (the canary runs).

    The canary's analysis window is most of the time from a phase change to the fleet on
    the right setting, and on heavy-tailed traffic it is also the riskiest part (one giant
    prompt on the one canary pod reads as a regression, and every other pod keeps serving
    giants uncapped for the whole window). It is skipped only for a tuner's move
    (`RolloutTarget.gain` > 0: the lesser of its confirming run's and its independent
    resample's predicted gain) whose candidate was not rolled back since (the last
    rollout's result is not a rollback of it), when either:

    - **proven**: this deployment's whole fleet ran the candidate until a promotion left it
      (`RolloutTarget.proven`, from status.leftSettings; the setting the deployment started
      on counts, it ran on every pod), so it is known to run on these engines, and the
      predicted gain is large, at least `SKIP_GAIN`; or
    - **a harder cap**: the candidate runs more prefills at once than the fleet (C // T
      higher), so no request takes more of a pass than before. Errors cost unequal amounts:
      a cap the traffic did not need costs its uniform requests a fraction of their TTFT
      until the next step steps back (after a cooldown of calm traffic and a canary: the
      way back is the careful one), while an uncapped pod under giant prompts makes every
      request behind one wait for its whole prefill, for as long as the canary runs.

    What it risks: a setting that regresses under this mix with no canary to catch it; the
    next step's observed window (the tuner's model check and its gain) is then the check,
    one interval later. A first try of a setting that caps less (a step back towards off,
    or another order or mode alone) always runs its canary."""
    candidate = target.setting
    if not target.canary or not target.gain > 0:
        return ""
    if state.result == "RolledBack" and state.candidate == candidate:
        return ""
    rule = "(risk rule: docs/tuning.md, \"When the canary is skipped\")"
    if candidate in target.proven and target.gain >= SKIP_GAIN:
        return (f"canary skipped: every pod of this deployment ran {show(candidate)} before, left by a promotion "
                f"and not rolled back since, and the predicted gain {target.gain:.0%} is at least {SKIP_GAIN:.0%} "
                f"{rule}")  # fmt: skip
    conc = models.prefills_at_once
    before, after = conc(chunked_prefill_size, fleet.threshold), conc(chunked_prefill_size, candidate.threshold)
    if after > before:
        return (f"canary skipped: {show(candidate)} caps each prefill harder than the fleet's {show(fleet)} "
                f"(concurrency {before} -> {after}, predicted gain {target.gain:.0%}), the direction that costs "
                f"little if wrong {rule}")  # fmt: skip
    return ""


# -- the machine -----------------------------------------------------------------------------


VOIDED = "the queue mix jumped during the canary"
"""How the message of a rollout a mix jump voided begins (`voidable`)."""


def voidable(state: models.RolloutStatus | None, chunked_prefill_size: int) -> bool:
    """Whether a queue-mix jump now voids the rollout in flight: phase Canary or Analysis,
    with a candidate that does not cap harder than the baseline (C // T not higher).

    Such a candidate was chosen for the mix before the jump (another order or mode, a
    looser cap), and while its canary runs, every other pod serves the new mix on the old
    setting, for up to the analysis window (a few windows, if the sequential rule stays
    undecided). Voiding it returns the canaries to the fleet's setting at once, so the next
    step (the one the jump brings forward, `tune.mixjump`) decides on the new mix. A harder
    cap is not voided: it moves the way a jump to larger prompts needs, and its analysis
    compares both sides on the same traffic; a jump the other way (the giants gone) is the
    calm rule's to answer once it is promoted (`tune.guardrails`)."""
    if state is None or state.phase not in ("Canary", "Analysis") or state.candidate is None:
        return False
    conc = models.prefills_at_once
    baseline = state.baseline or state.candidate
    return conc(chunked_prefill_size, state.candidate.threshold) <= conc(chunked_prefill_size, baseline.threshold)


def analysis_due(state: models.RolloutStatus, policy: RolloutPolicy, now: float) -> bool:
    """Whether the caller must fetch canary and baseline figures before calling `advance`."""
    started = seconds(state.started_at)
    return state.phase == "Analysis" and started is not None and now - started >= policy.analysis_window_s


def analysis_final(state: models.RolloutStatus, policy: RolloutPolicy, now: float, blind_s: float = 0.0) -> bool:
    """Whether the analysis has reached its limit: the rule must now say Promote or Rollback.
    ``blind_s`` seconds without samples (a scrape gap, `sequential.blind_s`) move the limit
    out by as much, at most by the limit again: no decision on the sub-windows an outage
    left, and no analysis without end."""
    started = seconds(state.started_at)
    limit = policy.analysis_limit_factor * policy.analysis_window_s
    limit += min(max(blind_s, 0.0), limit)
    return state.phase == "Analysis" and started is not None and now - started >= limit


def advance(
    state: models.RolloutStatus | None,
    fleet: EngineSetting,
    target: RolloutTarget | None,
    pods: list[Pod],
    policy: RolloutPolicy,
    now: float,
    verdict: analysis_.Verdict | None = None,
    mix_jump: str = "",
) -> RolloutDecision:
    """One step. `fleet` is the setting the fleet runs (status); `target` None: hold it.
    `verdict` is the canary analysis, needed only when `analysis_due`. `mix_jump` says how
    the queue mix jumped since the rollout's decision ("" if it did not): it voids a
    `voidable` canary."""
    state = state or models.RolloutStatus()
    step = _Step(state, fleet, target, pods, policy, now)
    if mix_jump and voidable(state, policy.chunked_prefill_size):
        return step.void(mix_jump)
    if state.phase == "Canary":
        return step.canary()
    if state.phase == "Analysis":
        return step.analysis(verdict)
    if state.phase == "Promoting":
        return step.promoting()
    if state.phase == "RollingBack":
        return step.rolling_back()
    return step.idle()


@dataclass(frozen=True)
class _Step:
    state: models.RolloutStatus
    fleet: EngineSetting
    target: RolloutTarget | None
    pods: list[Pod]
    policy: RolloutPolicy
    now: float

    # helpers

    @property
    def candidate(self) -> EngineSetting:
        assert self.state.candidate is not None, f"phase {self.state.phase} without a candidate"
        return self.state.candidate

    @property
    def baseline(self) -> EngineSetting:
        return self.state.baseline or self.fleet

    def off(self, pods: list[Pod], setting: EngineSetting) -> list[Pod]:
        """The pods that do not (verifiably) run `setting`."""
        return [p for p in pods if p.setting != setting]

    def change(self, before: EngineSetting, after: EngineSetting) -> str:
        return describe_change(before, after, self.policy.chunked_prefill_size)

    def phase(self, phase: models.RolloutPhase, **update: object) -> models.RolloutStatus:
        fields: dict[str, object] = {"phase": phase, "started_at": stamp(self.now), "attempts": 0}
        fields.update(update)
        return self.state.model_copy(update=fields)

    def failures(self, pods: Sequence[Pod]) -> str:
        return ", ".join(f"{p.name} ({explain(p)})" for p in pods)

    def decision(self, action: Action, state: models.RolloutStatus, configmap: EngineSetting, apply: Sequence[Pod] = (),
                 setting: EngineSetting | None = None, events: tuple[Event, ...] = (), fleet: EngineSetting | None = None,
                 message: str = "") -> RolloutDecision:  # fmt: skip
        targets = {p.name: setting for p in apply if setting is not None}
        state = state.model_copy(update={"message": message[:1024] or state.message})
        return RolloutDecision(action, state, fleet or self.fleet, configmap, targets, events, message)

    def superseded(self) -> bool:
        """A new target other than the candidate. None is no new target: in Auto the tuner
        holds while a rollout is in flight (its guardrail), so the rollout goes on."""
        return self.target is not None and self.target.setting != self.candidate

    # phases

    def idle(self) -> RolloutDecision:
        target = self.target
        if target is not None and target.setting != self.fleet:
            if self.blocked(target.setting):
                finished = seconds(self.state.finished_at) or self.now
                wait = finished + self.policy.retry_after_s - self.now
                return self.hold(
                    f"{show(target.setting)} was rolled back at {self.state.finished_at}; "
                    f"not tried again for {wait:.0f} s"
                )
            return self.start(target)
        return self.hold("")

    def blocked(self, setting: EngineSetting) -> bool:
        finished = seconds(self.state.finished_at)
        return (
            self.state.result == "RolledBack" and self.state.candidate == setting
            and finished is not None and self.now - finished < self.policy.retry_after_s
        )  # fmt: skip

    def hold(self, why: str) -> RolloutDecision:
        """Nothing to roll out: keep every pod on the fleet's setting."""
        stale = self.off(self.pods, self.fleet)
        fixable = [p for p in stale if p.setting is not None]
        unreadable = [p for p in stale if p.setting is None]
        events: tuple[Event, ...] = ()
        message = why
        if fixable:
            names = ", ".join(f"{p.name} ({show(p.setting)})" for p in fixable if p.setting)
            message = f"pods on another setting than the fleet's {show(self.fleet)}: {names}; setting them back"
            events = (Event("Normal", "StalePodCorrected", message),)
        if unreadable:
            message = (message + "; " if message else "") + f"cannot read the setting of {self.failures(unreadable)}"
        action: Action = "Correct" if fixable or unreadable else "Hold"
        # The problem is this step's message only: status.rollout.message keeps the last
        # result's, so it is not left naming a problem that has since cleared.
        return RolloutDecision(action, self.state.model_copy(update={"phase": "Idle"}), self.fleet, self.fleet,
                        {p.name: self.fleet for p in stale}, events, message)  # fmt: skip

    def start(self, target: RolloutTarget) -> RolloutDecision:
        change = self.change(self.fleet, target.setting)
        on_fleet = [p for p in self.pods if p.setting == self.fleet]
        skipped = skip_canary(target, self.state, self.fleet, self.policy.chunked_prefill_size)
        if target.canary and on_fleet and not skipped:
            canaries = sorted(on_fleet, key=lambda p: p.name)[: self.policy.canary_replicas]
            state = self.phase("Canary", candidate=target.setting, baseline=self.fleet,
                               canary_pods=[p.name for p in canaries], result=None, finished_at=None,
                               reason=target.reason)  # fmt: skip
            message = (
                f"{change}: {target.reason}; trying it on canary pod(s) {', '.join(p.name for p in canaries)} "
                f"for {self.policy.analysis_window_s:.0f} s"
            )
            event = Event("Normal", "CanaryStarted", message)
            return self.decision("StartCanary", state, self.fleet, apply=canaries, setting=target.setting,
                                 events=(event,), message=message)  # fmt: skip
        state = self.phase("Promoting", candidate=target.setting, baseline=self.fleet,
                           canary_pods=[], result=None, finished_at=None,
                           reason=f"{target.reason}; {skipped}" if skipped else target.reason)  # fmt: skip
        why = "" if target.canary else " (applied to every pod at once: no canary for a setting the spec fixes)"
        message = f"{change}: {target.reason}{'; ' + skipped if skipped else why}"
        event = Event("Normal", "CanarySkipped" if skipped else "RolloutStarted", message)
        return self.decision("Promote", state, target.setting, apply=self.pods, setting=target.setting,
                             events=(event,), message=message)  # fmt: skip

    def canary(self) -> RolloutDecision:
        canaries = [p for p in self.pods if p.name in self.state.canary_pods]
        gone = sorted(set(self.state.canary_pods) - {p.name for p in canaries})
        if gone:
            return self.roll_back(f"canary pod(s) {', '.join(gone)} went away before the analysis")
        if self.superseded():
            return self.roll_back("the target changed during the canary")
        waiting = self.off(canaries, self.candidate)
        if not waiting:
            message = (
                f"canary pod(s) {', '.join(self.state.canary_pods)} run {show(self.candidate)}; "
                f"comparing them with the other pods for {self.policy.analysis_window_s:.0f} s"
            )
            return self.decision("StartAnalysis", self.phase("Analysis"), self.baseline, message=message)
        if self.state.attempts >= self.policy.max_attempts:
            return self.roll_back(
                f"the canary did not take the setting after {self.state.attempts} attempt(s): {self.failures(waiting)}"
            )
        state = self.state.model_copy(update={"attempts": self.state.attempts + 1})
        return self.decision("ApplyCanary", state, self.baseline, apply=waiting, setting=self.candidate,
                             message=f"setting {show(self.candidate)} on {', '.join(p.name for p in waiting)}")  # fmt: skip

    def analysis(self, verdict: analysis_.Verdict | None) -> RolloutDecision:
        canaries = [p for p in self.pods if p.name in self.state.canary_pods]
        gone = sorted(set(self.state.canary_pods) - {p.name for p in canaries})
        if gone:
            return self.roll_back(f"canary pod(s) {', '.join(gone)} went away during the analysis")
        if self.superseded():
            return self.roll_back("the target changed during the analysis")
        drifted = self.off(canaries, self.candidate)
        if drifted:
            return self.roll_back(f"canary pod(s) no longer run the candidate: {self.failures(drifted)}")
        if not analysis_due(self.state, self.policy, self.now):
            started = seconds(self.state.started_at) or self.now
            left = started + self.policy.analysis_window_s - self.now
            return self.decision("Hold", self.state, self.baseline, message=f"analysis: {left:.0f} s left")
        if verdict is not None and verdict.undecided:
            if analysis_final(self.state, self.policy, self.now, verdict.blind_s):
                return self.roll_back(f"canary analysis undecided at its limit: {verdict.summary}")
            return self.decision("Hold", self.state, self.baseline, message=f"analysis continues: {verdict.summary}")
        if verdict is None or not verdict.passed:
            why = verdict.summary if verdict is not None else "no canary figures to judge by"
            return self.roll_back(f"canary analysis failed: {why}")
        message = f"canary analysis passed: {verdict.summary}; promoting {show(self.candidate)} to every pod"
        state = self.phase("Promoting")
        return self.decision("Promote", state, self.candidate, apply=self.off(self.pods, self.candidate),
                             setting=self.candidate, events=(Event("Normal", "CanaryPassed", message),),
                             message=message)  # fmt: skip

    def promoting(self) -> RolloutDecision:
        waiting = self.off(self.pods, self.candidate)
        if not waiting:
            change = self.change(self.baseline, self.candidate)
            state = finished(self.state, "Promoted", self.now)
            message = f"{change}: every pod runs {show(self.candidate)}"
            return self.decision("Promoted", state, self.candidate, fleet=self.candidate,
                                 events=(Event("Normal", "ThresholdChanged", f"{change}: {self.reason()}"),),
                                 message=message)  # fmt: skip
        if self.state.attempts >= self.policy.max_attempts:
            return self.roll_back(
                f"promotion stopped after {self.state.attempts} attempt(s): {self.failures(waiting)}"
            )
        state = self.state.model_copy(update={"attempts": self.state.attempts + 1})
        return self.decision("Promote", state, self.candidate, apply=waiting, setting=self.candidate,
                             message=f"setting {show(self.candidate)} on {', '.join(p.name for p in waiting)}")  # fmt: skip

    def reason(self) -> str:
        return self.state.reason or "promoted"

    def roll_back(self, why: str, event: tuple[Literal["Normal", "Warning"], str] = ("Warning", "RollingBack"),
                  ) -> RolloutDecision:  # fmt: skip
        state = self.phase("RollingBack")
        message = f"rolling back {show(self.candidate)} to {show(self.baseline)}: {why}"
        targets = self.off(self.pods, self.baseline)
        return self.decision("RollBack", state, self.baseline, apply=targets, setting=self.baseline,
                             events=(Event(*event, message),), fleet=self.baseline, message=message)  # fmt: skip

    def void(self, mix_jump: str) -> RolloutDecision:
        """A canary the queue mix jumped under (`voidable`), with a Normal Event: nothing
        was found wrong with the candidate, it was chosen for the mix before the jump.

        The step that voids it has judged the new mix (the loop's tuner sees the rollout
        as voided, `tuning.as_voided`). When its target may skip a canary (`skip_canary`:
        a harder cap, the only move a jump's step may make), that target goes to every pod
        in this same step, the voided canaries with them; otherwise the canaries go back
        to the baseline and the next step decides (the mix watch retries the jump)."""
        target = self.target
        voided = dataclasses.replace(self, state=finished(self.state, "RolledBack", self.now), fleet=self.baseline)
        skipped = "" if target is None or target.setting == self.baseline else skip_canary(
            target, voided.state, self.baseline, self.policy.chunked_prefill_size)
        if target is None or not skipped:
            return self.roll_back(f"{VOIDED} ({mix_jump}), and the candidate was chosen for the mix before it: the "
                                  "next step decides on the new mix", ("Normal", "CanaryVoided"))  # fmt: skip
        started = voided.start(target)
        message = (f"voided the canary of {show(self.candidate)}: {VOIDED} ({mix_jump}), and the candidate was "
                   f"chosen for the mix before it; this step decided on the new mix: {show(target.setting)} goes "
                   "to every pod instead (CanarySkipped)")  # fmt: skip
        return dataclasses.replace(started, events=(Event("Normal", "CanaryVoided", message), *started.events))

    def voided(self) -> bool:
        return VOIDED in (self.state.message or "")

    def rolling_back(self) -> RolloutDecision:
        waiting = self.off(self.pods, self.baseline)
        if not waiting:
            state = finished(self.state, "RolledBack", self.now)
            message = f"rolled back: every pod runs {show(self.baseline)}; {self.state.message or ''}".rstrip("; ")
            kind: Literal["Normal", "Warning"] = "Normal" if self.voided() else "Warning"
            return self.decision("RolledBack", state, self.baseline, fleet=self.baseline,
                                 events=(Event(kind, "RolledBack", message),), message=message)  # fmt: skip
        state = self.state.model_copy(update={"attempts": self.state.attempts + 1})
        return self.decision("RollBack", state, self.baseline, apply=waiting, setting=self.baseline,
                             fleet=self.baseline, message=self.state.message or "")  # fmt: skip
