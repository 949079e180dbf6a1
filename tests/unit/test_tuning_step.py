"""The pure parts of the tuning loop: targets by mode, the rollout policy from the spec (time
scaled), conditions, one Warning per new problem, the status patch, and the canary query."""

from __future__ import annotations

import math
from typing import Any

import pytest

from slipstream.api import models, snapshot
from slipstream.controller import loop, tuning
from slipstream.controller import settings as settings_
from slipstream.rollout import analysis, machine, sequential

S = models.EngineSetting


def make(tuning_: dict[str, Any] | None = None, status_: dict[str, Any] | None = None) -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 2},
        "spec": {"replicas": 2, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 64},
                 "tuning": {"mode": "Fixed", "threshold": 4096, **(tuning_ or {})},
                 "prometheus": {"url": "http://127.0.0.1:9090"}},
        "status": status_ or {},
    })  # fmt: skip


REC = tuning.Recommendation(S(threshold=2048, schedule_policy="srpt"), True, "heterogeneity 0.81", 0.81)


def test_targets_by_mode() -> None:
    fixed = tuning.target(make(), None)
    assert fixed is not None and fixed.setting == S(threshold=4096) and not fixed.canary
    off = tuning.target(make({"mode": "Off"}), REC)
    assert off is not None and off.setting.threshold == 0 and not off.canary
    rec = tuning.target(make({"mode": "Recommend", "threshold": 1024}), REC)
    assert rec is not None and rec.setting.threshold == 1024, "Recommend never runs the recommendation"
    auto = tuning.target(make({"mode": "Auto"}), REC)
    assert auto is not None and auto.setting == REC.setting and auto.canary and auto.reason == "heterogeneity 0.81"
    assert tuning.target(make({"mode": "Auto"}), None) is None, "no valid snapshot: hold"
    held = tuning.Recommendation(REC.setting, False, "within hysteresis")
    assert tuning.target(make({"mode": "Auto"}), held) is None


def test_policy_scales_the_spec_durations() -> None:
    sd = make({"intervalSeconds": 60, "cooldownSeconds": 600, "rollout": {"analysisWindowSeconds": 300,
                                                                          "canaryReplicas": 1}})  # fmt: skip
    config = settings_.ControllerSettings(tuning_time_scale=0.1)
    pol = tuning.policy(sd, config)
    assert (pol.analysis_window_s, pol.retry_after_s, pol.canary_replicas) == (30, 60, 1)
    assert tuning.interval(sd, config) == 6


def decision(in_flight: bool = False) -> machine.RolloutDecision:
    state = models.RolloutStatus(phase="Canary" if in_flight else "Idle", candidate=S(threshold=2048))
    return machine.RolloutDecision("Hold", state, S(threshold=4096), S(threshold=4096))


def test_conditions_and_one_warning_per_new_problem() -> None:
    sd = make({"mode": "Auto"})
    bad = snapshot.invalid("prod/kimi", 0, 60, snapshot.UNREACHABLE, "connection refused")
    pods = [machine.Pod("a", S(threshold=4096)), machine.Pod("b", None, "timed out")]
    first = tuning.conditions(sd, [], decision(), pods, bad, "2026-01-01T00:00:00Z")
    by = {c.type: c for c in first}
    assert (by["MetricsAvailable"].status, by["MetricsAvailable"].reason) == ("False", "PrometheusUnreachable")
    assert (by["EnginesInSync"].status, by["EnginesInSync"].reason) == ("False", "PodsUnreachable")
    assert "b (timed out)" in by["EnginesInSync"].message
    assert by["RolloutProgressing"].status == "False"
    warned = tuning.new_warnings([], first)
    assert sorted(e.reason for e in warned) == ["PodsUnreachable", "PrometheusUnreachable"]
    again = tuning.conditions(sd, first, decision(), pods, bad, "2026-01-01T00:01:00Z")
    assert tuning.new_warnings(first, again) == [], "the same problem next interval: no new Event"
    stale = snapshot.invalid("prod/kimi", 0, 60, snapshot.STALE, "newest sample 300 s old")
    changed = tuning.conditions(sd, again, decision(), pods, stale, "2026-01-01T00:02:00Z")
    assert [e.reason for e in tuning.new_warnings(again, changed)] == ["StaleMetrics"]
    flight = tuning.conditions(sd, [], decision(in_flight=True), pods, None, "t")
    assert {c.type: c.reason for c in flight}["RolloutProgressing"] == "Canary"
    assert "MetricsAvailable" not in {c.type for c in tuning.conditions(make(), [], decision(), pods, None, "t")}


