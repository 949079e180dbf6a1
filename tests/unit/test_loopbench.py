"""slipstream loopbench's pure parts: settings, phased files, figures, the verdict, the lag read."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from slipstream.demo import loop, loopbench, phases
from slipstream.enginesim import metrics as sim_metrics

SPANS = [phases.Phase("1-uniform", "uniform", 0, 100), phases.Phase("2-het", "heterogeneous", 100, 200)]


def sample(t: float, threshold: int, mode: str = "ceiling", order: str = "fcfs") -> loop.StatusSample:
    return loop.StatusSample(t, threshold, None, mode, order, None, "Idle", {})


def test_setting_fields_of_policy_names() -> None:
    assert loopbench.setting_fields("stock") == {"threshold": 0, "engineMode": "ceiling", "schedulePolicy": "fcfs"}
    assert loopbench.setting_fields("stock/srpt")["schedulePolicy"] == "srpt"
    assert loopbench.setting_fields("floor:4096/srpt") == {"threshold": 4096, "engineMode": "floor",
                                                           "schedulePolicy": "srpt"}  # fmt: skip
    with pytest.raises(ValueError, match="expected stock"):
        loopbench.setting_fields("cap:4096")


def test_a_phased_file_becomes_phases_back_to_back(tmp_path: Path) -> None:
    path = tmp_path / "phased.yaml"
    tenant = {"name": "chat", "rate_per_s": 2.0, "prompt_tokens": {"dist": "constant", "value": 1000},
              "output_tokens": {"dist": "constant", "value": 10}}  # fmt: skip
    path.write_text(
        "phases:\n"
        f"  - {{name: calm, duration_s: 50, seed: 1, tenants: [{tenant}]}}\n".replace("'", "")
        + f"  - {{name: busy, duration_s: 30, seed: 2, tenants: [{tenant}]}}\n".replace("'", "")
    )
    workload, spans = loopbench.load_phases(path)
    assert [(s.name, s.start_s, s.end_s) for s in spans] == [("1-calm", 0, 50), ("2-busy", 50, 80)]
    assert all(0 <= r.arrival_s < 80 for r in workload.requests)
    assert any(r.rid.startswith("2-busy/") and r.arrival_s >= 50 for r in workload.requests)


@pytest.mark.parametrize("text, fix", [
    ("tenants: []", "a non-empty list 'phases'"),
    ("phases: [{name: x}]", "numeric duration_s"),
    ("phases: [{duration_s: 10, tenants: [{name: a, rate_per_s: 1, prompt_tokens: 5}]}]",
     "bad.yaml: phases[0]: tenants[0] (a): prompt_tokens: must be a mapping"),
])  # fmt: skip
def test_a_bad_phased_file_names_the_problem(tmp_path: Path, text: str, fix: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(fix)):
        loopbench.load_phases(path)


def test_settled_is_the_last_change_within_the_phase() -> None:
    samples = [sample(0, 0), sample(50, 0), sample(110, 0), sample(150, 4096), sample(170, 4096), sample(190, 4096)]
    assert loopbench.settled(samples, SPANS[0]) == (0.0, "off (stock)")
    at, text = loopbench.settled(samples, SPANS[1])
    assert at == 50.0 and text.startswith("T=4096")
    assert loopbench.settled([], SPANS[0]) == (None, "?")


def test_figures_count_whole_phases_changes_and_rollbacks() -> None:
    results = [loop.Result("a", f"r{k}", float(k), 1.0 if k < 100 else 5.0, True, 0.1) for k in range(200)]
    results.append(loop.Result("a", "failed", 150.0, math.nan, False))
    events = [{"reason": "ThresholdChanged", "_twin_s": 12.0}, {"reason": "RollingBack", "message": "canary analysis failed: x"},
              {"reason": "RolledBack"}, {"reason": "ThresholdChanged"}]
    fig = loopbench.figures_of(loopbench.RunSpec("auto", "Auto"), results, [sample(0, 0)], events, SPANS)
    assert fig.phases["1-uniform"]["a"] == 1.0 and fig.phases["2-het"]["a"] == 5.0
    assert fig.worst_whole == 5.0 and (fig.changes, fig.rollbacks) == (2, 1)
    assert fig.rollback_reasons == ["canary analysis failed: x"]
    assert fig.story[0] == "     12  ThresholdChanged: " and fig.story[1].endswith("RollingBack: canary analysis failed: x")
    assert (fig.requests, fig.failed) == (201, 1) and fig.load_lag_p99_s == pytest.approx(0.1)


def run_of(mode: str, worst: float, label: str = "") -> loopbench.RunFigures:
    return loopbench.RunFigures(label or mode, mode, "stock", worst_whole=worst)


def test_the_verdict_judges_auto_against_the_best_static_and_off() -> None:
    runs = [run_of("Auto", 1.05), run_of("Off", 12.0), run_of("Fixed", 1.0, "a"), run_of("Fixed", 2.0, "b")]
    status, lines = loopbench.verdict(runs)
    assert status == 0 and "1.05x the best static (a" in lines[0]
    status, lines = loopbench.verdict([run_of("Auto", 1.2), *runs[1:]])
    assert status == 1 and lines[-1] == "targets MISSED"
    refused = run_of("Fixed", 1.0)
    refused.refused = "lag"
    assert loopbench.verdict([*runs[:2], refused])[0] == 3


def test_the_lag_histogram_reads_back_as_a_p99_bound() -> None:
    m = sim_metrics.EngineMetrics("m", ("tenant",))
    assert loopbench.histogram_p99(m.exposition().decode(), sim_metrics.RELEASE_LAG_SECONDS) == (0.0, 0.0)
    for _ in range(98):
        m.late(0.01)
    m.late(3.0)
    m.late(3.0)
    bound, count = loopbench.histogram_p99(m.exposition().decode(), sim_metrics.RELEASE_LAG_SECONDS)
    assert count == 100 and bound == 5.0
    assert math.isnan(loopbench.histogram_p99("", sim_metrics.RELEASE_LAG_SECONDS)[0])


def test_agreement_is_live_auto_against_the_twins_loop() -> None:
    twin = {"whole": 10.0, "phases": {}, "moves": []}
    near = loopbench.agreement([run_of("Auto", 12.0), run_of("Off", 20.0)], twin)
    assert near is not None and near["ratio"] == pytest.approx(1.2) and near["within"]
    far = loopbench.agreement([run_of("Auto", 13.0)], twin)
    assert far is not None and not far["within"]
    refused = loopbench.RunFigures("auto", "Auto", "stock", worst_whole=10.0, refused="lag")
    assert loopbench.agreement([refused], twin) is None
    assert loopbench.agreement([run_of("Off", 10.0)], twin) is None


def test_agreement_uses_the_twins_loop_with_lives_canary_engine() -> None:
    """The operator canaries the first pod by name, either engine at random; the twin's
    loop run with the same canary engine is the one live is judged against."""
    urls = ["http://127.1.0.9:30000", "http://127.1.0.3:30000"]
    pods = {"bench-a": urls[0], "bench-b": urls[1]}
    events = [{"reason": "QueueMixChanged", "message": "trying it on canary pod(s) bench-b for 15 s"},
              {"reason": "CanaryStarted", "message": "0 -> 4096 (x): h 0.9; trying it on canary pod(s) bench-a, "
                                                     "bench-b for 15 s"},
              {"reason": "CanaryStarted", "message": "4096 -> 0: trying it on canary pod(s) bench-b for 15 s"},
              {"reason": "CanaryStarted", "message": "trying it on canary pod(s) bench-gone for 15 s"}]  # fmt: skip
    # the load's round robin runs over the sorted URLs: bench-b's is engine 0
    assert loopbench.canary_engines(events, pods, urls) == [1, 0]
    twin = {"whole": 8.0, "by_canary": [{"whole": 8.0}, {"whole": 12.0}]}
    auto = run_of("Auto", 12.5)
    auto.canary_engines = [1, 0]
    got = loopbench.agreement([auto], twin)
    assert got is not None and got["canary_engine"] == 1 and got["twin_s"] == 12.0 and got["within"]
    auto.canary_engines = [0]
    got = loopbench.agreement([auto], twin)
    assert got is not None and got["twin_s"] == 8.0 and not got["within"]
