"""One control interval of the tuner: gate, recommend, decide (the controller's one call).

``tune_once`` is what the operator's controller and the twin's ``auto`` both call each
interval, so the closed loop in a cluster and in the twin run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slipstream.api.snapshot import WorkloadSnapshot
from slipstream.sim.policies import EngineConfig
from slipstream.sim.profiles import Profile
from slipstream.tune import guardrails, recommend
from slipstream.tune.candidates import TuningSpec
from slipstream.tune.guardrails import Decision, GuardrailSettings, TunerState
from slipstream.tune.memo import Memo, fingerprint
from slipstream.tune.recommend import RecommenderSettings


@dataclass(frozen=True, slots=True)
class TunerSettings:
    """Everything the tuner needs besides the snapshot and its state."""

    spec: TuningSpec = field(default_factory=TuningSpec)
    guardrails: GuardrailSettings = field(default_factory=GuardrailSettings)
    recommender: RecommenderSettings = field(default_factory=RecommenderSettings)


def tune_once(snapshot: WorkloadSnapshot, state: TunerState, settings: TunerSettings,
              profile: Profile, config: EngineConfig | None, now: float,
              memo: Memo | None = None) -> Decision:
    """This interval's decision; the twin runs only when no guardrail holds beforehand and,
    with a ``memo``, only when the workload moved since its last run (``tune.memo``)."""
    held = guardrails.gate(snapshot, state, settings.guardrails, now)
    if held is not None:
        return held
    if memo is None:
        rec = recommend.recommend(snapshot, state.current, settings.spec, profile, config,
                                  settings.recommender)
    else:
        key = (state.current, settings.spec, settings.recommender, profile, config)
        seen = fingerprint(snapshot, settings.recommender.calibration_min_samples)
        rec = memo.get(snapshot.deployment, key, seen, now)
        if rec is None:
            rec = recommend.recommend(snapshot, state.current, settings.spec, profile, config,
                                      settings.recommender)
            memo.put(snapshot.deployment, key, seen, now, rec)
    return guardrails.decide(snapshot, rec, state, settings.spec, settings.guardrails, now)