def test_status_patch_shows_the_fleet_and_the_decision() -> None:
    sd = make({"mode": "Auto"})
    tenant = snapshot.TenantWindow("acme", 2.0, snapshot.histogram_of([0.5] * 99 + [3.0], (1.0, 2.0, 4.0)),
                                   snapshot.histogram_of([100.0], (1000.0,)))  # fmt: skip
    snap = snapshot.WorkloadSnapshot("prod/kimi", 0, 60, tenants=(tenant,))
    d = decision(in_flight=True)
    d = machine.RolloutDecision("StartCanary", d.state.model_copy(update={"baseline": S(threshold=4096), "reason": "why"}),
                         S(threshold=4096), S(threshold=4096))  # fmt: skip
    patch = tuning.status_patch(sd, d, [], snap, REC, True, "2026-01-01T00:00:00Z")
    assert (patch["threshold"], patch["concurrency"]) == (4096, 2), "status shows what runs, not the candidate"
    assert patch["rollout"]["phase"] == "Canary" and patch["heterogeneity"] == 0.81
    assert patch["recommendation"] == {"threshold": 2048, "mode": "ceiling", "schedulePolicy": "srpt"}
    assert patch["lastDecision"]["from"]["threshold"] == 4096 and patch["lastDecision"]["to"]["threshold"] == 2048
    assert patch["tenants"][0]["name"] == "acme" and patch["tenants"][0]["targetSeconds"] == 2.0
    models.ServingDeploymentStatus.model_validate(patch)


def test_a_promotion_records_the_setting_it_left() -> None:
    promoted = models.RolloutStatus(phase="Idle", result="Promoted", candidate=S(threshold=2048),
                                    baseline=S(threshold=4096))  # fmt: skip
    d = machine.RolloutDecision("Promoted", promoted, S(threshold=2048), S(threshold=2048))
    patch = tuning.status_patch(make({"mode": "Auto"}), d, [], None, None, False, "2026-01-01T00:10:00Z")
    assert patch["leftSettings"] == [{"setting": S(threshold=4096).to_k8s(), "leftAt": "2026-01-01T00:10:00Z"}]
    # The list is bounded: a ninth promotion drops the oldest entry.
    full = [{"setting": S(threshold=k).to_k8s(), "leftAt": "2026-01-01T00:00:00Z"} for k in range(8)]
    patch = tuning.status_patch(make({"mode": "Auto"}, {"leftSettings": full}), d, [], None, None, False,
                                "2026-01-01T00:10:00Z")  # fmt: skip
    assert len(patch["leftSettings"]) == 8 and patch["leftSettings"][0]["setting"]["threshold"] == 1
    assert patch["leftSettings"][-1]["setting"]["threshold"] == 4096
    models.ServingDeploymentStatus.model_validate(patch)
    # Any other step leaves the list alone (a rollback returned to the baseline: nothing left).
    assert "leftSettings" not in tuning.status_patch(make({"mode": "Auto"}), decision(), [], None, None, False,
                                                     "2026-01-01T00:10:00Z")  # fmt: skip


def test_recommend_mode_reports_a_new_recommendation_once() -> None:
    sd = make({"mode": "Recommend"})
    event = tuning.recommended_event(sd, S(threshold=4096), REC)
    assert event is not None and event.reason == "Recommended" and "not applied" in event.message
    seen = make({"mode": "Recommend"}, {"recommendation": REC.setting.to_k8s()})
    assert tuning.recommended_event(seen, S(threshold=4096), REC) is None


