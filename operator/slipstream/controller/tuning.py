"""One step of a ServingDeployment's tuning loop, as pure functions of plain data.

What the fleet should run (`target`: the spec in Fixed, Off and Recommend, the tuner's
choice in Auto), the rollout policy from the spec, the conditions the step leaves
(MetricsAvailable, RolloutProgressing, EnginesInSync), the Warnings that are new (one per
new problem, not one per interval) and the status patch. `loop.py` does the I/O around it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from slipstream.api import models, snapshot, versions
from slipstream.controller import objects, status
from slipstream.controller import settings as settings_
from slipstream.rollout import machine
from slipstream.tune import deployment as tune_deployment
from slipstream.tune import guardrails, modelcheck

METRICS_AVAILABLE = "MetricsAvailable"
ROLLOUT_PROGRESSING = "RolloutProgressing"
ENGINES_IN_SYNC = "EnginesInSync"
ENGINE_SUPPORTED = "EngineSupported"
"""Whether every engine reports the patched release spec.engine.version names (modes that
observe only): False holds Auto to recommending (`api.versions.problem`)."""
CONDITIONS = (METRICS_AVAILABLE, ROLLOUT_PROGRESSING, ENGINES_IN_SYNC, ENGINE_SUPPORTED, guardrails.OVERLOADED)

PODS_UNREACHABLE = "PodsUnreachable"
PODS_OFF_SETTING = "PodsOnOtherSetting"
NO_ENGINE_PODS = "NoEnginePods"
"""EnginesInSync is Unknown with this reason while no engine pod runs (spec.replicas 0, pods
not yet started or all gone): there is no setting to be in sync with."""

WARN_ON_FALSE = {METRICS_AVAILABLE: None, ENGINES_IN_SYNC: {PODS_UNREACHABLE}, ENGINE_SUPPORTED: None}
"""Condition -> the False reasons that are a Warning (None: all). A pod on another setting
is corrected at once (a Normal StalePodCorrected Event), not a problem to warn about."""

NORMAL_ON_FALSE = {snapshot.TOO_FEW_SAMPLES}
"""False reasons that are a Normal Event, not a Warning: a window that is merely starting
(traffic began, or has not yet reached ``min_samples``) is how every deployment begins, not
a fault; the tuner holds either way."""

RECOMMENDING_MODES = ("Auto", "Recommend")
"""The modes whose tuner writes status.recommendation; in any other the field is cleared,
so a recommendation never outlives the mode that made it."""


@dataclass(frozen=True)
class Recommendation:
    """What the tuner returned for one snapshot (the controller's view of `slipstream.tune`)."""

    setting: models.EngineSetting
    """What it would run."""
    move: bool
    """Whether its guardrails let the fleet move there now (hysteresis, cooldown, ...)."""
    reason: str
    """One line with the numbers, e.g. `heterogeneity 0.81, predicted worst-tenant p99 TTFT
    38.2 s -> 1.9 s`."""
    heterogeneity: float | None = None
    prediction: tuple[tuple[str, float, float], ...] = ()
    """(tenant, twin's p99 TTFT s, observed p99 TTFT s) of the model check: the twin's
    replay of the window under the running setting beside the engines' (``tune.modelcheck``)."""
    model_mismatch: str = ""
    """Set when the twin does not explain the window (the guardrails held ``ModelMismatch``):
    the worst tenant's predicted and observed p99, for ``MetricsAvailable`` and its Event."""
    gain: float = 0.0
    """The predicted relative gain of a move: the lesser of the confirming run's and the
    independent resample's (the canary's risk rule, `rollout.machine.skip_canary`)."""
    judged: bool = True
    """The twin judged the window (a fresh or a reused run); False when a guardrail held
    before it (a rollout in flight, the cooldown, too few samples)."""
    other_way: bool = False
    """A step a queue-mix jump brought found it going the other way (`tune.guardrails.other_way`):
    the jump is not retried."""

    @property
    def prediction_error_ratio(self) -> float | None:
        """The worst tenant's predicted over observed p99 (furthest from 1 either way)."""
        ratios = [p / o for _, p, o in self.prediction if o > 0 and math.isfinite(p / o) and p > 0]
        return max(ratios, key=lambda r: abs(math.log(r)), default=None)


MIXED = guardrails.GuardrailSettings().step_back_max_heterogeneity
"""Heterogeneity above which a window counts as mixed (status.mixedAt): the guardrails'
near-uniform bound."""

spec_setting = objects.spec_setting
fleet_setting = objects.current_setting


def engine_problem(sd: models.ServingDeployment, pods: Sequence[machine.Pod]) -> tuple[str, str] | None:
    """(reason, message) when the engines may not be tuned: a pod reports a release with no
    patch, or another release than spec.engine.version (`api.versions.problem`)."""
    return versions.problem(sd.spec.engine.version, [(p.name, p.version) for p in pods if p.setting is not None])


def only_recommends(sd: models.ServingDeployment, problem: tuple[str, str] | None) -> bool:
    """Whether this step reports its recommendation without applying it: mode Recommend, or
    Auto on engines it may not tune."""
    return sd.spec.tuning.mode == "Recommend" or (sd.spec.tuning.mode == "Auto" and problem is not None)


def target(sd: models.ServingDeployment, recommendation: Recommendation | None,
           problem: tuple[str, str] | None = None) -> machine.RolloutTarget | None:
    """The setting the fleet should run; None: hold what it runs (Auto without a move, or
    Auto on engines it may not tune: `engine_problem`)."""
    tuning = sd.spec.tuning
    if tuning.mode == "Auto":
        if recommendation is None or not recommendation.move or problem is not None:
            return None
        proven = tuple(e.setting for e in sd.status.left_settings)
        return machine.RolloutTarget(recommendation.setting, recommendation.reason, canary=True, gain=recommendation.gain,
                              proven=proven)  # fmt: skip
    reasons = {
        "Off": "tuning is Off: the stock engine (threshold 0)",
        "Fixed": f"spec.tuning.threshold is {tuning.threshold} (mode Fixed)",
        "Recommend": f"mode Recommend runs spec.tuning.threshold ({tuning.threshold or 0}) and only reports",
    }
    return machine.RolloutTarget(spec_setting(sd), reasons[tuning.mode], canary=False)


def as_voided(sd: models.ServingDeployment, state: models.RolloutStatus, now: float) -> models.ServingDeployment:
    """``sd`` as the tuner must judge it on a step whose queue-mix jump voids the canary in
    flight (`machine.voidable`): the rollout over (rolled back now, so the cooldown runs
    from the void, as from any rollback), so the step decides on the new mix instead of
    holding for a rollout that this same step ends (`machine.advance` voids it)."""
    rollout = machine.finished(state, "RolledBack", now)
    return sd.model_copy(update={"status": sd.status.model_copy(update={"rollout": rollout})})


def scale(seconds: float, config: settings_.ControllerSettings) -> float:
    return seconds * config.tuning_time_scale


def policy(sd: models.ServingDeployment, config: settings_.ControllerSettings) -> machine.RolloutPolicy:
    tuning = sd.spec.tuning
    window = scale(tuning.rollout.analysis_window_seconds, config)
    return machine.RolloutPolicy(
        canary_replicas=tuning.rollout.canary_replicas,
        analysis_window_s=window,
        max_regression_percent=tuning.rollout.max_regression_percent,
        max_attempts=config.admin_attempts,
        retry_after_s=max(scale(tuning.cooldown_seconds, config), window),
        analysis_limit_factor=max(1.0, config.canary_analysis_limit_windows),
        chunked_prefill_size=sd.spec.engine.chunked_prefill_size,
    )


def interval(sd: models.ServingDeployment, config: settings_.ControllerSettings) -> float:
    return scale(sd.spec.tuning.interval_seconds, config)


def observes(sd: models.ServingDeployment) -> bool:
    """Whether this deployment's mode reads metrics at all."""
    return sd.spec.tuning.mode in ("Auto", "Recommend") and sd.spec.prometheus.url is not None


def kv_pools(before: Sequence[snapshot.PodPool], pods: Sequence[machine.Pod]) -> tuple[snapshot.PodPool, ...]:
    """Each pod's KV pool after this step's read (``snapshot.WorkloadSnapshot.kv_pools``, for
    the next step's tuner): the value a pod reported; a pod whose answer held none keeps its
    earlier value, with the problem; a pod whose read failed keeps its earlier entry; a pod
    no longer among ``pods`` is dropped. A missing or garbled answer never moves the pool."""
    old = {p.pod: p for p in before}
    out = []
    for pod in pods:
        if pod.kv_pool_tokens is not None:
            out.append(snapshot.PodPool(pod.name, pod.kv_pool_tokens))
        elif pod.kv_pool_problem:
            known = old.get(pod.name)
            out.append(snapshot.PodPool(pod.name, known.tokens if known is not None else None, pod.kv_pool_problem))
        elif pod.name in old:
            out.append(old[pod.name])
    return tuple(out)


# -- conditions and warnings -------------------------------------------------------------


def conditions(
    sd: models.ServingDeployment,
    current: Sequence[models.Condition],
    decision: machine.RolloutDecision,
    pods: Sequence[machine.Pod],
    snap: snapshot.WorkloadSnapshot | None,
    now: str,
    recommendation: Recommendation | None = None,
    problem: tuple[str, str] | None = None,
) -> list[models.Condition]:
    """`current` with the tuning conditions set from this step. A valid window the
    twin does not explain is `MetricsAvailable=False`, reason `ModelMismatch`: the metrics
    are there, but nothing may be decided on them. `EngineSupported` (modes that observe)
    is False with `problem`'s reason while the engines may not be tuned."""
    gen = sd.metadata.generation
    out = list(current)
    if not observes(sd):
        out = [c for c in out if c.type != ENGINE_SUPPORTED]
    elif problem is not None:
        out = status.set_condition(out, ENGINE_SUPPORTED, False, problem[0], problem[1], gen, now)
    elif any(p.setting is not None for p in pods):
        releases = sorted({versions.release(p.version) or sd.spec.engine.version for p in pods if p.setting is not None})
        out = status.set_condition(out, ENGINE_SUPPORTED, True, "PatchedVersion",
                                   f"the engines run SGLang {', '.join(releases)}, which Slipstream's patch supports",
                                   gen, now)  # fmt: skip
    if snap is not None:
        if snap.valid and recommendation is not None and recommendation.model_mismatch:
            out = status.set_condition(out, METRICS_AVAILABLE, False, modelcheck.MODEL_MISMATCH, recommendation.model_mismatch,
                                       gen, now)  # fmt: skip
        elif snap.valid:
            detail = snap.detail or f"{snap.requests:.0f} first tokens over {snap.window_s:.0f} s"
            out = status.set_condition(out, METRICS_AVAILABLE, True, "Fresh", detail, gen, now)
        else:
            out = status.set_condition(out, METRICS_AVAILABLE, False, snap.invalid or "Invalid", snap.detail, gen, now)
    elif not observes(sd):
        out = [c for c in out if c.type != METRICS_AVAILABLE]
    out = overload_condition(sd, out, snap, gen, now)
    state = decision.state
    if decision.in_flight:
        out = status.set_condition(out, ROLLOUT_PROGRESSING, True, state.phase, decision.message or state.message or "", gen, now)
    else:
        # This step's message (a hold's problem) while it lasts, else the last result's: a
        # problem that has cleared does not stay in the message of a reason that says done.
        reason = state.result or "Idle"
        message = decision.message or state.message or "no rollout in flight"
        out = status.set_condition(out, ROLLOUT_PROGRESSING, False, reason, message, gen, now)
    unreadable = [p for p in pods if p.setting is None]
    off = [p for p in pods if p.setting is not None and p.setting != decision.fleet]
    if decision.in_flight:
        out = status.set_condition(out, ENGINES_IN_SYNC, False, "RollingOut", "a rollout is in flight", gen, now)
    elif not pods:
        # True over no pods would say the fleet runs a setting no engine reported.
        out = status.set_condition(out, ENGINES_IN_SYNC, None, NO_ENGINE_PODS,
                                   f"no engine pod runs to report a setting (spec.replicas {sd.spec.replicas})",
                                   gen, now)  # fmt: skip
    elif unreadable:
        listed = ", ".join(f"{p.name} ({machine.explain(p)})" for p in unreadable)
        out = status.set_condition(out, ENGINES_IN_SYNC, False, PODS_UNREACHABLE,
                                   f"the setting of {len(unreadable)} of {len(pods)} engine pod(s) cannot be read or set: {listed}",
                                   gen, now)  # fmt: skip
    elif off:
        listed = ", ".join(f"{p.name} ({machine.explain(p)})" for p in off)
        out = status.set_condition(out, ENGINES_IN_SYNC, False, PODS_OFF_SETTING, f"being set back: {listed}", gen, now)
    else:
        out = status.set_condition(out, ENGINES_IN_SYNC, True, "AllPodsOnSetting",
                                   f"{len(pods)} engine pod(s) report {machine.show(decision.fleet)}", gen, now)  # fmt: skip
    return out


def new_warnings(before: Sequence[models.Condition], after: Sequence[models.Condition]) -> list[machine.Event]:
    """A Warning for each tuning condition that turned False with a new problem reason (a
    Normal Event for the reasons of NORMAL_ON_FALSE)."""
    was = {c.type: c for c in before}
    events = []
    for c in after:
        if c.type not in WARN_ON_FALSE or c.status != "False":
            continue
        reasons = WARN_ON_FALSE[c.type]
        if reasons is not None and c.reason not in reasons:
            continue
        old = was.get(c.type)
        if old is None or old.status != "False" or old.reason != c.reason:
            kind: Literal["Normal", "Warning"] = "Normal" if c.reason in NORMAL_ON_FALSE else "Warning"
            events.append(machine.Event(kind, c.reason, c.message))
    return events


def overload_condition(sd: models.ServingDeployment, current: list[models.Condition],
                       snap: snapshot.WorkloadSnapshot | None, gen: int, now: str) -> list[models.Condition]:
    """`current` with `Overloaded` set from this step's snapshot (`snapshot.overload`, the
    loop's `tune.overload` verdict); removed outside the modes that observe; unchanged on a
    step that read nothing."""
    if not observes(sd):
        return [c for c in current if c.type != guardrails.OVERLOADED]
    if snap is None:
        return current
    if snap.overload:
        return status.set_condition(current, guardrails.OVERLOADED, True, guardrails.OVERLOADED, snap.overload, gen, now)
    return status.set_condition(current, guardrails.OVERLOADED, False, "BacklogNotGrowing", "the waiting queue is not growing "
                                "window after window at the fleet's capacity (tune/overload.py)", gen, now)  # fmt: skip


def overload_events(before: Sequence[models.Condition], after: Sequence[models.Condition]) -> list[machine.Event]:
    """A Warning `Overloaded` when the condition turns True (once: not while it stays True)."""
    was = next((c for c in before if c.type == guardrails.OVERLOADED), None)
    now = next((c for c in after if c.type == guardrails.OVERLOADED), None)
    if now is None or now.status != "True" or (was is not None and was.status == "True"):
        return []
    return [machine.Event("Warning", guardrails.OVERLOADED, now.message)]


# -- status --------------------------------------------------------------------------------


def tenants(sd: models.ServingDeployment, snap: snapshot.WorkloadSnapshot) -> list[dict[str, Any]]:
    """Per-tenant p99 TTFT of the window, with each tenant's target."""
    objective = sd.spec.tuning.objective
    targets = {t.name: t.ttft_p99_seconds for t in objective.tenants}
    rows = []
    for t in sorted(snap.tenants, key=lambda t: t.name)[:256]:
        p99 = t.ttft_p99_s
        rows.append(models.TenantLatency(
            name=t.name[:253],
            ttft_p99_seconds=round(p99, 4) if math.isfinite(p99) else None,
            target_seconds=targets.get(t.name, objective.ttft_p99_seconds),
            requests_per_second=round(t.requests_per_s, 4) if math.isfinite(t.requests_per_s) else None,
        ).to_k8s())  # fmt: skip
    return rows


def status_patch(
    sd: models.ServingDeployment,
    decision: machine.RolloutDecision,
    conds: list[models.Condition],
    snap: snapshot.WorkloadSnapshot | None,
    recommendation: Recommendation | None,
    started: bool,
    now: str,
) -> dict[str, Any]:
    """The status fields the tuning loop owns (reconcile owns observedGeneration and Ready)."""
    fleet = decision.fleet
    out: dict[str, Any] = {
        "threshold": fleet.threshold,
        "concurrency": models.prefills_at_once(sd.spec.engine.chunked_prefill_size, fleet.threshold),
        "mode": fleet.mode,
        "schedulePolicy": fleet.schedule_policy,
        "rollout": decision.state.to_k8s(),
        "conditions": [c.to_k8s() for c in conds],
        "phase": status.phase(conds),
    }
    if snap is not None and snap.valid:
        out["tenants"] = tenants(sd, snap)
    if sd.spec.tuning.mode not in RECOMMENDING_MODES:
        out["recommendation"] = None  # merge patch: removes what Auto or Recommend wrote
    elif recommendation is not None:
        out["recommendation"] = recommendation.setting.to_k8s()
        if recommendation.heterogeneity is not None and math.isfinite(recommendation.heterogeneity):
            out["heterogeneity"] = round(recommendation.heterogeneity, 3)
            if recommendation.heterogeneity > MIXED:  # the calm's memory (tune.guardrails.TunerState.mixed_at)
                out["mixedAt"] = now
        if (ratio := recommendation.prediction_error_ratio) is not None:
            out["predictionErrorRatio"] = round(ratio, 3)
    if started and decision.state.candidate is not None:  # a rollout began this step
        out["lastDecision"] = models.DecisionRecord.model_validate({
            "time": now, "from": (decision.state.baseline or fleet).to_k8s(),
            "to": decision.state.candidate.to_k8s(), "reason": (decision.state.reason or "")[:1024],
        }).to_k8s()  # fmt: skip
    baseline = decision.state.baseline
    if decision.action == "Promoted" and baseline is not None and baseline != fleet:  # the fleet left baseline
        out["leftSettings"] = tune_deployment.record_left(sd.status.left_settings, baseline, now)
    return out


def recommended_event(
    sd: models.ServingDeployment, fleet: models.EngineSetting, recommendation: Recommendation | None,
    problem: tuple[str, str] | None = None,
) -> machine.Event | None:
    """When the step only recommends (`only_recommends`), an Event when the tuner's choice
    changes (and differs from the fleet's)."""
    if not only_recommends(sd, problem) or recommendation is None:
        return None
    if recommendation.setting == sd.status.recommendation or recommendation.setting == fleet:
        return None
    change = machine.describe_change(fleet, recommendation.setting, sd.spec.engine.chunked_prefill_size)
    why = "mode Recommend" if sd.spec.tuning.mode == "Recommend" or problem is None else problem[0]
    return machine.Event("Normal", "Recommended", f"{change}: {recommendation.reason} ({why}: not applied)")
