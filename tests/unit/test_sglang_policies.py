"""SGLang 0.5.23's shortest-prefill-first and hrrn, and vLLM V1's split, on hand-computed cases.

Every expected number below is worked out in the comment beside it from the rules cited in
slipstream/sim/policies.py (SGLang's schedule_policy.py and scheduler.py, vLLM's
v1/core/sched/scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.sim import engine, policies, profiles, spec
from slipstream.sim.admission import AdmissionRule, Candidate, allocate
from slipstream.sim.policies import EngineConfig, PolicyError, spf_allocate, spf_chunk_limit
from slipstream.sim.queue import LPM_FCFS_FALLBACK, WaitQueue
from slipstream.sim.workload import Request, build

CFG = EngineConfig()
STOCK = AdmissionRule(8192)


@dataclass
class J:
    seq: int
    arrival_s: float
    need: int
    cached_est: int = 0
    redo: int = 0
    blocks: tuple[int, ...] = field(default=())


def ids(q: WaitQueue) -> list[int]:
    return [j.seq for j in q.items]


@pytest.mark.parametrize("remaining, needs, budget, page, expect", [
    # 100 + 300 + 5000 = 5400 reserved (each shorter than 20000, within 8192 - 1): 8192 - 5400
    (20_000, [100, 300, 5000], 8192, 1, 2792),
    # 100 reserved; 100 + 9000 > 8191 stops the walk: 8192 - 100
    (20_000, [100, 9000, 50], 8192, 1, 8092),
    # 100 < 200 reserved; 300 >= 200 (not shorter than the chunked request) stops it
    (200, [100, 300], 8192, 1, 8092),
    # pages of 16: 100 is charged 112; (8192 - 112) // 16 * 16
    (20_000, [100], 8192, 16, 8080),
    (20_000, [], 8192, 1, None),             # nothing waiting: no cap
    (20_000, [30_000], 8192, 1, None),       # nothing shorter: no cap
    (20_000, [1], 31, 16, None),             # budget under two pages: no cap
])
def test_spf_chunk_limit(remaining, needs, budget, page, expect):
    assert spf_chunk_limit(remaining, needs, budget, page) == expect


def test_spf_caps_the_chunked_request_so_the_short_ones_fit_beside_it():
    partial = [Candidate("long", 20_000)]
    waiting = [Candidate("a", 100), Candidate("b", 300), Candidate("c", 5000)]
    assert spf_allocate(STOCK, partial, waiting) == {"long": 2792, "a": 100, "b": 300, "c": 5000}
    # stock gives the chunked request the whole budget and the short ones wait
    assert allocate(STOCK, partial, waiting) == {"long": 8192}


def test_spf_without_shorter_waiting_work_is_stock():
    partial = [Candidate("long", 20_000)]
    waiting = [Candidate("x", 30_000)]
    assert spf_allocate(STOCK, partial, waiting) == {"long": 8192}
    # no partial: the head of the queue is cut to the budget, as in stock
    assert spf_allocate(STOCK, [], waiting) == {"x": 8192}
    # a finishing chunk leaves room; the next request may start chunking (no cap needed)
    assert spf_allocate(STOCK, [Candidate("p", 1000)], [Candidate("x", 30_000)]) == {"p": 1000, "x": 7192}


def test_spf_order_is_uncached_work_then_arrival_without_fallback():
    q: WaitQueue[J] = WaitQueue("spf", 1024)
    for k, need in enumerate([5000, 10, 300, 10]):
        q.push(J(k, float(k), need))
    assert ids(q) == [0, 1, 2, 3]  # a push appends; the round sorts (calc_priority)
    q.start_round(0)
    assert ids(q) == [1, 3, 2, 0]
    for k in range(4, LPM_FCFS_FALLBACK + 10):
        q.push(J(k, float(k), 7))
    q.start_round(0)
    assert ids(q)[:2] == [4, 5]  # still shortest first past 128 waiting (SGLang has no fallback)


def test_hrrn_ratio_is_tokens_processed_since_arrival_over_work():
    q: WaitQueue[J] = WaitQueue("hrrn", 1024)
    q.start_round(0)
    q.push(J(0, 0.0, 1000))
    q.push(J(1, 0.1, 100))
    assert ids(q) == [0, 1]          # both ratio 0: arrival order
    q.start_round(1000)              # A: 1000/1000 = 1, B: 1000/100 = 10
    assert ids(q) == [1, 0]
    q.push(J(2, 0.2, 10))            # C arrives at P = 1000: ratio 0
    assert ids(q) == [1, 0, 2]
    q.start_round(1100)              # A 1.1, B 11, C 100/10 = 10
    assert ids(q) == [1, 2, 0]
    q.pop_front(1)
    q.start_round(1200)              # A 1.2, C 20
    assert ids(q) == [2, 0]


def test_hrrn_falls_back_to_fcfs_past_128_waiting():
    q: WaitQueue[J] = WaitQueue("hrrn", 1024)
    q.push(J(0, 0.0, 50_000))
    for k in range(1, LPM_FCFS_FALLBACK + 1):
        q.push(J(k, float(k), 10))
    q.start_round(5000)
    assert ids(q)[:2] == [0, 1]      # 129 waiting: arrival order
    q.pop_front(2)
    assert ids(q)[0] == 2 and len(q) == LPM_FCFS_FALLBACK - 1
    q.push(J(999, 999.0, 10_000))
    q.start_round(6000)              # back at 128: ratio order; the newcomer waited 1000/10000
    assert ids(q)[-1] == 999


@pytest.mark.parametrize("name, expect", [
    ("sglang-spf", ("sglang-spf", 0, "spf", False)),
    ("hrrn", ("hrrn", 0, "hrrn", False)),
])
def test_parse_sglang_orders(name, expect):
    p = policies.parse(name, CFG)
    assert (p.name, p.rule.threshold, p.order, p.mixed) == expect
    assert p.rule.max_prefill_tokens == CFG.max_prefill_tokens  # stock's admission check


@pytest.mark.parametrize("name, message", [
    ("sglang-spf:4096", "takes no argument"),
    ("hrrn/srpt", "order of its own"),
])
def test_sglang_orders_refuse_arguments_and_orders(name, message):
    with pytest.raises(PolicyError, match=message):
        policies.parse(name, CFG)


def test_bench_default_carries_the_baselines():
    assert {"sglang-spf", "hrrn", "vllm:4096"} <= set(policies.DEFAULT_BENCH)


def _v1_step(running: list[list], waiting: list[list], budget: int, threshold: int) -> dict[str, int]:
    """vLLM V1's Scheduler.schedule token split, transcribed: running requests in admission
    order (a decode takes 1), then waiting ones in fcfs order; each capped at the threshold
    and at what is left of the budget."""
    out: dict[str, int] = {}
    for rid, remaining, _ in running:
        if budget <= 0:
            break
        n = 1 if remaining == 0 else min(remaining, threshold)
        n = min(n, budget)
        out[rid] = n
        budget -= n
    for rid, remaining, _ in waiting:
        if budget <= 0:
            break
        n = min(remaining, threshold, budget)
        out[rid] = n
        budget -= n
    return out


@settings(max_examples=80, deadline=None, derandomize=True)
@given(arrivals=st.lists(st.lists(st.tuples(st.integers(1, 30_000), st.integers(1, 6)), max_size=3),
                         min_size=1, max_size=40),
       threshold=st.sampled_from([512, 2048, 4096, 8192]))
def test_vllm_split_is_v1s_running_order_split(arrivals, threshold):
    """The twin's vllm:T (every decode first, then partials oldest first, then the queue,
    with C - decodes for the prefills) gives each prefill exactly what V1's running-order
    loop gives it, and V1 never refuses a decode its token: checked step by step."""
    budget_c = 8192
    rule = AdmissionRule(budget_c, threshold, max_prefill_tokens=None)
    running: list[list] = []   # [rid, remaining prefill (0 = decoding), decode steps left]
    waiting: list[list] = []
    n = 0
    for step_arrivals in arrivals + [[]] * 40:
        for prompt, outs in step_arrivals:
            waiting.append([f"r{n}", prompt, outs])
            n += 1
        v1 = _v1_step(running, waiting, budget_c, threshold)
        decoders = [r for r in running if r[1] == 0]
        assert all(v1.get(r[0]) == 1 for r in decoders)  # never starved
        partials = [Candidate(r[0], r[1]) for r in running if r[1] > 0]
        queue = [Candidate(w[0], w[1]) for w in waiting]
        twin = allocate(rule, partials, queue, budget_c - len(decoders))
        assert twin == {k: v for k, v in v1.items() if k not in {r[0] for r in decoders}}
        for r in decoders:
            r[2] -= 1
        for r in running:
            if r[1] > 0 and r[0] in v1:
                r[1] -= v1[r[0]]
        admitted = [w for w in waiting if w[0] in v1]
        for w in admitted:
            w[1] -= v1[w[0]]
        running = [r for r in running + admitted if r[1] > 0 or r[2] > 0]
        waiting = [w for w in waiting if w[0] not in v1]


# ---- in the engine: a profile where a pass costs 1 ms per token, nothing else ----------

MS_PER_TOKEN = profiles.Profile(
    name="1ms-per-token", description="hand-computable", source="test",
    flops_per_token=1.0, peak_flops=1000.0, attn_flops_per_pair=0.0, attn_flops_per_s=0.0,
    weight_bytes=0.0, kv_bytes_per_token=0.0, mem_bandwidth=1.0, overhead_s=0.0,
)


def first_tokens(policy: str, rows: list[tuple[str, float, int]]) -> dict[str, float]:
    w = build("hand", [Request(rid, "t", at, need, 1, (k,), (need,))
                       for k, (rid, at, need) in enumerate(rows)])
    result = engine.simulate(w, policies.parse(policy, CFG), MS_PER_TOKEN, CFG)
    return {j.rid: round(j.first_token_s, 6) for j in result.jobs}


def test_sglang_spf_in_the_engine_fits_short_requests_beside_the_long_one():
    rows = [("long", 0.0, 20_000), ("a", 0.001, 100), ("b", 0.002, 300)]
    # stock: long 8192 (ends 8.192), long 8192 (16.384), long 3616 + a + b (20.4)
    assert first_tokens("stock", rows) == {"long": 20.4, "a": 20.4, "b": 20.4}
    # spf: long 8192; then long capped at 8192 - 400 = 7792 beside a and b (16.384); long 4016
    assert first_tokens("sglang-spf", rows) == {"long": 20.4, "a": 16.384, "b": 16.384}


def test_hrrn_in_the_engine_orders_by_tokens_waited_over_work():
    # x alone (ends 8.192, P = 8192); a and b arrived during it with P_arrival = 0:
    # ratios 8192/6000 < 8192/3000, so b goes first and a is cut to the 5192 left
    rows = [("x", 0.0, 8192), ("a", 0.1, 6000), ("b", 0.2, 3000)]
    assert first_tokens("stock", rows) == {"x": 8.192, "a": 16.384, "b": 17.192}
    assert first_tokens("hrrn", rows) == {"x": 8.192, "a": 17.192, "b": 16.384}


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rows=st.lists(st.tuples(st.floats(0, 30, allow_nan=False), st.integers(1, 40_000),
                               st.integers(1, 20)), min_size=1, max_size=25),
       policy=st.sampled_from(["sglang-spf", "hrrn"]))
def test_sglang_orders_serve_everyone_and_never_beat_the_solo_time(rows, policy):
    w = build("random", [Request(f"r{k}", "t", at, n, out, (k,), (n,))
                         for k, (at, n, out) in enumerate(rows)])
    prof = profiles.load("kimi-k3-8xh200")
    result = engine.simulate(w, policies.parse(policy, CFG), prof, CFG)
    floor = prof.weight_bytes / prof.mem_bandwidth  # see test_engine: one weights read
    for job in result.jobs:
        assert job.first_token_s >= 0 and job.finished_s >= job.first_token_s
        assert job.first_token_s - job.arrival_s >= job.solo_s - floor - 1e-9


def test_seed_000_under_sglangs_own_orders():
    """docs/twin.md's seed-000 rows: spf's chunk cap lets the small requests past the cold
    600K prompt; hrrn only orders the queue, so they wait for the chunked prompt."""
    sp = spec.load("seed-000")
    prof = profiles.load(sp.profile or "kimi-k3-8xh200")
    out = {}
    for name in ("sglang-spf", "hrrn"):
        result = engine.simulate(sp.workload, policies.parse(name, sp.engine), prof, sp.engine)
        out[name] = {j.rid: j.first_token_s - j.arrival_s for j in result.jobs}
    small = [r for r in out["sglang-spf"] if r != "cold"]
    assert max(out["sglang-spf"][r] for r in small) < 1.0
    assert out["sglang-spf"]["cold"] == pytest.approx(105.70, abs=0.01)
    assert min(out["hrrn"][r] for r in small) > 100


@pytest.mark.parametrize("kv_free, expect", [
    # the capped chunk charges 7792 + 1 page and keeps its 12208 unbuilt tokens reserved
    (20_000, {"long": 7792}),                            # 20000 - 20001 < 0: no one else
    (20_300, {"long": 7792, "a": 100}),                  # 299 left: a (101) fits, b (301) not
    (20_500, {"long": 7792, "a": 100, "b": 300}),
    (None, {"long": 7792, "a": 100, "b": 300}),
])
def test_spf_cap_keeps_the_chunks_remainder_reserved_under_the_kv_rule(kv_free, expect):
    partial = [Candidate("long", 20_000)]
    waiting = [Candidate("a", 100), Candidate("b", 300)]
    assert spf_allocate(STOCK, partial, waiting, kv_free=kv_free) == expect


def test_spf_cap_counts_the_chunk_against_max_prefill_tokens():
    partial = [Candidate("long", 20_000)]
    waiting = [Candidate("a", 100), Candidate("b", 300)]
    # M = 7850: the chunk's 7792 leave 58; a is admitted (stock checks after admitting),
    # which spends it, so b waits
    assert spf_allocate(AdmissionRule(8192, max_prefill_tokens=7850), partial, waiting) == {
        "long": 7792, "a": 100}
    # M = 7900 leaves 108: a leaves 8 > 0, b is admitted and spends it
    assert spf_allocate(AdmissionRule(8192, max_prefill_tokens=7900), partial, waiting) == {
        "long": 7792, "a": 100, "b": 300}


def test_spf_with_t_caps_each_partial_by_t_and_by_its_own_limit_in_turn():
    # The 0.5.23 patch: each partial in turn takes min(need, T, budget left, spf limit
    # against the waiting queue with the budget left). T = 4096, waiting 100 + 300 = 400.
    rule = AdmissionRule(8192, 4096, "ceiling")
    partials = [Candidate("p1", 20_000), Candidate("p2", 20_000)]
    waiting = [Candidate("a", 100), Candidate("b", 300)]
    # p1: min(4096, 8192 - 400 = 7792) = 4096; p2: budget left 4096, limit 4096 - 400 = 3696;
    # then a and b fit in the 400 left.
    assert spf_allocate(rule, partials, waiting) == {"p1": 4096, "p2": 3696, "a": 100, "b": 300}
    # Without the cap (fcfs/ceiling), p2 takes all that is left and a, b wait.
    assert allocate(rule, partials, waiting) == {"p1": 4096, "p2": 4096}


@pytest.mark.parametrize("name, expect", [
    ("ceiling:4096/spf", ("ceiling:4096/spf", 4096, "spf", spf_allocate)),
    ("floor:2048/hrrn", ("floor:2048/hrrn", 2048, "hrrn", allocate)),
    ("stock/spf", ("stock/spf", 0, "spf", spf_allocate)),
])
def test_sglang_orders_compose_with_any_kind(name, expect):
    p = policies.parse(name, CFG)
    assert (p.name, p.rule.threshold, p.order, p.allocator) == expect


def test_a_hot_switch_to_and_from_spf_changes_the_split():
    p = policies.parse("ceiling:4096", CFG)
    p.apply(policies.Setting(4096, "ceiling", "shortest-prefill-first"))  # SGLang's name
    assert (p.order, p.allocator) == ("spf", spf_allocate)
    p.apply(policies.Setting(4096, "ceiling", "hrrn"))
    assert (p.order, p.allocator) == ("hrrn", allocate)
    with pytest.raises(ValueError, match="order must be one of"):
        p.apply(policies.Setting(4096, "ceiling", "lifo"))
    assert policies.engine_order("spf") == "shortest-prefill-first"
    assert policies.engine_order("srpt") == "srpt"
