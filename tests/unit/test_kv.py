"""The twin's memory: a KV pool per profile, the shared reservation rule, retraction."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slipstream.sim import engine, metrics, policies, profiles
from slipstream.sim.engine import Engine
from slipstream.sim.policies import EngineConfig
from slipstream.sim.workload import Request, build

PROFILE = profiles.load("kimi-k3-8xh200")
POLICIES = ["stock", "ceiling:2048", "floor:2048", "ceiling:2048/srpt", "floor:4096/srpt",
            "stock/lpm", "sarathi:4096", "vllm:2048/srpt"]
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"


def cold(rid: str, at: float, prompt: int, out: int = 1, block: int = 0) -> Request:
    return Request(rid, "t", at, prompt, out, (block or hash(rid) % 10**9,), (prompt,))


def test_issue_8_three_long_prompts_in_a_small_pool_never_overcommit():
    """Pool 40,000, C 8192, T 2048, ceiling, fcfs; A, B, C of 30,000 queued together:
    the patched engine without the rule ran out of KV in round 9; with it, they finish."""
    cfg = EngineConfig(chunked_prefill_size=8192, kv_pool_tokens=40_000, cache_tokens=40_000)
    reqs = [cold(r, 0.0, 30_000, 1, k + 1) for k, r in enumerate("ABC")]
    eng = Engine(policies.parse("ceiling:2048", cfg), PROFILE, cfg)
    jobs = [eng.submit(r) for r in reqs]
    while eng.busy:
        eng.advance(eng.now_s)
        assert eng.kv_in_use + sum(j.need for j in eng._partials) <= 40_000
        assert eng.partials <= 1  # a second 30K prefill never fits beside the first
    assert all(j.first_token_s > 0 for j in jobs)
    assert eng.peak_kv_tokens <= 40_000


def test_issue_8_a_short_arrival_under_srpt_does_not_stall_the_partials():
    """Same pool, ceiling + srpt: A and B (30,000) at t = 0, W (8,000) at t = 1.0."""
    cfg = EngineConfig(chunked_prefill_size=8192, kv_pool_tokens=40_000, cache_tokens=40_000)
    reqs = [cold("A", 0.0, 30_000, 1, 1), cold("B", 0.0, 30_000, 1, 2), cold("W", 1.0, 8_000, 1, 3)]
    result = engine.simulate(build("w", reqs), policies.parse("ceiling:2048/srpt", cfg), PROFILE, cfg)
    assert all(j.first_token_s > 0 for j in result.jobs)
    assert result.peak_kv_tokens <= 40_000


def test_decodes_are_retracted_when_the_pool_runs_out_and_still_finish():
    cfg = EngineConfig(chunked_prefill_size=8192, kv_pool_tokens=60_000, cache_tokens=60_000)
    reqs = [cold(f"s{k}", 0.01 * k, 4000, 2000, k + 1) for k in range(12)]
    result = engine.simulate(build("w", reqs), policies.parse("stock", cfg), PROFILE, cfg)
    assert result.retractions > 0
    assert result.peak_kv_tokens <= 60_000
    for job in result.jobs:
        assert job.finished_s > job.first_token_s > 0
        assert job.tokens_out(job.finished_s) == 2000
        assert job.tokens_out(job.finished_s - 1e-9) == 1999
    retracted = [j for j in result.jobs if j.retractions]
    # a retracted stream's stall (recomputing its context) is its longest gap
    assert all(j.max_itl_s > 0.1 for j in retracted)
    summary = metrics.summarize(result)
    assert summary["retractions"] == result.retractions
    assert summary["kv_pool_tokens"] == 60_000 and 0 < summary["peak_kv_tokens"] <= 60_000


def test_a_prompt_larger_than_the_pool_is_refused_not_a_stall():
    cfg = EngineConfig(chunked_prefill_size=8192, kv_pool_tokens=20_000, cache_tokens=20_000)
    reqs = [cold("huge", 0.0, 50_000, 1, 1), cold("ok", 0.5, 1000, 5, 2)]
    result = engine.simulate(build("w", reqs), policies.parse("stock", cfg), PROFILE, cfg)
    jobs = {j.rid: j for j in result.jobs}
    assert jobs["huge"].rejected and jobs["huge"].first_token_s == -1
    assert jobs["ok"].finished_s > 0 and result.rejected == 1
    assert metrics.summarize(result)["requests"] == 1


def test_max_running_requests_bounds_the_decode_batch():
    cfg = EngineConfig(chunked_prefill_size=8192, max_running_requests=4)
    reqs = [cold(f"s{k}", 0.0, 100, 50, k + 1) for k in range(10)]
    eng = Engine(policies.parse("stock", cfg), PROFILE, cfg)
    for r in reqs:
        eng.submit(r)
    while eng.busy:
        eng.advance(eng.now_s)
        assert eng.decoding + eng.partials <= 4


request = st.tuples(
    st.floats(min_value=0, max_value=120, allow_nan=False),
    st.integers(min_value=1, max_value=8000),
    st.integers(min_value=1, max_value=6000),
    st.integers(min_value=0, max_value=3),
)


@settings(max_examples=80, deadline=None, derandomize=True)
@example(rows=[(20.0 * k, 2000, 5000, 0) for k in range(6)], policy="stock", pool=20_000)
@example(rows=[(20.0 * k, 2000, 5000, 1) for k in range(6)], policy="ceiling:2048/srpt",
         pool=20_000)
@given(rows=st.lists(request, min_size=1, max_size=30), policy=st.sampled_from(POLICIES),
       pool=st.integers(min_value=15_000, max_value=50_000))
def test_simulate_terminates_within_a_bound_and_never_exceeds_the_pool(rows, policy, pool):
    """Every pass prefills or decodes at least one token, and a retraction costs at most
    a request's context again: passes <= sum(prompt + output) x (1 + retractions)."""
    cfg = EngineConfig(chunked_prefill_size=8192, kv_pool_tokens=pool, cache_tokens=pool // 2)
    reqs = []
    for k, (at, prompt, out, prefix) in enumerate(rows):
        shared = min(prefix * 512, prompt - 1)
        blocks, sizes = ((prefix, k + 100), (shared, prompt - shared)) if shared else (
            (k + 100,), (prompt,))
        reqs.append(Request(f"r{k}", f"t{k % 3}", at, prompt, out, blocks, sizes))
    w = build("random", reqs)
    work = sum(r.prompt_tokens + r.output_tokens for r in w.requests)
    eng = Engine(policies.parse(policy, cfg), PROFILE, cfg, start_s=w.requests[0].arrival_s)
    for r in w.requests:
        eng.submit(r)
    horizon = w.requests[-1].arrival_s
    while eng.busy or eng.now_s < horizon:
        eng.advance(max(eng.now_s, horizon) if not eng.busy else eng.now_s)
        assert eng.passes <= work * (1 + eng.retractions), "simulate does not terminate"
        assert eng.kv_in_use <= pool
    assert eng.peak_kv_tokens <= pool
    for job in eng.jobs:
        assert job.rejected or (job.finished_s >= job.first_token_s > 0
                                and job.tokens_out(job.finished_s) == job.req.output_tokens)


@functools.cache
def shared_traces_at_70_percent():
    from slipstream.sim import rate, traces
    from slipstream.sim.workload import merge

    parts = [traces.load(str(SHARED / "mooncake_fast25" / "conversation_trace.jsonl"), "chat",
                         tenant_index=1),
             traces.load(str(SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"), "code",
                         tenant_index=2)]
    w = merge("chat+code", parts)
    return w.scaled(rate.scale_for_utilization(w, PROFILE, EngineConfig(), 0.7))


@pytest.mark.parametrize("policy", ["stock", "ceiling:4096/srpt", "floor:4096/srpt", "vllm:4096"])
def test_the_shared_traces_never_hold_more_kv_than_the_pool(policy):
    w = shared_traces_at_70_percent()
    cfg = EngineConfig()
    result = engine.simulate(w, policies.parse(policy, cfg), PROFILE, cfg)
    assert result.kv_pool_tokens == PROFILE.kv_pool_tokens
    assert 0 < result.peak_kv_tokens <= result.kv_pool_tokens
    assert all(j.finished_s > 0 for j in result.jobs)


def test_an_unlimited_pool_is_the_twin_without_memory():
    cfg = EngineConfig(kv_pool_tokens=0)
    reqs = [cold(f"s{k}", 0.0, 4000, 200, k + 1) for k in range(5)]
    result = engine.simulate(build("w", reqs), policies.parse("stock", cfg), PROFILE, cfg)
    assert result.kv_pool_tokens is None and result.retractions == 0
    assert replace(cfg, kv_pool_tokens=None).kv_pool_tokens is None


def test_the_cli_can_lift_or_shrink_the_pool(capsys):
    import json

    from slipstream import cli

    def peak(*extra: str) -> dict:
        assert cli.main(["simulate", "--scenario", "seed-003", "--policy", "stock", "--json",
                         *extra]) == 0
        return json.loads(capsys.readouterr().out)["summary"]

    assert peak()["kv_pool_tokens"] == profiles.load("llama3-70b-4xa100").kv_pool_tokens
    assert peak("--kv-pool-tokens", "0")["kv_pool_tokens"] is None
    assert peak("--kv-pool-tokens", "30000")["kv_pool_tokens"] == 30_000
    assert cli.main(["simulate", "--scenario", "seed-003", "--policy", "stock",
                     "--kv-pool-tokens", "-1"]) == 2


def test_a_spec_may_set_the_pool_and_the_running_bounds_and_bad_values_are_refused():
    from slipstream.sim import spec

    text = """name: w
engine: {kv_pool_tokens: 50000, max_running_requests: 16, max_partial_prefills: 2}
requests:
  - {id: a, arrival_s: 0.0, prompt_tokens: 1000, output_tokens: 2}
"""
    cfg = spec.parse(text, origin="w.yaml").engine
    assert (cfg.kv_pool_tokens, cfg.max_running_requests, cfg.max_partial_prefills) == (50_000, 16, 2)
    with pytest.raises(ValueError, match="kv_pool_tokens"):
        spec.parse(text.replace("50000", "-5"), origin="w.yaml")
    with pytest.raises(ValueError, match="max_partial_prefills"):
        EngineConfig(max_partial_prefills=0)


def test_a_stream_retracted_one_token_before_its_end_finishes_at_its_recompute():
    """Its recomputation yields its last token: tokens_out counts every token once."""
    cfg = EngineConfig(kv_pool_tokens=1_000_000)
    eng = Engine(policies.parse("stock", cfg), PROFILE, cfg)
    job = eng.submit(cold("a", 0.0, 2000, 3, 1))
    while job.tokens_out(eng.now_s) < 2:
        eng.advance(eng.now_s)
    second_s = eng.now_s
    eng._retract(job, len(eng._dtimes))  # as _make_room_for_decodes would
    assert eng.decoding == 0 and eng.waiting == 1 and eng.kv_in_use == 0
    eng.run()
    assert job.retractions == 1 and job.finished_s > second_s
    assert [job.tokens_out(t) for t in (second_s, job.finished_s - 1e-9, job.finished_s,
                                        job.finished_s + 5)] == [2, 2, 3, 3]
    assert job.max_itl_s >= job.finished_s - second_s  # the recompute is its longest gap
