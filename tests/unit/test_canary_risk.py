"""The canary's risk rule (rollout.machine.skip_canary): a tuner's candidate not rolled back
since skips its canary when it caps each prefill harder than the fleet, or when it is
proven on this deployment and its predicted gain is large; the rollout says so (a
CanarySkipped Event, status.rollout.message and reason)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slipstream.api import models
from slipstream.controller import tuning
from slipstream.rollout import machine

S = models.EngineSetting
C = 8192
STOCK = S(threshold=0)
CAP = S(threshold=4096, schedule_policy="srpt")
TIGHT = S(threshold=2048, schedule_policy="srpt")
POLICY = machine.RolloutPolicy(canary_replicas=1, analysis_window_s=120, retry_after_s=600, chunked_prefill_size=C)
T0 = 1_800_000_000.0
NOTHING = models.RolloutStatus()


def pods(fleet: S) -> list[machine.Pod]:
    return [machine.Pod(f"engine-{i}", fleet) for i in range(3)]


def target(setting: S, gain: float = 0.9, proven: tuple[S, ...] = ()) -> machine.RolloutTarget:
    return machine.RolloutTarget(setting, "predicted worst-tenant p99 TTFT 28 s -> 2.5 s", canary=True, gain=gain,
                                 proven=proven)  # fmt: skip


def start(fleet: S, t: machine.RolloutTarget, state: models.RolloutStatus | None = None) -> machine.RolloutDecision:
    return machine.advance(state, fleet, t, pods(fleet), POLICY, T0)


def assert_skipped(d: machine.RolloutDecision, fleet: S, words: str) -> None:
    assert d.action == "Promote" and d.state.phase == "Promoting" and not d.state.canary_pods
    # The ConfigMap first (a pod starting now gets the candidate), then every pod at once.
    assert set(d.apply) == {p.name for p in pods(fleet)} and d.configmap == d.state.candidate and d.fleet == fleet
    (event,) = d.events
    assert event.reason == "CanarySkipped" and "canary skipped" in event.message and words in event.message
    assert "%" in event.message
    # Visible in status too: the rollout's message and reason (the ThresholdChanged Event's words).
    persisted = models.RolloutStatus.model_validate(d.state.to_k8s())
    assert "canary skipped" in (persisted.message or "") and "canary skipped" in (persisted.reason or "")


def assert_canary(d: machine.RolloutDecision, why: str) -> None:
    assert "CanarySkipped" not in [e.reason for e in d.events], why
    assert d.state.phase == "Canary" and d.state.canary_pods == ["engine-0"], why


def test_a_proven_candidate_with_a_large_gain_skips_the_canary() -> None:
    # 2048 -> 4096 caps less (concurrency 4 -> 2): only being proven here lets it skip.
    assert_skipped(start(TIGHT, target(CAP, proven=(STOCK, CAP))), TIGHT, "ran threshold=4096")


def test_a_harder_cap_with_a_large_gain_skips_the_canary_unproven() -> None:
    # Stock -> 4096 (concurrency 1 -> 2) and 4096 -> 2048 (2 -> 4): never run here, still skipped.
    assert_skipped(start(STOCK, target(CAP)), STOCK, "concurrency 1 -> 2")
    assert_skipped(start(CAP, target(TIGHT)), CAP, "concurrency 2 -> 4")
    # Any gain the tuner moves for will do: the way back is the careful one.
    assert_skipped(start(STOCK, target(CAP, gain=0.25)), STOCK, "predicted gain 25%")


@pytest.mark.parametrize("why, fleet, t", [
    ("caps less, never ran here", TIGHT, target(CAP, proven=(STOCK,))),
    ("a step back to stock, never ran here", CAP, target(STOCK)),
    ("another order alone, never ran here", CAP, target(S(threshold=4096, schedule_policy="fcfs"))),
    ("another mode alone, never ran here", CAP, target(S(threshold=4096, mode="floor", schedule_policy="srpt"))),
    ("proven, gain below SKIP_GAIN", TIGHT, target(CAP, gain=machine.SKIP_GAIN - 0.01, proven=(CAP,))),
    ("a harder cap, no predicted gain", STOCK, target(CAP, gain=0.0)),
])  # fmt: skip
def test_otherwise_the_canary_runs(why: str, fleet: S, t: machine.RolloutTarget) -> None:
    assert machine.skip_canary(t, NOTHING, fleet, C) == "", why
    assert_canary(start(fleet, t), why)


def test_a_fixed_edit_is_no_tuner_move_and_has_no_canary_to_skip() -> None:
    t = replace(target(CAP), canary=False)
    assert machine.skip_canary(t, NOTHING, STOCK, C) == ""
    d = start(STOCK, t)
    assert [e.reason for e in d.events] == ["RolloutStarted"] and d.state.phase == "Promoting"


@pytest.mark.parametrize("fleet, t", [(TIGHT, target(CAP, proven=(CAP,))), (STOCK, target(CAP))])
def test_a_candidate_rolled_back_since_runs_its_canary_again(fleet: S, t: machine.RolloutTarget) -> None:
    rolled = models.RolloutStatus(phase="Idle", result="RolledBack", candidate=CAP, baseline=fleet,
                                  finished_at=machine.stamp(T0 - 10_000))  # fmt: skip
    assert machine.skip_canary(t, rolled, fleet, C) == ""
    assert start(fleet, t, rolled).state.phase == "Canary"
    # Another setting's rollback does not count against it.
    other = rolled.model_copy(update={"candidate": S(threshold=1024)})
    assert machine.skip_canary(t, other, fleet, C) != ""


def test_the_rule_reads_proven_settings_and_the_gain_from_status_and_the_tuner() -> None:
    sd = models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod"},
        "spec": {"engine": {"image": "i", "model": "m"}, "tuning": {"mode": "Auto"},
                 "prometheus": {"url": "http://p:9090"}},
        "status": {"leftSettings": [{"setting": {"threshold": 4096, "schedulePolicy": "srpt"},
                                     "leftAt": "2026-12-02T10:00:00Z"}]},
    })  # fmt: skip
    rec = tuning.Recommendation(CAP, True, "gain", gain=0.8)
    t = tuning.target(sd, rec)
    assert t is not None and t.proven == (CAP,) and t.gain == 0.8
    assert machine.skip_canary(t, NOTHING, TIGHT, C) != ""
