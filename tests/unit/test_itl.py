"""The twin's inter-token figures: every gap (ITL p99) versus each request's longest gap."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.sim import engine, metrics, policies, profiles
from slipstream.sim.metrics import percentile, weighted_percentile
from slipstream.sim.policies import EngineConfig
from slipstream.sim.workload import Request, build

PROFILE = profiles.load("kimi-k3-8xh200")
CFG = EngineConfig(chunked_prefill_size=8192, cache_tokens=200_000)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(0, 5)), min_size=1,
                max_size=30), st.floats(0, 100))
def test_weighted_percentile_is_the_percentile_of_the_expanded_values(pairs, q):
    values = [v for v, _ in pairs]
    weights = [w for _, w in pairs]
    expanded = [v for v, w in pairs for _ in range(w)]
    got = weighted_percentile(values, weights, q)
    if not expanded:
        assert got != got  # NaN
    else:
        assert got == pytest.approx(percentile(expanded, q), abs=1e-9)


def _full_sort_percentile(values, weights, q):
    """The rule before the tail selection: every pair sorted, then the weighted walk."""
    pairs = sorted((v, w) for v, w in zip(values, weights, strict=True) if w > 0)
    total = sum(w for _, w in pairs)
    pos = (total - 1) * q / 100.0
    lo = int(pos // 1)
    return metrics._interpolate(pairs, lo, pos - lo)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.sampled_from([90.0, 99.0, 99.9, 100.0]),
       st.sampled_from(["spread", "ties", "heavy"]))
def test_weighted_percentile_tail_selection_is_exact(seed, q, shape):
    """Past 8 x TAIL_SAMPLE pairs only the tail is sorted: the same float as the full sort,
    also with ties at the threshold, zero weights and a few heavy weights."""
    import random

    rng = random.Random(seed)
    n = 8 * metrics.TAIL_SAMPLE + rng.randrange(5000)
    if shape == "ties":
        values = [rng.choice((0.01, 0.02, 0.5)) for _ in range(n)]
    else:
        values = [rng.expovariate(1.0) for _ in range(n)]
    heavy = (1, 1, 1, 0, 100_000) if shape == "heavy" else (0, 1, 1, 2, 50)
    weights = [rng.choice(heavy) for _ in range(n)]
    assert weighted_percentile(values, weights, q) == _full_sort_percentile(values, weights, q)


def every_gap(result: engine.SimResult) -> list[float]:
    """All inter-token gaps, stream by stream (the per-stream work the twin avoids)."""
    gaps = []
    for job in result.jobs:
        out = job.req.output_tokens
        if out < 2 or job.rejected:
            continue
        segments = [*(job._segs or ()), (job.seg_start_s, job.entry_step,
                                         job.entry_step + out - job.out_base)]
        times = []
        for start_s, first, end in segments:
            times += [start_s, *job._times[first:end]]
        assert len(times) == out
        gaps += [b - a for a, b in zip(times, times[1:], strict=False)]
    return gaps


@pytest.mark.parametrize("policy", ["stock", "ceiling:2048/srpt", "sarathi:2048", "vllm:4096"])
def test_itl_p99_counts_every_gap_of_every_stream(policy):
    reqs = [Request(f"r{k}", "t", k * 0.4, 500 + 9973 * k % 30_000, 2 + 13 * k % 60, (k + 1,),
                    (500 + 9973 * k % 30_000,)) for k in range(40)]
    result = engine.simulate(build("w", reqs), policies.parse(policy, CFG), PROFILE, CFG)
    gaps = every_gap(result)
    assert metrics.itl_p99(result) == pytest.approx(percentile(gaps, 99), rel=1e-9)
    longest = [j.max_itl_s for j in result.jobs if j.max_itl_s is not None]
    assert max(longest) == pytest.approx(max(gaps))


def test_a_long_prefill_shows_in_the_longest_gap_not_in_every_gap(capsys):
    """Seed 003: 16 streams stall once for 1.84 s, then decode 400 tokens at ~23 ms."""
    from slipstream import cli

    assert cli.main(["simulate", "--scenario", "seed-003", "--policy", "stock", "--json"]) == 0
    import json

    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["max_itl_p99_s"] == pytest.approx(1.84, rel=0.05)
    assert summary["itl_p99_s"] < 0.05
    assert 0 < summary["busy_fraction"] <= 1


def test_itl_p99_and_longest_gaps_count_the_stall_of_a_retraction():
    cfg = EngineConfig(kv_pool_tokens=20_000, cache_tokens=10_000)
    # Arrivals 5 s apart: six 7,000-token streams overlap (~42 s of decode each) in a 20,000-token pool.
    reqs = [Request(f"r{k}", "t", 5.0 * k, 2000, 5000, (k + 1,), (2000,)) for k in range(6)]
    result = engine.simulate(build("w", reqs), policies.parse("stock", cfg), PROFILE, cfg)
    assert result.retractions >= 1
    gaps = every_gap(result)
    assert metrics.itl_p99(result) == pytest.approx(percentile(gaps, 99), rel=1e-9)
    longest = {j.rid: j.max_itl_s for j in result.jobs}
    assert max(longest.values()) == pytest.approx(max(gaps))


def test_nearest_rank_reads_a_measured_value_and_skips_nan() -> None:
    """The live and demo p99s are read at a rank (a latency that was measured), not
    interpolated between two as ``percentile`` does."""
    values = [float(v) for v in range(1, 101)]
    assert metrics.nearest_rank(values, 99) == 99.0 and metrics.percentile(values, 99) == pytest.approx(99.01)
    assert metrics.nearest_rank([*values, math.nan], 50) == 50.0
    assert math.isnan(metrics.nearest_rank([], 99)) and math.isnan(metrics.nearest_rank([math.nan], 99))
