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
    run = offline.closed_loop(workload, spans, offset)
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
    driver.compare(workload, spans, live)
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
