"""slipstream loopbench's pure parts: settings, phased files, figures, the verdict, the lag read."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from slipstream.demo import loop, loopbench, phases
from slipstream.enginesim import metrics as sim_metrics
from slipstream.sim import workload as workload_mod

REPO = Path(__file__).resolve().parents[2]
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


def write_mooncake(path: Path, rows: list[tuple[int, int, list[int]]]) -> Path:
    """A Mooncake trace: (timestamp ms, input tokens, hash ids) per line."""
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": ids}) + "\n"
                            for t, n, ids in rows))  # fmt: skip
    return path


def test_a_phase_of_traces_replays_each_tenants_trace_in_its_window_and_rate(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    # Turn 2 of a conversation re-sends turn 1's blocks (0, 1) and adds one.
    write_mooncake(tmp_path / "traces" / "chat.jsonl", [(0, 1000, [0, 1]), (10_000, 1500, [0, 1, 2]),
                                                 (20_000, 600, [3, 4]), (40_000, 600, [5, 6])])
    write_mooncake(tmp_path / "code.jsonl", [(0, 300, [0]), (5_000, 300, [1])])
    spec = {"name": "calm", "duration_s": 20, "seed": 1, "tenants": [
        {"name": "chat", "rate_per_s": 1.0, "prompt_tokens": {"dist": "constant", "value": 100},
         "output_tokens": {"dist": "constant", "value": 1}}]}
    replay = {"name": "agents", "duration_s": 12, "traces": [
        {"tenant": "chat", "trace": "traces/chat.jsonl", "window_s": [10, 100], "rate_scale": 2},
        {"tenant": "code", "trace": "code.jsonl"}]}
    path = tmp_path / "phased.yaml"
    path.write_text(yaml.safe_dump({"phases": [spec, replay]}))
    workload, spans = loopbench.load_phases(path)
    assert [(s.name, s.start_s, s.end_s) for s in spans] == [("1-calm", 0, 20), ("2-agents", 20, 32)]
    got = {r.rid: r for r in workload.requests if r.rid.startswith("2-agents/")}
    # chat: trace seconds 10, 20, 40 in the window, from its start, twice as dense: 0, 5, 15 (cut at 12)
    assert {rid: r.arrival_s for rid, r in got.items()} == {
        "2-agents/chat-1": 20.0, "2-agents/chat-2": 25.0, "2-agents/code-0": 20.0, "2-agents/code-1": 25.0}
    turn2 = got["2-agents/chat-1"]
    assert turn2.tenant == "chat" and turn2.prompt_tokens == 1500 and turn2.block_sizes == (512, 512, 476)
    assert turn2.warm_blocks == 0, "a trace's hits come from the cache, never stated warm"
    space = workload_mod.BLOCK_SPACE
    assert [b // space for b in turn2.blocks] == [1 * loopbench.PHASE_SPACES + 1] * 3
    assert [b % space for b in turn2.blocks] == [0, 1, 2]
    assert {b // space for b in got["2-agents/code-0"].blocks} == {loopbench.PHASE_SPACES + 2}
    calm_spaces = {b // space for r in workload.requests if r.rid.startswith("1-calm/") for b in r.blocks}
    assert calm_spaces.isdisjoint({loopbench.PHASE_SPACES + 1, loopbench.PHASE_SPACES + 2})


@pytest.mark.parametrize("trace, fix", [
    ({"trace": "t.jsonl"}, "traces[0]: needs tenant (a name) and trace"),
    ({"tenant": "a", "trace": "t.jsonl", "speed": 2}, "traces[0]: unknown field(s) ['speed']"),
    ({"tenant": "a", "trace": "t.jsonl", "rate_scale": 0}, "traces[0]: rate_scale must be a number > 0"),
    ({"tenant": "a", "trace": "t.jsonl", "window_s": [5, 5]}, "traces[0]: window_s must be [start, end]"),
    ({"tenant": "a", "trace": "t.jsonl", "window_s": [100, 200]}, "traces[0]: no request of t.jsonl arrives"),
    ({"tenant": "a", "trace": "missing.jsonl"}, "traces[0]: *missing.jsonl: trace file does not exist"),
    ({"tenant": "a", "trace": "bad.jsonl"}, "traces[0]: *bad.jsonl:1: field 'hash_ids' has 1 blocks"),
])  # fmt: skip
def test_a_bad_trace_phase_names_the_trace_and_the_field(tmp_path: Path, trace: dict, fix: str) -> None:
    write_mooncake(tmp_path / "t.jsonl", [(0, 600, [0, 1])])
    write_mooncake(tmp_path / "bad.jsonl", [(0, 600, [0])])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"phases": [{"name": "x", "duration_s": 10, "traces": [trace]}]}))
    head, _, tail = fix.partition("*")  # *: the trace's path, as the file system names it
    with pytest.raises(ValueError, match=re.escape(f"bad.yaml: phases[0]: {head}") + (f".*{re.escape(tail)}" if tail else "")):
        loopbench.load_phases(path)


def test_a_trace_phase_refuses_spec_fields_and_a_tenant_twice(tmp_path: Path) -> None:
    write_mooncake(tmp_path / "t.jsonl", [(0, 600, [0, 1])])
    path = tmp_path / "p.yaml"
    one = {"tenant": "a", "trace": "t.jsonl"}
    path.write_text(yaml.safe_dump({"phases": [{"duration_s": 10, "seed": 1, "traces": [one]}]}))
    with pytest.raises(ValueError, match=re.escape("['seed'] belong to a workload spec phase")):
        loopbench.load_phases(path)
    path.write_text(yaml.safe_dump({"phases": [{"duration_s": 10, "traces": [one, one]}]}))
    with pytest.raises(ValueError, match="two traces name the same tenant"):
        loopbench.load_phases(path)


def test_the_example_replays_the_public_traces_around_a_phase_of_giants(traces_dir: Path) -> None:
    workload, spans = loopbench.load_phases(REPO / "examples" / "workloads" / "loopbench-mooncake.yaml")
    assert [(s.name, s.start_s, s.end_s) for s in spans] == [
        ("1-traces", 0, 600), ("2-giants", 600, 1200), ("3-traces", 1200, 1800)]
    first = [r for r in workload.requests if r.rid.startswith("1-traces/chat-")]
    again = [r for r in workload.requests if r.rid.startswith("3-traces/chat-")]
    # Trace seconds [0, 300) and [300, 600) at half the rate: the first phase's first chat
    # request is the trace's first, the last phase's starts where the first left off.
    assert first[0].rid == "1-traces/chat-0" and int(again[0].rid.rsplit("-", 1)[1]) == len(first)
    assert all(r.warm_blocks == 0 for r in workload.requests if "traces/" in r.rid)
    # Every chat request shares the trace's block 0 (its system prompt), within each phase.
    assert len({r.blocks[0] for r in first}) == 1 and first[0].blocks[0] != again[0].blocks[0]


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
