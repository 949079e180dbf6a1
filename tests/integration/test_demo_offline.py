"""The demo's offline fleet (two twin engines, the operator's tuner): decisions and figures."""

from __future__ import annotations

import pytest

from slipstream.demo import offline, phases


@pytest.fixture(scope="module")
def plan():
    return phases.plan(360.0, replicas=offline.REPLICAS)


@pytest.mark.parametrize("offset", [0.0, 30.0])
def test_closed_loop_caps_the_heterogeneous_phase_and_steps_back(plan, offset):
    workload, spans = plan
    run = offline.closed_loop(workload, spans, offset, offline.LoopSettings(start=offline.STOCK))
    het, after = spans[1], spans[2]
    capped = [(at, to) for at, _, to, _ in run.moves if to.split("/")[0] != "stock"]
    assert capped and het.start_s <= capped[0][0] <= het.start_s + 120, run.moves
    assert all(not spans[0].holds(at) for at, _ in capped), run.moves
    final = run.moves[-1][2]
    assert run.moves[-1][0] >= after.start_s and final.split("/")[0] == "stock", run.moves


def test_figures_are_whole_phases_and_static_cap_beats_off_in_the_heterogeneous_phase(plan):
    workload, spans = plan
    off = offline.figures(offline.static(workload, "stock"), spans)
    cap = offline.figures(offline.static(workload, "ceiling:4096/srpt"), spans)
    assert set(off) == {p.name for p in spans} | {"whole"}
    assert cap[spans[1].name] * 5 <= off[spans[1].name], (cap, off)


def test_demo_comparison_prints_auto_off_and_the_best_static_settings(plan, capsys):
    from slipstream.demo import driver

    workload, spans = plan
    live = offline.static(workload, "floor:4096/srpt").results  # stands in for the live run
    driver.print_comparison(workload, spans, live)
    lines = capsys.readouterr().out.splitlines()
    ranked = offline.ranked_static(workload, spans)
    assert any(line.split()[:1] == [ranked[0][0]] and "(best static)" in line for line in lines), lines
    assert any(line.split()[:1] == [ranked[1][0]] and "(second best static)" in line for line in lines), lines
    assert any(line.split()[:1] == ["stock"] and "(Off)" in line for line in lines), lines
    live_row = next(line for line in lines if "auto (live" in line)
    want = offline.figures(offline.Run(live), spans)["whole"]
    assert float(live_row.split()[-1]) == pytest.approx(want, abs=0.005), (live_row, want)
    verdict = next(line for line in lines if line.startswith("Auto (live)"))
    assert f"{want / ranked[0][1]:.2f}x the best static setting ({ranked[0][0]}" in verdict, verdict


def test_the_static_settings_are_every_setting_auto_may_choose():
    assert set(offline.STATIC) == {"stock", "stock/srpt", "stock/lpm"} | {
        f"{mode}:4096{order}" for mode in ("ceiling", "floor") for order in ("", "/srpt", "/lpm")}


def test_a_jump_that_voids_a_canary_caps_at_the_same_poll(plan, monkeypatch):
    # An order-only move 60 s before the giants (its canary runs for the analysis window,
    # 120 s) is voided by the phase's jump, and the jump's step, at that same poll, caps:
    # the offline loop models the operator's voiding step (rollout.machine: the void and
    # the new mix's decision in one step).
    from slipstream.sim import policies
    from slipstream.tune import guardrails, tuner

    workload, spans = plan
    het = spans[1]
    real = tuner.tune_once
    srpt = policies.Setting(0, "ceiling", "srpt")

    def order_first(snapshot, state, *args, **kwargs):
        decision = real(snapshot, state, *args, **kwargs)
        at = args[-1]
        if het.start_s - 90 <= at < het.start_s and decision.recommendation is not None and state.current != srpt:
            return guardrails.Move(state.current, srpt, "test: order only", decision.recommendation)
        return decision

    monkeypatch.setattr(offline.tuner, "tune_once", order_first)
    lines: list[str] = []
    run = offline.closed_loop(workload, spans, 0.0, offline.LoopSettings(start=offline.STOCK), log=lines.append)
    voided = [line for line in lines if "voided: back to" in line]
    assert len(voided) == 1, lines
    at = float(voided[0].split()[0])
    assert het.start_s <= at <= het.start_s + 60, voided
    capped = [(t, to) for t, _, to, _ in run.moves if to.split("/")[0] != "stock"]
    assert capped and capped[0][0] == at, (at, run.moves)
    # Both engines run the cap from that poll (a harder cap skips its canary), the canary
    # engine's voided order with them.
    for schedule in run.schedules:
        assert [s for t, s in schedule if t == at][-1].threshold > 0, schedule


def test_the_constants_are_every_setting_in_the_bounds_in_any_mode():
    assert set(offline.CONSTANTS) == set(offline.STATIC) | {f"reflex:4096{o}" for o in ("", "/srpt", "/lpm")}


@pytest.mark.parametrize("offset", [0.0, 30.0])
def test_from_the_demos_reflex_start_every_phase_is_within_a_quarter_of_its_best_constant(plan, offset):
    # The demo's ServingDeployment starts on reflex:4096/srpt (loop.serving_deployment): the
    # engines cap the phase's first giant themselves, and the tuner never moves to T = 0.
    workload, spans = plan
    run = offline.closed_loop(workload, spans, offset)
    assert all(s.mode == "reflex" and s.threshold == 4096 for sched in run.schedules for _, s in sched), run.moves
    statics = {name: offline.figures(offline.static(workload, name), spans) for name in offline.CONSTANTS}
    got = offline.figures(run, spans)
    for p in spans:
        oracle = min(f[p.name] for f in statics.values())
        assert got[p.name] <= 1.25 * oracle, (p.name, got[p.name], oracle)
    assert got["whole"] <= 1.05 * min(f["whole"] for f in statics.values()), got