def test_the_twin_recommender_moves_on_heterogeneous_traffic_and_holds_after() -> None:
    from test_tune import heterogeneous

    from slipstream.controller import stages
    from slipstream.sim import policies
    from slipstream.tune import deployment

    config = settings_.ControllerSettings(tuning_time_scale=0.1, observe_min_samples=50)
    sd = make({"mode": "Auto", "threshold": 0, "cooldownSeconds": 600})
    recommender = stages.TwinRecommender(config)
    rec = recommender.recommend(sd, heterogeneous(), S(threshold=0), 1000.0)
    assert rec.move and rec.setting != S(threshold=0), rec
    assert rec.heterogeneity is not None and rec.heterogeneity > 0.8
    assert rec.reason.startswith("heterogeneity 0.")
    # The twin ran the deployment's own engine (C 8192, page 64), not the twin's defaults:
    # the memo keys each run by (setting, spec, recommender, profile, engine config).
    assert recommender.memo is not None
    (entry,) = recommender.memo.entries.values()
    assert entry.key[-1] == deployment.engine_config(sd.spec) == policies.EngineConfig(chunked_prefill_size=8192, page_size=64)
    # a step was taken 10 s ago: the cooldown (600 s x 0.1) holds, and says so
    moved = make({"mode": "Auto", "threshold": 0, "cooldownSeconds": 600},
                 {"lastDecision": {"time": machine.stamp(990.0), "to": rec.setting.to_k8s(), "reason": "r"}})  # fmt: skip
    held = stages.TwinRecommender(config).recommend(moved, heterogeneous(), rec.setting, 1000.0)
    assert not held.move and held.reason.startswith("Cooldown"), held
    # ... and the hold still reports the window's mix: status.mixedAt is written from it
    assert held.heterogeneity is not None and held.heterogeneity > tuning.MIXED
    patch = tuning.status_patch(moved, decision(), [], heterogeneous(), held, False, "2026-01-01T00:00:00Z")
    assert patch["mixedAt"] == "2026-01-01T00:00:00Z"
    # a step the queue mix brought forward may cap harder during the cooldown
    urgent = stages.TwinRecommender(config).recommend(moved, heterogeneous(), S(threshold=0), 1000.0, jumped=True)
    assert urgent.move and "cooldown" in urgent.reason, urgent
    # a promotion left rec.setting 100 s ago (past the 60 s cooldown, within 3 of them): no return
    left = make({"mode": "Auto", "threshold": 0, "cooldownSeconds": 600},
                {"lastDecision": {"time": machine.stamp(900.0), "to": {"threshold": 0}, "reason": "r"},
                 "leftSettings": [{"setting": rec.setting.to_k8s(), "leftAt": machine.stamp(900.0)}]})  # fmt: skip
    dwelling = settings_.ControllerSettings(tuning_time_scale=0.1, observe_min_samples=50,
                                            tuner_dwell_cooldowns=3.0)
    dwell = stages.TwinRecommender(dwelling).recommend(left, heterogeneous(), S(threshold=0), 1000.0)
    assert not dwell.move and dwell.reason.startswith("Dwell"), dwell
    # the operator's default has no dwell: a changed mix is followed at once
    free = stages.TwinRecommender(config).recommend(left, heterogeneous(), S(threshold=0), 1000.0)
    assert free.move, free
    bad = snapshot.invalid("prod/kimi", 1000.0, 60, snapshot.STALE, "old")
    stale = stages.TwinRecommender(config).recommend(sd, bad, S(threshold=0), 1000.0)
    assert not stale.move and stale.reason.startswith("StaleMetrics")


