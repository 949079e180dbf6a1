"""The rollout state machine on plain data: every transition, resume from status, rollback on
regression, bounded retries. A small in-memory fleet plays the engines (`Fleet.step` does
what the controller does: read, decide, apply, read back)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from slipstream.api import models
from slipstream.rollout import analysis, machine, sequential

S = models.EngineSetting
OLD = S(threshold=4096)
NEW = S(threshold=2048, schedule_policy="srpt")
POLICY = machine.RolloutPolicy(canary_replicas=1, analysis_window_s=300, max_regression_percent=5, max_attempts=3,
                        retry_after_s=600, chunked_prefill_size=8192)  # fmt: skip
AUTO = machine.RolloutTarget(NEW, "heterogeneity 0.81, predicted worst-tenant p99 TTFT 38.2 s -> 1.9 s", canary=True)
T0 = 1_800_000_000.0

PASS = analysis.compare({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.05}, 5)
REGRESS = analysis.compare({"a": 1.0, "b": 3.0}, {"a": 1.0, "b": 2.0}, 5)


@dataclass
class Fleet:
    """Engine pods as the admin API would show them; `failing` pods answer no call,
    `refusing` ones read fine but refuse every change."""

    settings: dict[str, S]
    failing: set[str] = field(default_factory=set)
    refusing: set[str] = field(default_factory=set)
    state: models.RolloutStatus | None = None
    fleet: S = OLD
    configmap: S = OLD
    events: list[machine.Event] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    def pods(self) -> list[machine.Pod]:
        return [
            machine.Pod(n, None, "HTTP 503") if n in self.failing else machine.Pod(n, s)
            for n, s in sorted(self.settings.items())
        ]

    def step(self, target: machine.RolloutTarget | None, now: float, verdict: analysis.Verdict | None = None,
             mix_jump: str = "") -> machine.RolloutDecision:  # fmt: skip
        d = machine.advance(self.state, self.fleet, target, self.pods(), POLICY, now, verdict, mix_jump)
        for name, setting in d.apply.items():
            if name not in self.failing | self.refusing:
                self.settings[name] = setting
        # persist as the controller does: through the CR status (camelCase JSON)
        self.state = models.RolloutStatus.model_validate(d.state.to_k8s())
        self.fleet, self.configmap = d.fleet, d.configmap
        self.events += d.events
        self.actions.append(d.action)
        return d


def fleet(n: int = 3) -> Fleet:
    return Fleet({f"engine-{i}": OLD for i in range(n)})


def fleet_in_analysis() -> Fleet:
    """Three pods in Auto whose canary runs the candidate: the analysis began at T0 + 5."""
    f = fleet()
    f.step(AUTO, T0)
    f.step(AUTO, T0 + 5)
    return f


def test_idle_with_nothing_to_do_holds() -> None:
    f = fleet()
    d = f.step(machine.RolloutTarget(OLD, "spec", canary=True), T0)
    assert d.action == "Hold" and not d.apply and not d.events and d.configmap == OLD and not d.in_flight


def test_idle_sets_a_stale_pod_back_with_an_event() -> None:
    f = fleet()
    f.settings["engine-2"] = S(threshold=0)
    d = f.step(None, T0)
    assert d.action == "Correct" and d.apply == {"engine-2": OLD}
    assert [e.reason for e in d.events] == ["StalePodCorrected"] and "engine-2" in d.events[0].message
    assert f.settings["engine-2"] == OLD


def test_canary_analysis_promote_with_the_numbers_in_the_events() -> None:
    f = fleet()
    d = f.step(AUTO, T0)
    assert d.action == "StartCanary" and d.apply == {"engine-0": NEW}
    assert f.state is not None and f.state.phase == "Canary" and f.state.canary_pods == ["engine-0"]
    assert d.fleet == OLD and d.configmap == OLD, "the fleet and new pods stay on the old setting during the canary"
    assert d.events[0].message.startswith("4096 -> 2048 (concurrency 2 -> 4, order fcfs -> srpt): heterogeneity 0.81")

    d = f.step(AUTO, T0 + 5)
    assert d.action == "StartAnalysis" and f.state.phase == "Analysis"
    assert not machine.analysis_due(f.state, POLICY, T0 + 100)
    assert f.step(AUTO, T0 + 100).action == "Hold"
    assert machine.analysis_due(f.state, POLICY, T0 + 305)

    d = f.step(AUTO, T0 + 305, PASS)
    assert d.action == "Promote" and d.configmap == NEW and set(d.apply) == {"engine-1", "engine-2"}
    assert d.fleet == OLD, "status shows the old setting until every pod reads the new one"
    d = f.step(AUTO, T0 + 306)
    assert d.action == "Promoted" and d.fleet == NEW and d.configmap == NEW and not d.in_flight
    assert f.state.result == "Promoted"
    changed = [e for e in f.events if e.reason == "ThresholdChanged"]
    assert changed[0].message == (
        "4096 -> 2048 (concurrency 2 -> 4, order fcfs -> srpt): heterogeneity 0.81, "
        "predicted worst-tenant p99 TTFT 38.2 s -> 1.9 s"
    )
    assert [e.reason for e in f.events] == ["CanaryStarted", "CanaryPassed", "ThresholdChanged"]
    assert f.step(AUTO, T0 + 400).action == "Hold"


def test_a_regressing_canary_is_rolled_back_and_the_fleet_ends_uniform() -> None:
    f = fleet_in_analysis()
    d = f.step(AUTO, T0 + 305, REGRESS)
    assert d.action == "RollBack" and d.apply == {"engine-0": OLD} and d.configmap == OLD
    assert "b p99 TTFT 3.00 s vs 2.00 s (+50%)" in d.events[0].message and d.events[0].type == "Warning"
    d = f.step(AUTO, T0 + 306)
    assert d.action == "RolledBack" and f.state.result == "RolledBack" and d.fleet == OLD
    assert set(f.settings.values()) == {OLD}
    # the same candidate is not tried again before retry_after_s...
    d = f.step(AUTO, T0 + 400)
    assert d.action == "Hold" and "not tried again" in d.message and not d.apply
    # ...and is after it
    assert f.step(AUTO, T0 + 306 + 601).action == "StartCanary"


@pytest.mark.parametrize("verdict", [None, analysis.compare({}, {"a": 1.0}, 5), analysis.failed_read("HTTP 500")])
def test_no_figures_to_judge_by_rolls_back(verdict: analysis.Verdict | None) -> None:
    f = fleet_in_analysis()
    assert f.step(AUTO, T0 + 305, verdict).action == "RollBack"


def sequential_verdict(canary_mean_s: float, windows: int, final: bool = False) -> analysis.Verdict:
    cells = {("a", "le1k"): sequential.CellHistogram(20, 20 * canary_mean_s)}
    base = {("a", "le1k"): sequential.CellHistogram(20, 20.0)}
    subs = [sequential.SubWindow(10.0 * k, 10.0 * (k + 1), cells, base) for k in range(windows)]
    return analysis.from_sequential(sequential.evaluate(subs, sequential.SequentialRule(), final))


def test_an_undecided_sequential_verdict_continues_the_analysis_until_its_limit() -> None:
    f = fleet_in_analysis()
    undecided = sequential_verdict(2.0, 3)
    assert undecided.outcome == "Continue"
    d = f.step(AUTO, T0 + 305, undecided)
    assert d.action == "Hold" and f.state is not None and f.state.phase == "Analysis"
    assert "analysis continues" in d.message and not d.events
    assert f.state.started_at == machine.stamp(T0 + 5), "the analysis clock keeps its start"
    # the rule decides later: a regression rolls back, with the rule's numbers
    d = f.step(AUTO, T0 + 500, sequential_verdict(2.0, 36))
    assert d.action == "RollBack" and "Rollback (crossed)" in d.events[0].message
    # an undecided verdict past the limit (a caller that did not ask for a final answer) rolls back
    g = fleet_in_analysis()
    assert machine.analysis_final(g.state, POLICY, T0 + 5 + 3 * 300)
    assert g.step(AUTO, T0 + 5 + 3 * 300, undecided).action == "RollBack"


def test_a_scrape_gap_moves_the_analysis_limit_out_by_its_length_at_most_once_more() -> None:
    """A Prometheus outage inside the analysis leaves few sub-windows; the rule must not be
    made to decide on them at the usual limit (the soak's prometheus-outage fault found a
    truncated Promote on two). The limit moves out by the blind seconds, capped at one
    more limit, and an undecided verdict holds until then."""
    g = fleet_in_analysis()
    limit = T0 + 5 + 3 * 300
    assert not machine.analysis_final(g.state, POLICY, limit, blind_s=120)
    assert machine.analysis_final(g.state, POLICY, limit + 120, blind_s=120)
    assert not machine.analysis_final(g.state, POLICY, limit + 899, blind_s=10_000)
    assert machine.analysis_final(g.state, POLICY, limit + 900, blind_s=10_000), "capped at one more limit"
    blind = dataclasses.replace(sequential_verdict(2.0, 3), blind_s=120)
    d = g.step(AUTO, limit, blind)
    assert d.action == "Hold" and "analysis continues" in d.message
    assert g.step(AUTO, limit + 120, blind).action == "RollBack"


def test_a_sequential_promote_promotes() -> None:
    f = fleet_in_analysis()
    verdict = sequential_verdict(1.0, 36)
    assert verdict.outcome == "Promote"
    d = f.step(AUTO, T0 + 305, verdict)
    assert d.action == "Promote" and "Promote (crossed)" in d.events[0].message


def test_a_canary_that_keeps_failing_is_rolled_back_after_bounded_retries() -> None:
    f = fleet()
    f.refusing = {"engine-0"}
    f.step(AUTO, T0)
    f.failing = {"engine-0"}
    actions = [f.step(AUTO, T0 + i).action for i in range(1, 5)]
    assert actions == ["ApplyCanary", "ApplyCanary", "ApplyCanary", "RollBack"]
    assert "after 3 attempt(s): engine-0 (HTTP 503)" in f.state.message
    f.failing = f.refusing = set()
    assert f.step(AUTO, T0 + 6).action == "RolledBack"
    assert set(f.settings.values()) == {OLD}


def test_a_pod_failing_during_promotion_rolls_the_fleet_back() -> None:
    f = fleet_in_analysis()
    f.failing = {"engine-2"}
    f.step(AUTO, T0 + 305, PASS)
    assert f.settings["engine-1"] == NEW and f.configmap == NEW
    actions = [f.step(AUTO, T0 + 306 + i).action for i in range(4)]
    assert actions == ["Promote", "Promote", "Promote", "RollBack"]
    assert f.configmap == OLD and f.fleet == OLD
    assert f.settings["engine-0"] == OLD and f.settings["engine-1"] == OLD
    # the unreachable pod is retried every step; nothing else (no restart) is possible
    assert f.step(AUTO, T0 + 320).apply == {"engine-2": OLD}
    f.failing = set()
    assert f.step(AUTO, T0 + 321).action == "RolledBack"


def test_fixed_edit_goes_to_every_pod_at_once() -> None:
    f = fleet(2)
    fixed = machine.RolloutTarget(S(threshold=1024), "spec.tuning.threshold changed", canary=False)
    d = f.step(fixed, T0)
    assert d.action == "Promote" and set(d.apply) == {"engine-0", "engine-1"} and d.configmap == S(threshold=1024)
    assert "no canary" in d.events[0].message
    assert f.step(fixed, T0 + 1).action == "Promoted" and f.fleet == S(threshold=1024)


def test_with_no_pods_a_change_is_the_configmap_alone() -> None:
    f = Fleet({})
    fixed = machine.RolloutTarget(NEW, "spec", canary=True)
    assert f.step(fixed, T0).action == "Promote"
    assert f.step(fixed, T0 + 1).action == "Promoted" and f.configmap == NEW and f.fleet == NEW


def test_a_target_changed_during_the_canary_rolls_back_first() -> None:
    f = fleet()
    f.step(AUTO, T0)
    d = f.step(machine.RolloutTarget(S(threshold=1024), "newer", canary=True), T0 + 1)
    assert d.action == "RollBack" and "target changed" in d.message


ORDER_ONLY = machine.RolloutTarget(S(threshold=4096, schedule_policy="srpt"), "documents: srpt", canary=True)
JUMP = "the queue mix moved 0.20 from the one the last step decided on: le8k 100% -> le8k 60%, gt300k 40%"


@pytest.mark.parametrize("analysing", [False, True])
def test_a_mix_jump_voids_a_canary_that_does_not_cap_harder(analysing: bool) -> None:
    # An order-only candidate chosen on documents; giants arrive while its canary runs
    # (before or after the analysis started): the canary goes back to the fleet's setting
    # with Normal Events, and the fleet's own setting never changed.
    f = fleet()
    f.step(ORDER_ONLY, T0)
    if analysing:
        f.step(ORDER_ONLY, T0 + 5)
        assert f.state is not None and f.state.phase == "Analysis"
    d = f.step(None, T0 + 40, mix_jump=JUMP)
    assert d.action == "RollBack" and d.apply == {"engine-0": OLD} and d.fleet == OLD and d.configmap == OLD
    assert [(e.type, e.reason) for e in d.events] == [("Normal", "CanaryVoided")]
    assert machine.VOIDED in d.message and "gt300k 40%" in d.message
    d = f.step(None, T0 + 41)
    assert d.action == "RolledBack" and [(e.type, e.reason) for e in d.events] == [("Normal", "RolledBack")]
    assert set(f.settings.values()) == {OLD} and f.fleet == OLD and not d.in_flight
    # A failed analysis stays a Warning (test_a_regressing_canary_...); a jump while Idle
    # voids nothing.
    assert f.step(None, T0 + 42, mix_jump=JUMP).action == "Hold"


@pytest.mark.parametrize("analysing", [False, True])
def test_a_voiding_step_with_a_harder_cap_sends_it_to_every_pod(analysing: bool) -> None:
    # The step the jump brings judged the new mix: its harder cap skips a canary of its
    # own (skip_canary), so it goes to every pod in that step, the voided canary with it.
    f = fleet()
    f.step(ORDER_ONLY, T0)
    if analysing:
        f.step(ORDER_ONLY, T0 + 5)
    cap = machine.RolloutTarget(S(threshold=2048, schedule_policy="srpt"), "giants: cap", canary=True, gain=0.8)
    d = f.step(cap, T0 + 40, mix_jump=JUMP)
    assert d.action == "Promote" and d.apply == {f"engine-{i}": cap.setting for i in range(3)}, d
    assert [(e.type, e.reason) for e in d.events] == [("Normal", "CanaryVoided"), ("Normal", "CanarySkipped")]
    assert machine.VOIDED in d.events[0].message and "every pod" in d.events[0].message
    assert d.configmap == cap.setting and d.state.phase == "Promoting" and d.state.baseline == OLD
    assert d.state.candidate == cap.setting and d.state.canary_pods == []
    d = f.step(cap, T0 + 41)
    assert d.action == "Promoted" and f.fleet == cap.setting and set(f.settings.values()) == {cap.setting}
    # A target that needs its own canary (no predicted gain: skip_canary says no), or the
    # voided candidate itself, is not started by the void: the canary goes back.
    for target in (machine.RolloutTarget(S(threshold=2048), "cap", canary=True),
                   machine.RolloutTarget(ORDER_ONLY.setting, "same", canary=True, gain=0.9)):  # fmt: skip
        g = fleet()
        g.step(ORDER_ONLY, T0)
        d = g.step(target, T0 + 40, mix_jump=JUMP)
        assert d.action == "RollBack" and d.apply == {"engine-0": OLD}, d
        assert [(e.type, e.reason) for e in d.events] == [("Normal", "CanaryVoided")]


def test_a_mix_jump_leaves_a_harder_cap_and_other_phases_alone() -> None:
    # 4096 -> 2048 runs more prefills at once: the way a jump to giants needs; it goes on.
    f = fleet_in_analysis()
    assert not machine.voidable(f.state, POLICY.chunked_prefill_size)
    assert f.step(AUTO, T0 + 100, mix_jump=JUMP).action == "Hold"
    assert f.step(AUTO, T0 + 305, PASS, mix_jump=JUMP).action == "Promote"
    assert not machine.voidable(f.state, POLICY.chunked_prefill_size), "Promoting is not voided"
    assert f.step(AUTO, T0 + 306, mix_jump=JUMP).action == "Promoted"
    looser = fleet()
    looser.step(machine.RolloutTarget(S(threshold=8192), "back towards off", canary=True), T0)
    assert machine.voidable(looser.state, POLICY.chunked_prefill_size)
    assert not machine.voidable(None, 8192) and not machine.voidable(models.RolloutStatus(), 8192)


def test_a_canary_that_goes_away_or_drifts_rolls_back() -> None:
    f = fleet_in_analysis()
    f.settings["engine-0"] = OLD  # restarted from the ConfigMap
    d = f.step(AUTO, T0 + 10)
    assert d.action == "RollBack" and "no longer run the candidate" in d.message
    g = fleet()
    g.step(AUTO, T0)
    del g.settings["engine-0"]
    assert g.step(AUTO, T0 + 1).action == "RollBack"


def test_a_restarted_operator_resumes_from_the_status_alone() -> None:
    f = fleet_in_analysis()
    saved = f.state.to_k8s()
    assert saved["phase"] == "Analysis" and saved["candidate"]["threshold"] == 2048
    assert saved["baseline"]["threshold"] == 4096 and saved["canaryPods"] == ["engine-0"]
    # a new process: nothing but the status and the engines
    resumed = Fleet(dict(f.settings), state=models.RolloutStatus.model_validate(saved), fleet=OLD)
    assert resumed.step(AUTO, T0 + 100).action == "Hold"
    assert resumed.step(AUTO, T0 + 305, PASS).action == "Promote"
    assert resumed.step(AUTO, T0 + 306).action == "Promoted"


def test_without_a_ready_baseline_pod_all_pods_on_the_fleet_setting_can_canary() -> None:
    f = fleet(1)
    d = f.step(AUTO, T0)
    assert d.action == "StartCanary" and d.apply == {"engine-0": NEW}


def test_comparison_rules() -> None:
    assert PASS.passed and "+2%" not in PASS.summary and "-2%" in PASS.summary
    assert not REGRESS.passed and "b p99" in REGRESS.summary
    assert not analysis.compare({"a": float("nan")}, {"a": 1.0}, 5).passed
    assert analysis.compare({"a": 0.0}, {"a": 0.0}, 5).passed
    assert not analysis.compare({"a": 0.5}, {"a": 0.0}, 5).passed
    assert analysis.compare({"a": 0.01}, {"a": 0.0}, 5, floors=0.05).passed
    # under a tenant's noise floor a big percentage is not a regression; above it, it is
    assert analysis.compare({"a": 0.37, "b": 0.96}, {"a": 0.20, "b": 0.38}, 20, floors={"a": 0.5}).summary.count("p99") == 1
    assert analysis.compare({"a": 0.37}, {"a": 0.20}, 20, floors={"a": 0.5}).passed


def test_stamps_round_trip() -> None:
    assert machine.seconds(machine.stamp(T0)) == T0
    assert machine.seconds(None) is None


def test_event_wording_names_what_moves() -> None:
    assert machine.describe_change(OLD, NEW, 8192) == "4096 -> 2048 (concurrency 2 -> 4, order fcfs -> srpt)"
    assert machine.describe_change(S(threshold=0), S(threshold=0, schedule_policy="srpt"), 8192) == (
        "threshold 0 (concurrency 1): order fcfs -> srpt")
    assert machine.describe_change(OLD, S(threshold=4096, mode="floor"), 8192) == (
        "threshold 4096 (concurrency 2): order fcfs, mode ceiling -> floor")


def test_the_twins_auto_voids_by_the_same_rule() -> None:
    # tune.auto may not import the rollout stage, so it restates `voidable`'s rule in the
    # twin's settings (C // T not above the setting before): the two agree on every pair
    # of candidates the tuner may choose within concurrency 1-4.
    from slipstream.tune import candidates, deployment

    spec = candidates.TuningSpec(8192, 1, 1, 4)
    settings = list(candidates.enumerate_candidates(spec))
    for before in settings:
        for after in settings:
            status = models.RolloutStatus(phase="Canary", candidate=deployment.engine_setting(after),
                                          baseline=deployment.engine_setting(before))  # fmt: skip
            twin = candidates.concurrency(after, 8192) <= candidates.concurrency(before, 8192)
            assert machine.voidable(status, 8192) == twin, (before, after)
