"""The tuner for one ServingDeployment: its spec and status in, a Decision out (pure).

What the operator's loop calls (``controller/loop.py``'s ``Recommender``), so that the
controller needs no knowledge of the tuner's types:

    decision = deployment.decide_for(sd, snap, fleet, now, profile)
    setting, move, reason, mix = deployment.summary(decision, fleet)

``fleet`` is what the engines run (``models.EngineSetting``, read back from their gauges);
``now`` is Unix seconds (the loop's injected clock). The tuner's memory lives in the CR
status: the last step's time is when its rollout finished (``status.rollout.finishedAt``,
else ``status.lastDecision.time``: ``last_step_at``) and a rollout is in progress
while ``status.rollout.phase`` is not Idle, so a restarted operator decides exactly as the
one before it would have; the dwell's memory (``TunerState.left``) is
``status.leftSettings``, which ``record_left`` extends when a rollout promotes.
``time_scale`` multiplies the spec's interval and cooldown (the controller's
``tuning_time_scale``, for time-scaled tests and the demo).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from slipstream.api import models
from slipstream.api.snapshot import PodPool, WorkloadSnapshot
from slipstream.sim.policies import EngineConfig, Setting, engine_order
from slipstream.sim.profiles import Profile
from slipstream.tune.candidates import from_spec
from slipstream.tune.guardrails import Decision, GuardrailSettings, Move, TunerState
from slipstream.tune.tuner import TunerSettings, tune_once

MAX_LEFT = 8
"""Most entries ``status.leftSettings`` keeps (the CRD's maxItems): a dwell of a few
cooldowns never needs more than the last few steps."""


def setting_of(es: models.EngineSetting) -> Setting:
    return Setting(es.threshold, es.mode, es.schedule_policy)


def engine_setting(setting: Setting) -> models.EngineSetting:
    """The twin's setting as the API's: validated, so a mode or order the CRD does not
    know raises here instead of reaching an engine."""
    return models.EngineSetting.model_validate(
        {"threshold": setting.threshold, "mode": setting.mode, "schedule_policy": engine_order(setting.order)})


def tuner_settings(spec: models.ServingDeploymentSpec, time_scale: float = 1.0) -> TunerSettings:
    """The spec's bounds, targets, interval and cooldown as the tuner's settings."""
    tuning = spec.tuning
    guard = GuardrailSettings(interval_s=tuning.interval_seconds * time_scale,
                              cooldown_s=tuning.cooldown_seconds * time_scale)
    return TunerSettings(spec=from_spec(spec), guardrails=guard)


@dataclass(frozen=True, slots=True)
class TwinPool:
    """The KV pool the twin runs the candidates with, and what to say about it."""

    tokens: int | None
    """The smallest pool the engine pods report (tokens); None: the profile's."""
    note: str = ""
    """"" when every pod reported a usable pool; else which did not, and, with no usable
    pool at all, that the profile's is used (for the recommendation's reason)."""


MAX_NAMED = 3
"""Pods whose problem the note names (the rest are counted): a reason stays a line."""


def twin_pool(pools: Sequence[PodPool]) -> TwinPool:
    """The pool for the twin's candidates: the smallest any pod reports (a tight pool makes
    ceiling mode's admission serial, which a big profile pool hides: docs/engine.md, "A
    tight KV pool"). A pod that reported no usable value keeps its last usable one and is
    named; with no usable value at all the profile's pool is used, and the note says so. A
    missing or garbled answer never becomes a size."""
    sizes = [p.tokens for p in pools if p.tokens is not None]
    bad = [f"{p.pod}: {p.problem}" for p in pools if p.problem]
    named = "; ".join(bad[:MAX_NAMED]) + (f" and {len(bad) - MAX_NAMED} more" if len(bad) > MAX_NAMED else "")
    if sizes:
        note = f"twin KV pool {min(sizes):,} tokens, the smallest reported ({named})" if bad else ""
        return TwinPool(min(sizes), note)
    why = named or "no engine pod has reported its max_total_num_tokens yet"
    return TwinPool(None, f"twin KV pool: the profile's ({why})")


def engine_config(spec: models.ServingDeploymentSpec, pools: Sequence[PodPool] = ()) -> EngineConfig:
    """The twin's engine: the deployment's own C and page size (``spec.engine``) and the
    engines' KV pool (``twin_pool``), the twin's defaults for what neither sets."""
    engine = spec.engine
    return EngineConfig(chunked_prefill_size=engine.chunked_prefill_size, page_size=engine.page_size,
                        kv_pool_tokens=twin_pool(pools).tokens)


def unix_seconds(stamp: str | float | int | None) -> float | None:
    """A status time (RFC 3339, or seconds) as Unix seconds; None when absent or unreadable."""
    if stamp is None:
        return None
    if isinstance(stamp, int | float):
        return float(stamp)
    try:
        return float(stamp)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def left_of(status: models.ServingDeploymentStatus | None) -> tuple[tuple[Setting, float], ...]:
    """``status.leftSettings`` as ``TunerState.left`` (oldest first); an entry whose time
    does not parse is dropped (it cannot say how long ago it was left)."""
    entries = status.left_settings if status is not None else []
    pairs = ((setting_of(e.setting), unix_seconds(e.left_at)) for e in entries)
    return tuple((s, at) for s, at in pairs if at is not None)


def record_left(entries: list[models.LeftSetting], left: models.EngineSetting, at: str) -> list[dict[str, object]]:
    """``status.leftSettings`` after a promotion left ``left`` at ``at`` (RFC 3339): the new
    entry last, only the newest ``MAX_LEFT`` kept (the CRD refuses more)."""
    new = models.LeftSetting(setting=left, left_at=at)
    return [e.to_k8s() for e in [*entries, new][-MAX_LEFT:]]


def last_step_at(status: models.ServingDeploymentStatus | None) -> float | None:
    """When the last step ended (Unix seconds; ``TunerState.last_step_at``): the rollout's
    finish (promoted or rolled back) when it finished after the decision, else the
    decision's time (``status.lastDecision.time``); None if there was none.

    The cooldown runs from here: a step's effect shows in the metrics only once every pod
    runs it, and a canary plus its analysis window can take most of a cooldown; counted
    from the decision, the next step could be judged on a window the promotion barely
    reached."""
    last = status.last_decision if status is not None else None
    decided = unix_seconds(last.time) if last is not None else None
    rollout = status.rollout if status is not None else None
    if rollout is None or rollout.phase != "Idle" or rollout.result not in ("Promoted", "RolledBack"):
        return decided
    finished = unix_seconds(rollout.finished_at)
    if finished is None or (decided is not None and finished < decided):
        return decided
    return finished


def tuner_state(sd: models.ServingDeployment, fleet: models.EngineSetting) -> TunerState:
    """What the tuner remembers, read from the CR status."""
    status = sd.status
    rollout = status.rollout if status is not None else None
    return TunerState(setting_of(fleet), last_step_at(status),
                      rollout is not None and rollout.phase != "Idle", left_of(status))


def decide_for(sd: models.ServingDeployment, snap: WorkloadSnapshot, fleet: models.EngineSetting, now: float,
               profile: Profile, time_scale: float = 1.0) -> Decision:
    """This interval's decision for ``sd`` (see ``tuner.tune_once``)."""
    settings = tuner_settings(sd.spec, time_scale)
    return tune_once(snap, tuner_state(sd, fleet), settings, profile, engine_config(sd.spec, snap.kv_pools), now)


def summary(decision: Decision, fleet: models.EngineSetting
            ) -> tuple[models.EngineSetting, bool, str, float | None]:
    """(setting it would run, whether to move now, reason line, heterogeneity) for status
    and the controller's ``tuning.Recommendation``."""
    rec = decision.recommendation
    setting = engine_setting(rec.best.setting) if rec is not None else fleet
    mix = rec.heterogeneity if rec is not None and math.isfinite(rec.heterogeneity) else None
    if isinstance(decision, Move):
        return engine_setting(decision.to), True, decision.reason, mix
    return setting, False, f"{decision.reason}: {decision.message}", mix
