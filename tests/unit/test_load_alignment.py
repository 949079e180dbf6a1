"""Honest load: traces of different spans aligned before merging, and --target-utilization
meaning stock's simulated busy fraction, decodes included, within the stated tolerance."""

from __future__ import annotations

import json

import pytest

from slipstream import cli
from slipstream.sim import rate
from slipstream.sim.workload import TILE_BLOCK_STRIDE, Request, Workload, align, build


def trace(name: str, arrivals: list[float]) -> Workload:
    return build(name, [Request(f"{name}-{k}", name, at, 100, 1, (k,), (100,))
                        for k, at in enumerate(arrivals)])


def test_truncate_cuts_every_trace_to_the_shortest_span():
    long, short = trace("a", [0, 10, 20, 30, 40]), trace("b", [0, 5, 15])
    out, note = align([long, short], "truncate")
    assert [r.arrival_s for r in out[0].requests] == [0, 10]
    assert out[1] is short or out[1].requests == short.requests
    assert "cut to the shortest, 15 s" in note and "a 2/5" in note and "b 3/3" in note


def test_tile_repeats_the_shorter_trace_in_a_hash_space_of_its_own():
    long, short = trace("a", [0, 10, 20, 30, 40]), trace("b", [0, 5, 15])
    out, note = align([long, short], "tile")
    assert out[0].requests == long.requests
    # period = span 15 + mean gap 7.5 = 22.5: copies at 0 and 22.5 (the third starts past 40)
    tiled = out[1].requests
    assert [r.arrival_s for r in tiled] == [0, 5, 15, 22.5, 27.5, 37.5]
    assert [r.rid for r in tiled[3:]] == ["b-0~1", "b-1~1", "b-2~1"]
    assert tiled[3].blocks == (TILE_BLOCK_STRIDE,)
    assert "tiled to the longest span, 40 s" in note and "b x2.00" in note


def test_equal_spans_need_no_alignment_and_zero_spans_are_refused():
    a, b = trace("a", [0, 10]), trace("b", [0, 3, 10])
    assert align([a, b], "truncate") == ([a, b], "")
    with pytest.raises(ValueError, match="spans no time"):
        align([a, trace("c", [4])], "truncate")
    with pytest.raises(ValueError, match="--align must be one of"):
        align([a, b], "stretch")


def test_fit_scale_meets_the_target_within_the_tolerance():
    # busy fraction proportional to the scale until it saturates
    calls: list[float] = []

    def measure(x: float) -> float:
        calls.append(x)
        return min(0.97, 0.6 * x) if x < 1.2 else 0.97 - 0.1 / x

    fit = rate.fit_scale(0.7, 0.5, measure, tolerance=0.01)
    assert fit.converged and abs(fit.busy - 0.7) <= 0.01
    assert fit.runs[0] == (0.5, 0.3) and len(fit.runs) == len(calls) <= 3
    assert fit.scale == pytest.approx(0.7 / 0.6, rel=0.02)


def test_fit_scale_says_when_it_cannot_get_there():
    fit = rate.fit_scale(0.7, 1.0, lambda x: 0.4 if x < 2 else 0.9, tolerance=0.01, max_runs=6)
    assert not fit.converged and len(fit.runs) == 6
    assert fit.busy in (0.4, 0.9)
    with pytest.raises(ValueError, match="tolerance"):
        rate.fit_scale(0.7, 1.0, lambda x: 0.7, tolerance=0.0)


def write_trace(path, times_ms: list[int], prompt: int) -> None:
    blocks = -(-prompt // 512)
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": prompt, "output_length": 3,
                                        "hash_ids": list(range(k * blocks, (k + 1) * blocks))})
                            + "\n" for k, t in enumerate(times_ms)))


def test_cli_aligns_says_so_and_hits_the_target(capsys, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(a, [k * 1000 for k in range(400)], 3000)      # 399 s
    write_trace(b, [k * 1500 for k in range(100)], 9000)      # 148.5 s
    assert cli.main(["bench", "--trace", str(a), "--trace", str(b), "--policies", "stock",
                     "--target-utilization", "0.6", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "cut to the shortest, 148 s (requests kept: a 149/400, b 100/100" in captured.err
    assert "stock's simulated busy fraction with decodes" in captured.err
    assert doc["target_utilization"] == 0.6
    busy = doc["policies"]["stock"]["busy_fraction"]  # decodes included, the whole run
    assert abs(busy - 0.6) <= 0.05
    assert abs(doc["stock_busy_fraction"] - 0.6) <= rate.UTILIZATION_TOLERANCE  # the samples
    load = doc["load"]
    assert load["rate_scale"] == doc["rate_scale"] and load["converged"]
    assert len(load["slices"]) == rate.SLICES and not load["overload"]
    assert doc["policies"]["stock"]["peak_kv_tokens"] < doc["policies"]["stock"]["kv_pool_tokens"]


def test_cli_tile_says_how_many_copies(capsys, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(a, [k * 1000 for k in range(100)], 2000)      # 99 s
    write_trace(b, [k * 1000 for k in range(30)], 2000)       # 29 s, period 30 s: 4 copies
    assert cli.main(["simulate", "--trace", str(a), "--trace", str(b), "--policy", "stock",
                     "--align", "tile", "--rate-scale", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert "tiled to the longest span, 99 s (a x1.00, b x3.33)" in captured.err
    doc = json.loads(captured.out)
    assert len(doc["requests"]) == 100 + 100  # b: 30 + 30 + 30 + 10 (arrivals 90..99 s)


def _prompts(n: int, gap_s: float, prompt: int, output: int) -> Workload:
    return build("w", [Request(f"r{k}", "t", k * gap_s, prompt, output, (k,), (prompt,))
                       for k in range(n)])


def test_a_slice_whose_own_rate_exceeds_capacity_is_reported_as_overload():
    from slipstream.sim import profiles
    from slipstream.sim.policies import EngineConfig

    profile, config = profiles.load("kimi-k3-8xh200"), EngineConfig()
    calm = rate.slice_loads(_prompts(80, 10.0, 3000, 20), profile, config, [(0.0, 0.0, 0)] * 4)
    assert not any(s.overload for s in calm) and all(s.offered_prefill_load < 0.1 for s in calm)
    # a 3,000-token cold prompt needs > 0.1 s of prefill alone: ten a second is > capacity
    rush = rate.slice_loads(_prompts(80, 0.01, 3000, 20), profile, config, [(0.0, 0.0, 0)] * 4)
    assert all(s.overload and s.offered_prefill_load > 1.0 for s in rush)


def test_the_slice_fit_counts_decodes_so_long_outputs_lower_the_scale():
    from slipstream.sim import profiles
    from slipstream.sim.policies import EngineConfig

    profile, config = profiles.load("kimi-k3-8xh200"), EngineConfig()
    short = rate.fit_by_slices(_prompts(400, 1.0, 2000, 4), profile, config, 0.6)
    long = rate.fit_by_slices(_prompts(400, 1.0, 2000, 400), profile, config, 0.6)
    assert short.fit.converged and long.fit.converged
    assert abs(long.fit.busy - 0.6) <= rate.UTILIZATION_TOLERANCE
    assert long.scale < short.scale / 2  # 400 decode steps a request outweigh its prefill
