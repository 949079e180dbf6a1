"""Invariants of the twin on random workloads: they hold for every policy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.sim import engine, policies, profiles
from slipstream.sim.policies import EngineConfig
from slipstream.sim.workload import Request, build

PROFILE = profiles.load("kimi-k3-8xh200")
MEMORY_FLOOR_S = PROFILE.weight_bytes / PROFILE.mem_bandwidth
CFG = EngineConfig(chunked_prefill_size=8192, cache_tokens=200_000)
POLICIES = ["stock", "ceiling:4096", "floor:2048", "ceiling:2048/srpt", "floor:4096/srpt",
            "stock/lpm", "sarathi:4096", "vllm:2048", "vllm:4096/srpt"]

request = st.tuples(
    st.floats(min_value=0, max_value=30, allow_nan=False),
    st.integers(min_value=1, max_value=60_000),
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=0, max_value=3),
)


def workload(rows):
    reqs = []
    for k, (at, prompt, out, prefix) in enumerate(rows):
        shared = min(prefix * 512, prompt - 1)
        blocks, sizes = ((prefix, k + 100), (shared, prompt - shared)) if shared else ((k + 100,), (prompt,))
        reqs.append(Request(f"r{k}", f"t{k % 3}", at, prompt, out, blocks, sizes))
    return build("random", reqs)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(rows=st.lists(request, min_size=1, max_size=25), policy=st.sampled_from(POLICIES))
def test_every_request_is_served_no_faster_than_alone(rows, policy):
    w = workload(rows)
    result = engine.simulate(w, policies.parse(policy, CFG), PROFILE, CFG, record_rounds=True)
    assert len(result.jobs) == len(w.requests)
    for job in result.jobs:
        assert job.first_token_s > job.arrival_s
        assert job.need == 0
        # No faster than alone, but for one thing: alone, the last chunk of a prompt
        # may be compute-bound where, sharing a pass, part of it rides under that
        # pass's memory-bound floor; at most one weights read can be saved so.
        assert job.first_token_s - job.arrival_s >= job.solo_s - MEMORY_FLOOR_S
        if job.req.output_tokens > 1:
            assert job.max_itl_s is not None and job.max_itl_s > 0
            assert job.finished_s >= job.first_token_s
        else:
            assert job.max_itl_s is None
    # every uncached token is prefilled exactly once, never beyond a pass's budget
    assert result.prefill_tokens == sum(j.uncached for j in result.jobs)
    budget = policies.parse(policy, CFG).rule.chunked_prefill_size
    for rnd in result.rounds:
        assert sum(t for _, t in rnd.prefill) <= budget
        assert rnd.end_s > rnd.start_s


def test_the_twin_is_deterministic():
    rows = [(k * 0.3, 1000 + 7919 * k % 30_000, 5, k % 2) for k in range(40)]
    p = "floor:2048/srpt"
    a = engine.simulate(workload(rows), policies.parse(p, CFG), PROFILE, CFG)
    b = engine.simulate(workload(rows), policies.parse(p, CFG), PROFILE, CFG)
    assert [j.first_token_s for j in a.jobs] == [j.first_token_s for j in b.jobs]


def test_prefix_cache_hits_cut_the_uncached_work():
    shared = Request("a", "t", 0.0, 20_000, 1, (1, 2), (19_000, 1000))
    again = Request("b", "t", 100.0, 20_000, 1, (1, 3), (19_000, 1000))
    result = engine.simulate(build("w", [shared, again]), policies.parse("stock", CFG), PROFILE, CFG)
    jobs = {j.rid: j for j in result.jobs}
    assert jobs["a"].uncached == 20_000
    assert jobs["b"].uncached == 1000 and jobs["b"].cached == 19_000


def test_prefill_first_starves_decodes_while_mixed_batching_does_not():
    streams = [Request(f"s{k}", "s", 0.0, 256, 200, (k + 10,), (256,)) for k in range(8)]
    long = Request("long", "l", 1.0, 200_000, 1, (99,), (200_000,))
    w = build("w", [*streams, long])
    stock = engine.simulate(w, policies.parse("stock", CFG), PROFILE, CFG)
    mixed = engine.simulate(w, policies.parse("sarathi:2048", CFG), PROFILE, CFG)
    gap = lambda r: max(j.max_itl_s for j in r.jobs if j.rid.startswith("s"))  # noqa: E731
    assert gap(stock) > 10 * gap(mixed)


def test_host_tier_hits_are_cheaper_than_recompute_and_cost_load_back_time():
    from slipstream.sim.policies import EngineConfig as Cfg

    first = Request("a", "t", 0.0, 50_000, 1, (1, 2), (49_000, 1000))
    evictor = Request("e", "t", 50.0, 60_000, 1, (7,), (60_000,))
    again = Request("b", "t", 200.0, 50_000, 1, (1, 3), (49_000, 1000))
    w = build("w", [first, evictor, again])
    device_only = Cfg(cache_tokens=60_000)
    with_host = Cfg(cache_tokens=60_000, host_cache_tokens=200_000)
    p = policies.parse("stock", device_only)
    no_host = {j.rid: j for j in engine.simulate(w, p, PROFILE, device_only).jobs}
    host = {j.rid: j for j in engine.simulate(w, policies.parse("stock", with_host), PROFILE,
                                              with_host).jobs}
    assert no_host["b"].cached == 0  # evicted: recomputed
    assert host["b"].cached == 49_000 and host["b"].host_tokens == 49_000
    ttft = lambda j: j.first_token_s - j.arrival_s  # noqa: E731
    assert ttft(host["b"]) < ttft(no_host["b"])
    load_s = 49_000 * PROFILE.kv_bytes_per_token / PROFILE.host_bandwidth
    assert host["b"].solo_s >= load_s


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rows=st.lists(request, min_size=1, max_size=25),
       policy=st.sampled_from(["reflex:4096/srpt", "reflex:2048", "reflex:1024/lpm"]))
def test_reflex_mode_serves_every_request_once_and_no_faster_than_alone(rows, policy):
    # The invariants above, for reflex mode (a test of its own: a policy added to POLICIES
    # changes every example the derandomized search above draws).
    w = workload(rows)
    result = engine.simulate(w, policies.parse(policy, CFG), PROFILE, CFG, record_rounds=True)
    assert len(result.jobs) == len(w.requests)
    for job in result.jobs:
        assert job.first_token_s > job.arrival_s and job.need == 0
        assert job.first_token_s - job.arrival_s >= job.solo_s - MEMORY_FLOOR_S
    assert result.prefill_tokens == sum(j.uncached for j in result.jobs)
    assert all(sum(t for _, t in rnd.prefill) <= CFG.chunked_prefill_size for rnd in result.rounds)
