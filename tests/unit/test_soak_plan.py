"""The soak's plan and checks (demo.soak_plan): each rule fails on the run it should fail."""

from __future__ import annotations

import pytest

from slipstream.demo import phases
from slipstream.demo import soak_plan as sp
from slipstream.demo.soak_plan import FaultRun, FleetSample, MemorySample, SoakFault, SoakLimits

LIMITS = SoakLimits(analysis_s=120.0, interval_s=60.0, stuck_s=600.0, slack_s=10.0)
A = (0, "ceiling", "fcfs")
B = (4096, "ceiling", "srpt")


def event(at: float, reason: str) -> dict[str, object]:
    return {"_twin_s": at, "reason": reason}


def fleet(at: float, setting=A, phase="Idle", candidate=None, engines=(A, A)) -> FleetSample:
    return FleetSample(at, setting, phase, candidate, {f"http://e{i}": e for i, e in enumerate(engines)})


def test_faults_cover_every_kind_apart_within_the_run_and_repeat_with_the_seed():
    faults = sp.plan_faults(3, 12 * 3600.0, min_gap_s=1800.0, warmup_s=600.0, tail_s=360.0, hold_s=120.0)
    assert {f.kind for f in faults} == set(sp.FAULT_KINDS)
    starts = [f.at_s for f in faults]
    assert starts == sorted(starts) and starts[0] >= 600.0 and starts[-1] <= 12 * 3600.0 - 360.0
    assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 1800.0 - 0.2
    assert all((f.hold_s > 0) == (f.kind in sp.HELD) for f in faults)
    assert faults == sp.plan_faults(3, 12 * 3600.0, min_gap_s=1800.0, warmup_s=600.0, tail_s=360.0, hold_s=120.0)
    assert faults != sp.plan_faults(4, 12 * 3600.0, min_gap_s=1800.0, warmup_s=600.0, tail_s=360.0, hold_s=120.0)


def test_a_run_too_short_for_every_kind_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="lengthen it or lower the gap"):
        sp.plan_faults(1, 3600.0, min_gap_s=1800.0, warmup_s=600.0, tail_s=360.0, hold_s=120.0)


def test_the_diurnal_mix_moves_rate_and_kind_with_the_hour():
    assert sp.diurnal_load((16 - sp.START_HOUR) * 3600) == pytest.approx(sp.LOAD_RANGE[1])
    assert sp.diurnal_load((28 - sp.START_HOUR) * 3600) == pytest.approx(sp.LOAD_RANGE[0])
    workload, spans = sp.diurnal_workload(2, 6 * 3600.0, phase_s=1800.0)
    assert [s.end_s - s.start_s for s in spans] == [1800.0] * 12
    assert len({s.kind for s in spans}) >= 2
    # Each phase keeps its kind's requests at about the hour's load: the rate follows the day.
    kept = []
    for index, span in enumerate(spans):
        made = phases.phase_workload(span.kind, 1800.0, 2, seed=2 * 1000 + index + 1, base=index * 8)
        got = sum(1 for r in workload.requests if span.holds(r.arrival_s))
        mean_load = sum(sp.diurnal_load(span.start_s + t) for t in range(0, 1800, 60)) / 30
        kept.append(got / len(made.requests))
        assert got / len(made.requests) == pytest.approx(mean_load, rel=0.15), (span, got, len(made.requests))
    assert kept[-1] > kept[0]  # 11:30-12:00 busier than 06:00-06:30
    assert len({r.rid for r in workload.requests}) == len(workload.requests)
    assert workload.requests == sp.diurnal_workload(2, 6 * 3600.0, phase_s=1800.0)[0].requests


def test_decisions_every_canary_ends_before_the_next_and_none_is_left_open():
    good = [event(10, "CanaryStarted"), event(50, "CanaryPassed"), event(90, "CanaryStarted"), event(99, "RollingBack")]
    assert sp.check_decisions(good).ok
    doubled = [event(10, "CanaryStarted"), event(20, "CanaryStarted"), event(99, "CanaryPassed")]
    assert not sp.check_decisions(doubled).ok
    lost = [event(10, "CanaryStarted")]
    check = sp.check_decisions(lost)
    assert not check.ok and "never ended" in check.detail


def test_stuck_a_rollout_longer_than_the_bound_or_open_at_the_end_fails():
    short = [fleet(0), fleet(10, phase="Canary"), fleet(300, phase="Promoting"), fleet(400)]
    assert sp.check_stuck(short, LIMITS).ok
    long = [fleet(0), fleet(10, phase="Canary"), fleet(700, phase="Canary"), fleet(720)]
    assert not sp.check_stuck(long, LIMITS).ok
    open_end = [fleet(0), fleet(10, phase="Canary")]
    assert not sp.check_stuck(open_end, LIMITS).ok


def test_fleet_each_fault_needs_every_engine_on_the_status_or_the_candidate_within_a_window():
    run = [FaultRun(SoakFault(100, "etcd"), 100.0, 110.0)]
    canary = fleet(120, phase="Canary", candidate=B, engines=(A, B))
    assert sp.accounted(canary)
    assert sp.check_fleet(run, [fleet(100, engines=(A, B)), canary], LIMITS).ok
    apart = [fleet(115, engines=(A, B)), fleet(200, engines=(A, B)), fleet(245, engines=(A, A))]
    check = sp.check_fleet(run, apart, LIMITS)
    assert not check.ok and "etcd" in check.detail  # 135 s after the end > 120 + 10
    assert sp.check_fleet(run, [fleet(115, engines=(A, B)), fleet(235, engines=(A, A))], LIMITS).ok
    assert not sp.check_fleet(run, [fleet(120, engines=())], LIMITS).ok  # no engine answered: not accounted for


def test_memory_growth_past_the_bound_fails_and_a_restart_starts_a_new_process():
    flat = [MemorySample(i * 60.0, 7, 100.0 + (i % 3)) for i in range(40)]
    assert sp.check_memory(flat).ok
    growing = [MemorySample(i * 60.0, 7, 100.0 + 2.0 * i) for i in range(40)]
    assert not sp.check_memory(growing).ok
    # A SIGKILLed operator's successor is judged on its own (the longest-lived one).
    restarted = [MemorySample(i * 60.0, 7, 60.0) for i in range(5)] + flat[5:]
    restarted = [MemorySample(m.twin_s, 8 if i >= 5 else 7, m.rss_mb) for i, m in enumerate(restarted)]
    assert sp.check_memory(restarted).ok
    assert not sp.check_memory(flat[:5]).ok  # too few to judge is not a pass


def test_missing_data_a_move_within_a_prometheus_faults_window_fails():
    runs = [FaultRun(SoakFault(100, "prometheus-outage", 120), 100.0, 220.0),
            FaultRun(SoakFault(500, "etcd"), 500.0, 505.0)]  # fmt: skip
    assert sp.check_missing_data(runs, [event(300, "CanaryStarted"), event(510, "CanaryStarted")], LIMITS).ok
    check = sp.check_missing_data(runs, [event(250, "ThresholdChanged")], LIMITS)
    assert not check.ok and "ThresholdChanged at 250 s" in check.detail
