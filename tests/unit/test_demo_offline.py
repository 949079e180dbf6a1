"""The demo's offline fleet (two twin engines, the operator's tuner): decisions and figures."""

from __future__ import annotations

import pytest

from slipstream.demo import offline, phases


@pytest.fixture(scope="module")
def plan():
    return phases.plan(240.0, replicas=offline.REPLICAS)


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


def test_demo_comparison_prints_off_best_static_and_both_autos(plan, capsys):
    from slipstream.demo import driver

    workload, spans = plan
    live = offline.static(workload, "floor:4096/srpt").results  # stands in for the live run
    driver.compare(workload, spans, live)
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines[2:]}
    assert "(best static)" in rows["ceiling:4096/srpt"], lines
    assert "(Off)" in rows["stock"], lines
    live_row = next(line for line in lines if "auto (live" in line)
    want = offline.figures(offline.Run(live), spans)["whole"]
    assert float(live_row.split()[-1]) == pytest.approx(want, abs=0.005), (live_row, want)
    assert any("auto (twin's loop)" in line for line in lines), lines