def test_engine_addresses_and_allowed_networks() -> None:
    sd = make()
    assert loop.address(sd, "10.1.2.3") == "http://10.1.2.3:30000"
    assert loop.address(sd, "fd00::1") == "http://[fd00::1]:30000"
    assert loop.allowed("http://127.0.0.1:5", "127.0.0.0/8")
    assert not loop.allowed("http://10.1.2.3:30000", "127.0.0.0/8")
    assert loop.allowed("http://10.1.2.3:30000", "")
    ready = {"metadata": {"name": "a"}, "status": {"podIP": "127.1.0.2",
                                                   "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    going = {"metadata": {"name": "b", "deletionTimestamp": "x"}, "status": ready["status"]}
    unready = {"metadata": {"name": "c"}, "status": {"podIP": "127.1.0.3", "conditions": []}}
    assert loop.ready_pods([ready, going, unready]) == {"a": "127.1.0.2"}


def test_conditions_rebased_on_a_fresh_read_keep_the_other_writers() -> None:
    from slipstream.controller import status

    stored = [{"type": "Reconciled", "status": "True", "reason": "Applied", "lastTransitionTime": "t"},
              {"type": "EnginesInSync", "status": "True", "reason": "AllPodsOnSetting", "lastTransitionTime": "t"}]
    patch = {"conditions": [
        {"type": "Reconciled", "status": "False", "reason": "Stale", "lastTransitionTime": "t"},
        {"type": "EnginesInSync", "status": "False", "reason": "PodsUnreachable", "lastTransitionTime": "t"},
        {"type": "RolloutProgressing", "status": "False", "reason": "Idle", "lastTransitionTime": "t"}]}  # fmt: skip
    merged = status.merged_conditions(stored, patch, tuning.CONDITIONS)
    assert [(c["type"], c["reason"]) for c in merged["conditions"]] == [
        ("Reconciled", "Applied"), ("EnginesInSync", "PodsUnreachable"), ("RolloutProgressing", "Idle")]
    assert merged["phase"] == "Progressing"


def test_generated_admin_keys_are_derived_per_deployment() -> None:
    from slipstream.controller.clients import adminkeys

    a = adminkeys.derive("seed-1", "prod", "kimi")
    assert a == adminkeys.derive("seed-1", "prod", "kimi") and len(a) == 48
    assert a != adminkeys.derive("seed-1", "prod", "kimi2") != adminkeys.derive("seed-1", "dev", "kimi")
    assert a != adminkeys.derive("seed-2", "prod", "kimi")


def test_a_spec_the_models_refuse_names_the_field_and_degrades() -> None:
    import pydantic

    from slipstream.controller import status

    bad = {"metadata": {"name": "x"}, "spec": {"engine": {"image": "i", "model": "m",
                                                          "env": [{"name": "1 BAD=", "value": "v"}]}}}  # fmt: skip
    with pytest.raises(pydantic.ValidationError) as raised:
        models.ServingDeployment.model_validate(bad)
    message = status.invalid_spec_message(raised.value)
    assert "spec.engine.env[0].name" in message and message.endswith("fix these fields")
    patch = status.invalid_spec_patch([{"type": "Ready", "status": "True", "reason": "Available",
                                        "lastTransitionTime": "t"}], message, 3, "now")  # fmt: skip
    assert patch["phase"] == "Degraded"
    assert [(c["type"], c["status"], c["reason"]) for c in patch["conditions"]] == [
        ("Ready", "True", "Available"), ("Reconciled", "False", "InvalidSpec")]


def test_each_deployment_gets_its_canary_source_from_the_fleet() -> None:
    from slipstream.controller import stages

    config = settings_.ControllerSettings(tuning_time_scale=0.1, canary_min_samples=7)
    fleet = stages.fleet_observer(config)
    latency = stages.latency_for(fleet, config)
    source = latency(make({"mode": "Auto", "intervalSeconds": 60}))
    assert source.min_samples == 7 and source.tenant_label == "tenant"
    assert source.observer is fleet.observer("http://127.0.0.1:9090", 6.0, "tenant")
    assert latency(make({"mode": "Auto", "intervalSeconds": 60})).observer is source.observer


def test_a_window_the_twin_does_not_explain_is_model_mismatch_with_one_event() -> None:
    """The operator's side of the model check: `MetricsAvailable=False` reason ModelMismatch,
    one Warning giving both numbers (not one per interval), the worst ratio in status and
    the per-tenant gauge."""
    from test_tune import heterogeneous

    from slipstream.controller import stages

    sd = make({"mode": "Auto", "threshold": 0})
    good = heterogeneous()
    pods = [machine.Pod("a", S(threshold=4096))]
    words = "the twin does not explain the window: twin predicts chat p99 TTFT 31.20 s, engines observed 2.40 s"
    bad = tuning.Recommendation(S(threshold=4096), False, "ModelMismatch: " + words, 0.8,
                                (("chat", 31.2, 2.4), ("agent", 0.5, 0.4)), words)
    first = tuning.conditions(sd, [], decision(), pods, good, "2026-01-01T00:00:00Z", bad)
    cond = {c.type: c for c in first}["MetricsAvailable"]
    assert (cond.status, cond.reason, cond.message) == ("False", "ModelMismatch", words)
    (event,) = tuning.new_warnings([], first)
    assert event.type == "Warning" and event.reason == "ModelMismatch" and "31.20 s" in event.message and "2.40 s" in event.message
    again = tuning.conditions(sd, first, decision(), pods, good, "2026-01-01T00:01:00Z", bad)
    assert tuning.new_warnings(first, again) == []
    patch = tuning.status_patch(sd, decision(), again, good, bad, False, "2026-01-01T00:01:00Z")
    assert patch["predictionErrorRatio"] == 13.0
    models.ServingDeploymentStatus.model_validate(patch)
    # Agreeing again: Fresh, and no mismatch.
    ok = tuning.Recommendation(S(threshold=4096), False, "AtBest", 0.8, (("chat", 2.0, 2.4),))
    fresh = {c.type: c for c in tuning.conditions(sd, again, decision(), pods, good, "t", ok)}["MetricsAvailable"]
    assert (fresh.status, fresh.reason) == ("True", "Fresh")
    # The stage fills both from the tuner and sets the gauge per tenant.
    def decisions() -> float:
        return sum(sample.value for metric in stages.DECISIONS.collect() for sample in metric.samples
                   if sample.name.endswith("_total"))

    decided_before = decisions()
    rec = stages.TwinRecommender(settings_.ControllerSettings(observe_min_samples=50)).recommend(
        sd, good, S(threshold=0), 1000.0)
    assert rec.prediction and not rec.model_mismatch
    name, predicted, observed = rec.prediction[0]
    got = stages.PREDICTION_ERROR.labels("prod", "kimi", name)._value.get()
    assert got == pytest.approx(max(predicted, 1e-3) / observed)
    # ... and the heterogeneity gauge and the decisions counter the dashboard draws.
    assert stages.HETEROGENEITY.labels("prod", "kimi")._value.get() == pytest.approx(rec.heterogeneity)
    assert decisions() == decided_before + 1


# -- status that is true now ---------------------------------------------------------------

POLICY = machine.RolloutPolicy(canary_replicas=1, analysis_window_s=300, max_regression_percent=5, max_attempts=3,
                        retry_after_s=600, chunked_prefill_size=8192)  # fmt: skip


def test_a_cleared_problem_leaves_the_rollout_message() -> None:
    """RolloutProgressing=False Promoted must not keep "cannot read the setting of ..." once
    every pod answers again (EnginesInSync=True)."""
    sd = make({"mode": "Auto"})
    new = S(threshold=2048)
    promoted = models.RolloutStatus(phase="Idle", result="Promoted", candidate=new, baseline=S(threshold=4096),
                                    message="4096 -> 2048: every pod runs 2048")  # fmt: skip
    down = [machine.Pod("a", new), machine.Pod("b", None, "connection refused")]
    held = machine.advance(promoted, new, None, down, POLICY, 1_800_000_000.0)
    conds = tuning.conditions(sd, [], held, down, None, "2026-01-01T00:00:00Z")
    by = {c.type: c for c in conds}
    assert "cannot read the setting of b (connection refused)" in by["RolloutProgressing"].message
    up = [machine.Pod("a", new), machine.Pod("b", new)]
    later = machine.advance(held.state, new, None, up, POLICY, 1_800_000_060.0)
    after = {c.type: c for c in tuning.conditions(sd, conds, later, up, None, "2026-01-01T00:01:00Z")}
    assert after["EnginesInSync"].status == "True"
    progressing = after["RolloutProgressing"]
    assert (progressing.status, progressing.reason) == ("False", "Promoted")
    assert "cannot read" not in progressing.message and "connection refused" not in progressing.message
    assert progressing.message == "4096 -> 2048: every pod runs 2048", "the result's own message comes back"
    assert "cannot read" not in (later.state.message or ""), "status.rollout.message is cleared too"


@pytest.mark.parametrize("mode", ["Fixed", "Off"])
def test_a_recommendation_is_cleared_outside_auto_and_recommend(mode: str) -> None:
    """Auto's last recommendation must not stay in status under Fixed or Off."""
    sd = make({"mode": mode}, {"recommendation": REC.setting.to_k8s(), "heterogeneity": 0.81})
    patch = tuning.status_patch(sd, decision(), [], None, None, False, "2026-01-01T00:00:00Z")
    assert "recommendation" in patch and patch["recommendation"] is None, "a merge patch's null removes it"
    models.ServingDeploymentStatus.model_validate(patch)


@pytest.mark.parametrize("mode", ["Auto", "Recommend"])
def test_a_recommendation_stays_in_the_modes_that_write_it(mode: str) -> None:
    sd = make({"mode": mode}, {"recommendation": REC.setting.to_k8s()})
    assert "recommendation" not in tuning.status_patch(sd, decision(), [], None, None, False, "t"), (
        "no new recommendation this step (a held gate): the last one stays"
    )
    assert tuning.status_patch(sd, decision(), [], None, REC, False, "t")["recommendation"] == REC.setting.to_k8s()


def test_a_window_that_is_starting_is_no_warning() -> None:
    """Every traffic start has too few samples at first: a Normal Event, not a Warning; a
    real problem after it is still a Warning."""
    sd = make({"mode": "Auto"})
    pods = [machine.Pod("a", S(threshold=4096))]
    few = snapshot.invalid("prod/kimi", 0, 60, snapshot.TOO_FEW_SAMPLES, "3 first tokens, 20 needed")
    first = tuning.conditions(sd, [], decision(), pods, few, "2026-01-01T00:00:00Z")
    events = tuning.new_warnings([], first)
    assert [(e.type, e.reason) for e in events] == [("Normal", "TooFewSamples")]
    bad = snapshot.invalid("prod/kimi", 0, 60, snapshot.UNREACHABLE, "connection refused")
    then = tuning.conditions(sd, first, decision(), pods, bad, "2026-01-01T00:01:00Z")
    assert [(e.type, e.reason) for e in tuning.new_warnings(first, then)] == [("Warning", "PrometheusUnreachable")]


class RecordedCells:
    """A canary source answering with fixed cells (what `stages.size_class_cells` makes of
    Prometheus's answer), recording what it was asked."""

    def __init__(self, canary_mean_s: float) -> None:
        self.canary_mean_s = canary_mean_s
        self.asked: list[tuple[list[str], list[str], float, float, float]] = []

    async def tenant_p99(self, *args: object) -> dict[str, float]:
        raise AssertionError("the sequential rule does not read one window's p99")

    async def sub_windows(self, namespace: str, deployment: str, canaries: list[str], baseline: list[str],
                          start_s: float, end_s: float, sub_s: float) -> list[sequential.SubWindow]:  # fmt: skip
        self.asked.append((canaries, baseline, start_s, end_s, sub_s))
        cell = ("chat", "le1k")
        n = int((end_s - start_s) // sub_s)
        return [sequential.SubWindow(start_s + k * sub_s, start_s + (k + 1) * sub_s,
                                     {cell: sequential.CellHistogram(20, 20 * self.canary_mean_s)},
                                     {cell: sequential.CellHistogram(20, 20.0)}) for k in range(n)]  # fmt: skip


@pytest.mark.parametrize(("canary_mean_s", "outcome"), [(1.0, "Promote"), (3.0, "Rollback")])
def test_the_sequential_rule_reads_sub_windows_since_the_analysis_began(canary_mean_s: float, outcome: str) -> None:
    import asyncio

    config = settings_.ControllerSettings(tuning_time_scale=0.1, canary_sub_window_seconds=10,
                                          engine_scrape_interval_seconds=0.5)  # fmt: skip
    source = RecordedCells(canary_mean_s)
    deps = loop.Deps(kube=None, config=config, keys=None, latency=lambda sd: source)  # type: ignore[arg-type]
    sd = make({"mode": "Auto", "intervalSeconds": 60, "rollout": {"analysisWindowSeconds": 300}})
    t0 = 1_800_000_000.0
    state = models.RolloutStatus(phase="Analysis", canary_pods=["kimi-0"], started_at=machine.stamp(t0))
    pods = {"kimi-0": "http://a", "kimi-1": "http://b", "kimi-2": "http://c"}
    verdict = asyncio.run(loop.analyse(deps, sd, state, pods, t0 + 30))
    assert source.asked == [(["kimi-0"], ["kimi-1", "kimi-2"], t0, t0 + 30, 1.0)]
    assert verdict.outcome == outcome and f"{outcome} (crossed)" in verdict.summary
    # undecided before the window ends, decided at it and after
    short = asyncio.run(loop.analyse(deps, sd, state, pods, t0 + 3))
    assert short.outcome == "Continue"
    final = asyncio.run(loop.analyse(deps, sd, state, pods, t0 + 3 * 30))
    assert final.outcome == outcome


class GappedCells(RecordedCells):
    """`RecordedCells` with a scrape gap: the sub-windows that start in [gap_from, gap_to)
    seconds after the analysis began have no series at all."""

    def __init__(self, canary_mean_s: float, gap: tuple[float, float]) -> None:
        super().__init__(canary_mean_s)
        self.gap = gap

    async def sub_windows(self, namespace: str, deployment: str, canaries: list[str], baseline: list[str],
                          start_s: float, end_s: float, sub_s: float) -> list[sequential.SubWindow]:  # fmt: skip
        windows = await super().sub_windows(namespace, deployment, canaries, baseline, start_s, end_s, sub_s)
        return [sequential.SubWindow(w.start_s, w.end_s, {}, {}, scraped=False)
                if self.gap[0] <= w.start_s - start_s < self.gap[1] else w for w in windows]  # fmt: skip


def test_a_scrape_gap_in_the_analysis_holds_the_truncated_decision_until_its_length_is_made_up() -> None:
    """A canary no better and no worse leans to Promote at the limit (truncated); with 20 of
    its 30 sub-windows blind it must not decide on the other 10 then, but 20 s later."""
    config = settings_.ControllerSettings(tuning_time_scale=0.1, canary_sub_window_seconds=10,
                                          engine_scrape_interval_seconds=0.5)  # fmt: skip
    source = GappedCells(math.sqrt(2.0), gap=(5.0, 25.0))  # scores 0.5 each: the statistic stays at 0
    at_limit = analysed(source, config, 30)
    assert at_limit.outcome == "Continue" and at_limit.blind_s == 20.0
    assert "20 s of the analysis had no samples" in at_limit.summary
    later = analysed(source, config, 50)
    assert later.outcome == "Promote" and "Promote (truncated)" in later.summary
    assert analysed(RecordedCells(math.sqrt(2.0)), config, 30).outcome == "Promote"


def analysed(source: object, config: settings_.ControllerSettings, after_s: float) -> analysis.Verdict:
    """The verdict `after_s` seconds into an analysis of canary kimi-0 against kimi-1 (a
    300 s analysis window at time scale 0.1: a 30 s limit), read from ``source``."""
    import asyncio

    deps = loop.Deps(kube=None, config=config, keys=None, latency=lambda sd: source)  # type: ignore[arg-type]
    sd = make({"mode": "Auto", "intervalSeconds": 60, "rollout": {"analysisWindowSeconds": 300}})
    t0 = 1_800_000_000.0
    state = models.RolloutStatus(phase="Analysis", canary_pods=["kimi-0"], started_at=machine.stamp(t0))
    return asyncio.run(loop.analyse(deps, sd, state, {"kimi-0": "http://a", "kimi-1": "http://b"}, t0 + after_s))


@pytest.mark.parametrize(("scale", "scrape_s", "expected_s"), [(1.0, 5.0, 10.0), (1.0, 15.0, 30.0), (0.125, 1.0, 2.0),
                                                                (0.125, 0.5, 1.25)])  # fmt: skip
def test_canary_sub_windows_hold_two_scrapes_at_least(scale: float, scrape_s: float, expected_s: float) -> None:
    """A sub-window shorter than two scrapes has one sample per series, so ``increase`` has
    no value and the sequential rule no cell: at time scale 8 (0.125) a 10 s sub-window is
    1.25 wall seconds, under two of the local stack's 1 s scrapes."""
    config = settings_.ControllerSettings(tuning_time_scale=scale, canary_sub_window_seconds=10,
                                          engine_scrape_interval_seconds=scrape_s)  # fmt: skip
    assert loop.sub_window_s(config) == pytest.approx(expected_s)


class NoSizeClassSeries:
    """Engines without the size-class TTFT histogram: Prometheus answers no series for any
    sub-window (unscraped, as `stages.size_class_cells` marks them), the pods never had one
    (``exported``: False), and one window's per-tenant p99 is all there is. With
    ``exported`` True it is a scrape gap over the whole analysis instead."""

    def __init__(self, canary_p99_s: float, exported: bool = False) -> None:
        self.canary_p99_s = canary_p99_s
        self.exported = exported
        self.p99_asked: list[list[str]] = []
        self.export_asked: list[tuple[list[str], float]] = []

    async def exports_size_classes(self, namespace: str, deployment: str, pods: list[str], end_s: float,
                                   lookback_s: float) -> bool:  # fmt: skip
        self.export_asked.append((list(pods), lookback_s))
        return self.exported

    async def tenant_p99(self, namespace: str, deployment: str, pods: list[str], start_s: float,
                         end_s: float) -> dict[str, float]:  # fmt: skip
        self.p99_asked.append(list(pods))
        return {"chat": self.canary_p99_s if pods == ["kimi-0"] else 2.0}

    async def sub_windows(self, namespace: str, deployment: str, canaries: list[str], baseline: list[str],
                          start_s: float, end_s: float, sub_s: float) -> list[sequential.SubWindow]:  # fmt: skip
        n = int((end_s - start_s) // sub_s)
        return [sequential.SubWindow(start_s + k * sub_s, start_s + (k + 1) * sub_s, {}, {}, scraped=False)
                for k in range(n)]  # fmt: skip


@pytest.mark.parametrize(("canary_p99_s", "outcome"), [(2.2, "Promote"), (9.0, "Rollback")])
def test_engines_without_size_class_series_are_judged_by_one_windows_p99(canary_p99_s: float, outcome: str) -> None:
    """Without the fallback the rule finds nothing to judge by and, at its limit, rolls back
    every move on such engines."""
    import asyncio

    config = settings_.ControllerSettings(tuning_time_scale=0.1, engine_scrape_interval_seconds=0.5)
    source = NoSizeClassSeries(canary_p99_s)
    deps = loop.Deps(kube=None, config=config, keys=None, latency=lambda sd: source)  # type: ignore[arg-type]
    sd = make({"mode": "Auto", "intervalSeconds": 60, "rollout": {"analysisWindowSeconds": 300}})
    t0 = 1_800_000_000.0
    state = models.RolloutStatus(phase="Analysis", canary_pods=["kimi-0"], started_at=machine.stamp(t0))
    pods = {"kimi-0": "http://a", "kimi-1": "http://b"}
    for now in (t0 + 30, t0 + 3 * 30):  # at the analysis window, and at the limit
        verdict = asyncio.run(loop.analyse(deps, sd, state, pods, now))
        assert verdict.outcome == outcome, verdict.summary
        assert "the engines export no sglang:ttft_by_size_class_seconds" in verdict.summary
    assert source.p99_asked[:2] == [["kimi-0"], ["kimi-1"]]
    assert source.export_asked[0] == (["kimi-0", "kimi-1"], loop.EXPORT_LOOKBACK_S)


def test_an_analysis_prometheus_missed_entirely_is_not_judged_by_one_windows_p99() -> None:
    """Every sub-window blind, yet the pods did export the size-class series within the
    hour: a scrape gap over the whole analysis. The one-window p99 would judge on what the
    gap left of the window (a promotion on missing data, however good the canary looks), so
    the rule holds, past the limit by the blind time, and then rolls back: nothing to judge by."""
    config = settings_.ControllerSettings(tuning_time_scale=0.1, engine_scrape_interval_seconds=0.5)
    source = NoSizeClassSeries(1.0, exported=True)  # a canary twice as fast: compare would promote
    at_limit = analysed(source, config, 30)
    assert at_limit.outcome == "Continue" and at_limit.blind_s == pytest.approx(30.0), at_limit.summary
    past = analysed(source, config, 60)
    assert past.outcome == "Rollback" and "nothing to judge by" in past.summary
    assert source.p99_asked == []
    assert analysed(NoSizeClassSeries(1.0, exported=False), config, 30).outcome == "Promote"


def test_the_canary_decides_when_its_analysis_window_ends_by_default() -> None:
    """One interval plus one analysis window from a phase change to the fleet: the rule
    must decide at the window's end unless the operator is told to let it go on."""
    sd = make({"mode": "Auto", "rollout": {"analysisWindowSeconds": 120}})
    assert tuning.policy(sd, settings_.ControllerSettings()).analysis_limit_factor == 1.0
    longer = settings_.ControllerSettings(canary_analysis_limit_windows=3)
    assert tuning.policy(sd, longer).analysis_limit_factor == 3.0
    state = models.RolloutStatus(phase="Analysis", canary_pods=["kimi-0"], started_at=machine.stamp(1000.0))
    pol = tuning.policy(sd, settings_.ControllerSettings())
    assert not machine.analysis_final(state, pol, 1000.0 + 119) and machine.analysis_final(state, pol, 1000.0 + 120)


def test_the_fleet_read_is_reused_for_a_scaled_time() -> None:
    from slipstream.controller import stages

    assert stages.fleet_observer(settings_.ControllerSettings()).reuse_s == stages.FLEET_REUSE_S
    fast = stages.fleet_observer(settings_.ControllerSettings(tuning_time_scale=0.125))
    assert fast.reuse_s == stages.FLEET_REUSE_S * 0.125  # under one mix poll (10 s x 0.125)


def test_a_recent_mix_in_status_holds_a_step_back() -> None:
    from test_tune import uniform

    from slipstream.controller import stages

    config = settings_.ControllerSettings(tuning_time_scale=0.1, observe_min_samples=50)
    capped = S(threshold=4096, schedule_policy="srpt")
    spec = {"mode": "Auto", "threshold": 0, "cooldownSeconds": 600}
    calm = stages.TwinRecommender(config).recommend(make(spec), uniform(), capped, 1000.0)
    assert calm.move and calm.setting.threshold == 0, calm
    assert calm.heterogeneity is not None and calm.heterogeneity <= tuning.MIXED
    patch = tuning.status_patch(make(spec), decision(), [], uniform(), calm, False, "2026-01-01T00:00:00Z")
    assert "mixedAt" not in patch  # a near-uniform window leaves the memory alone
    # status.mixedAt 20 s ago (inside the 60 s cooldown at this scale): held, Calm
    recent = make(spec, {"mixedAt": machine.stamp(980.0)})
    held = stages.TwinRecommender(config).recommend(recent, uniform(), capped, 1000.0)
    assert not held.move and held.reason.startswith("Calm"), held


def test_a_model_mismatch_logs_its_window_for_an_offline_replay(caplog: pytest.LogCaptureFixture) -> None:
    """A `ModelMismatch` hold logs the window as the twin read it, in the JSON that
    `slipstream recommend --snapshot` reads, with the command that replays the check."""
    import json
    from dataclasses import replace

    from test_tune import heterogeneous

    from slipstream.api import buckets
    from slipstream.controller import stages
    from slipstream.tune import codec

    good = heterogeneous()
    # Every first token in 5 ms: faster than the profile prefills the prompts, by any rate.
    fast = replace(good, tenants=tuple(
        replace(t, ttft=snapshot.histogram_of([0.005] * round(t.ttft.total), buckets.TTFT_BOUNDS_S))
        for t in good.tenants))
    sd = make({"mode": "Auto", "threshold": 0})
    recommender = stages.TwinRecommender(settings_.ControllerSettings(observe_min_samples=50))
    with caplog.at_level("INFO", logger="slipstream.controller.stages"):
        rec = recommender.recommend(sd, fast, S(threshold=0), 1000.0)
    assert rec.model_mismatch, rec.reason
    (line,) = [r.getMessage() for r in caplog.records if "To replay the check" in r.getMessage()]
    assert line.startswith("prod/kimi: the twin does not explain the window")
    assert "`slipstream recommend --snapshot FILE.json --current stock --chunked-prefill-size" in line
    assert f"--profile {recommender.config.twin_profile}`" in line
    logged = codec.from_dict(json.loads(line.split("`: ", 1)[1]))
    assert logged == stages.in_engine_time(fast, recommender.config.engine_time_scale)
    # An agreeing window logs nothing of the kind.
    caplog.clear()
    with caplog.at_level("INFO", logger="slipstream.controller.stages"):
        assert not recommender.recommend(sd, good, S(threshold=0), 1000.0).model_mismatch
    assert not [r for r in caplog.records if "To replay the check" in r.getMessage()]


def test_engines_in_sync_is_unknown_not_true_when_no_engine_pod_runs() -> None:
    """Zero pods all 'report' any setting: the condition says Unknown and why, not True."""
    sd = make({"mode": "Fixed", "threshold": 4096})
    none = {c.type: c for c in tuning.conditions(sd, [], decision(), [], None, "2026-01-01T00:00:00Z")}
    assert (none["EnginesInSync"].status, none["EnginesInSync"].reason) == ("Unknown", tuning.NO_ENGINE_PODS)
    assert "no engine pod" in none["EnginesInSync"].message
    one = {c.type: c for c in tuning.conditions(sd, list(none.values()), decision(), [machine.Pod("a", S(threshold=4096))],
                                                None, "2026-01-01T00:01:00Z")}  # fmt: skip
    assert (one["EnginesInSync"].status, one["EnginesInSync"].reason) == ("True", "AllPodsOnSetting")
    assert one["EnginesInSync"].last_transition_time == "2026-01-01T00:01:00Z"
