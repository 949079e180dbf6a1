"""The canary's risk rule (rollout.machine.skip_canary): a candidate skips its canary only
when it is proven on this deployment, was not rolled back since, and its predicted gain is
large; the rollout says so (a CanarySkipped Event, status.rollout.message and reason)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slipstream.api import models
from slipstream.controller import tuning
from slipstream.rollout import machine

S = models.EngineSetting
OLD = S(threshold=0)
NEW = S(threshold=4096, schedule_policy="srpt")
POLICY = machine.RolloutPolicy(canary_replicas=1, analysis_window_s=120, retry_after_s=600)
T0 = 1_800_000_000.0
PODS = [machine.Pod(f"engine-{i}", OLD) for i in range(3)]
PROVEN = machine.RolloutTarget(NEW, "predicted worst-tenant p99 TTFT 28 s -> 2.5 s", canary=True, gain=0.9,
                        proven=(S(threshold=2048), NEW))  # fmt: skip


def start(target: machine.RolloutTarget, state: models.RolloutStatus | None = None) -> machine.RolloutDecision:
    return machine.decide(state, OLD, target, PODS, POLICY, T0)


def test_a_proven_candidate_with_a_large_gain_skips_the_canary() -> None:
    d = start(PROVEN)
    assert d.action == "Promote" and d.state.phase == "Promoting" and not d.state.canary_pods
    # The ConfigMap first (a pod starting now gets the candidate), then every pod at once.
    assert set(d.apply) == {p.name for p in PODS} and d.configmap == NEW and d.fleet == OLD
    (event,) = d.events
    assert event.reason == "CanarySkipped" and "canary skipped" in event.message and "90%" in event.message
    # Visible in status too: the rollout's message and reason (the ThresholdChanged Event's words).
    persisted = models.RolloutStatus.model_validate(d.state.to_k8s())
    assert "canary skipped" in (persisted.message or "") and "canary skipped" in (persisted.reason or "")


@pytest.mark.parametrize("why, target", [
    ("never ran here", replace(PROVEN, proven=(S(threshold=2048),))),
    ("gain below SKIP_GAIN", replace(PROVEN, gain=machine.SKIP_GAIN - 0.01)),
    ("no predicted gain", replace(PROVEN, gain=0.0)),
    ("not a tuner move", replace(PROVEN, canary=False)),
])  # fmt: skip
def test_otherwise_the_canary_runs(why: str, target: machine.RolloutTarget) -> None:
    assert machine.skip_canary(target, models.RolloutStatus()) == "", why
    d = start(target)
    assert "CanarySkipped" not in [e.reason for e in d.events], why
    if target.canary:
        assert d.state.phase == "Canary" and d.state.canary_pods == ["engine-0"], why


def test_a_candidate_rolled_back_since_is_no_longer_proven() -> None:
    rolled = models.RolloutStatus(phase="Idle", result="RolledBack", candidate=NEW, baseline=OLD,
                                  finished_at=machine.stamp(T0 - 10_000))  # fmt: skip
    assert machine.skip_canary(PROVEN, rolled) == ""
    assert start(PROVEN, rolled).state.phase == "Canary"
    # Another setting's rollback does not count against it.
    other = rolled.model_copy(update={"candidate": S(threshold=1024)})
    assert machine.skip_canary(PROVEN, other) != ""


def test_the_rule_reads_proven_settings_and_the_gain_from_status_and_the_tuner() -> None:
    sd = models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod"},
        "spec": {"engine": {"image": "i", "model": "m"}, "tuning": {"mode": "Auto"},
                 "prometheus": {"url": "http://p:9090"}},
        "status": {"leftSettings": [{"setting": {"threshold": 4096, "schedulePolicy": "srpt"},
                                     "leftAt": "2026-12-02T10:00:00Z"}]},
    })  # fmt: skip
    rec = tuning.Recommendation(NEW, True, "gain", gain=0.8)
    target = tuning.target(sd, rec)
    assert target is not None and target.proven == (NEW,) and target.gain == 0.8
    assert machine.skip_canary(target, models.RolloutStatus()) != ""
