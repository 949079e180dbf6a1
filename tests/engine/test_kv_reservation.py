"""The issue's two reproductions on the real scheduler code, patched beside pristine
0.5.18, and the KV reservation that fixes them (slipstream.sim.admission's rule).

Before the reservation: three 30,000-token prompts in a 40,000-token pool were all
admitted as partial prefills; round 9 asked for 2048 tokens for A with 0 free and
`alloc_for_extend` raised "Out of memory" (the scheduler process dies). Under srpt, a
short request that did not fit ended the round before any partial was served, and
prefill stalled for good.
"""

from __future__ import annotations

import harness as h
import pytest

POOL = 40_000
ISSUE = {"chunked_prefill_size": 8192, "threshold": 2048, "kv_tokens": POOL}
THREE = [{"rid": r, "need": 30_000} for r in "ABC"]


STALL = [
    {"rid": "A", "need": 30_000, "arrival": 0.0},
    {"rid": "B", "need": 30_000, "arrival": 0.0},
    {"rid": "W", "need": 8_000, "arrival": 1.0},
]
STOCK_ENGINE = {"chunked_prefill_size": 8192, "kv_tokens": POOL}


@pytest.fixture(scope="module")
def stock(pristine):
    """Pristine 0.5.18 (T = 0, fcfs: it has no srpt) on the issue's cases, in one run."""
    return pristine(
        {
            "three": {"engine": STOCK_ENGINE, "requests": THREE},
            "two": {"engine": STOCK_ENGINE, "requests": THREE[:2]},
            "stall": {"engine": STOCK_ENGINE, "requests": STALL},
        }
    )


def run(engine: dict, requests: list[dict]) -> h.Engine:
    eng = h.make_engine(**engine)
    for i, r in enumerate(requests):
        eng.add(r["need"], rid=r["rid"], arrival=float(r.get("arrival", i)))
    for _ in range(2_000):
        if not eng.busy():
            break
        alloc = eng.step()
        # Progress on every pass that has prefill work (no decodes here).
        assert alloc, f"round {len(eng.rounds)}: no prefill while work is pending"
        assert eng.s.token_to_kv_pool_allocator.available_size() >= 0
    assert not eng.busy(), "not finished"
    assert eng.kv_free() == eng.kv_free_at_start, "KV leaked"
    assert eng.slots_free() == eng.slots_free_at_start, "request slots leaked"
    return eng


def test_over_commit_case_pristine_finishes_in_12_rounds_patched_reserves(stock):
    assert len(stock["three"]) == 12  # the issue's figure for pristine 0.5.18 (T = 0)
    eng = run(ISSUE, THREE)
    # A's remainder is reserved: B (30,000) never fits beside it, so A runs alone,
    # capped at T in ceiling mode, until it finishes; then B; then C. No allocation fails.
    assert eng.rounds[:8] == [{"A": 2048}] * 8
    per_req = {r: sum(a.get(r, 0) for a in eng.rounds) for r in "ABC"}
    assert per_req == {"A": 30_000, "B": 30_000, "C": 30_000}
    assert all(len(a) == 1 for a in eng.rounds)


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "srpt"])
@pytest.mark.parametrize("mode", ["ceiling", "floor"])
@pytest.mark.parametrize("page", [1, 16])
def test_every_order_mode_and_page_size_finishes_without_allocation_failure(policy, mode, page):
    # The issue saw the crash with two prompts (round 12), lpm, srpt, floor (round 7)
    # and page 16 ("Prefill out of memory"); three prompts plus two short ones here.
    reqs = THREE + [{"rid": "s1", "need": 700}, {"rid": "s2", "need": 3_000}]
    eng = run({**ISSUE, "policy": policy, "mode": mode, "page_size": page}, reqs)
    # Never more partials than the pool can finish: each holds its whole need.
    assert max(len(a) for a in eng.rounds) <= 3


def test_two_prompts_pristine_and_patched(stock):
    assert sum(sum(a.values()) for a in stock["two"]) == 60_000
    eng = run(ISSUE, THREE[:2])
    assert sum(sum(a.values()) for a in eng.rounds) == 60_000


def test_srpt_stall_case_pristine_and_patched_both_finish(stock):
    assert sum(sum(a.values()) for a in stock["stall"]) == 68_000
    eng = run({**ISSUE, "policy": "srpt"}, STALL)
    # W sorts first (shortest), A is admitted beside it, B waits for room: every
    # round prefills, and every request finishes.
    assert eng.rounds[0] == {"W": 2048, "A": 2048}
    assert {r for a in eng.rounds for r in a} == {"A", "B", "W"}


def test_srpt_a_short_request_that_does_not_fit_leaves_the_partials_running():
    # The stall's shape: two partials hold KV, a short request sorting first does not
    # fit beside their reserved remainders; the partials are still served every round.
    eng = h.make_engine(**ISSUE, policy="srpt")
    eng.add(18_000, rid="A", arrival=0.0)
    eng.add(18_000, rid="B", arrival=0.0)
    for _ in range(4):
        assert eng.step() == {"A": 2048, "B": 2048}
    eng.add(8_000, rid="W", arrival=0.5)  # srpt key 0.5 + 8000/4096 < A's 18000/4096
    # free 40,000 - 16,384 = 23,616; reserved 2 x 9,808: W (8,000) does not fit.
    assert eng.s.partial_prefill_kv_reserved() == 2 * 9_808
    assert eng.step() == {"A": 2048, "B": 2048}
    assert [r.rid for r in eng.s.waiting_queue] == ["W"]
    for _ in range(200):
        if not eng.busy():
            break
        assert eng.step()
    assert not eng.busy() and eng.kv_free() == eng.kv_free_at_start


def test_max_partial_prefills_bounds_the_partials_and_is_settable_in_place():
    eng = h.make_engine(chunked_prefill_size=8192, threshold=1024, max_partials=2)
    for r in "ABCD":
        eng.add(100_000, rid=r)
    eng.add(500, rid="s")
    # Two partials; C and D wait; s waits behind them (new admissions end in order).
    assert eng.step() == {"A": 1024, "B": 1024}
    assert eng.s.num_partial_prefills() == 2
    out = h.set_internal_state(eng, max_partial_prefills=4)
    assert out.updated, out.reason
    assert eng.step() == {"A": 1024, "B": 1024, "C": 1024, "D": 1024, "s": 500}
    bad = h.set_internal_state(eng, max_partial_prefills=0)
    assert not bad.updated and "max_partial_prefills must be an integer >= 1" in bad.reason
    assert eng.s.max_partial_prefills == 4


def test_partials_count_in_is_fully_idle_and_the_load_inquirer():
    from sglang.srt.managers.scheduler_components.load_inquirer import SchedulerLoadInquirer

    eng = h.make_engine(**ISSUE)
    s = eng.s
    s.dllm_manager = type("D", (), {"any_staging_reqs": lambda self: False})()
    s.grammar_manager.grammar_queue = []
    s._pp_microbatches_drained = lambda: True
    fields = {f: None for f in SchedulerLoadInquirer.__dataclass_fields__}
    fields.update(
        get_waiting_queue=lambda: s.waiting_queue,
        get_chunked_req=lambda: s.chunked_req,
        get_partial_reqs=lambda: s.partial_reqs,
    )
    if "waiting_queue_prefix_matched" in fields:  # 0.5.23's cache-aware estimate
        fields.update(
            waiting_queue_prefix_matched=lambda: s.policy.waiting_queue_prefix_matched(
                s.waiting_queue
            ),
            get_recent_cache_hit_rate=lambda: 0.0,
        )
    inquirer = SchedulerLoadInquirer(**fields)
    eng.add(30_000, rid="A")
    eng.step()
    eng.step()
    # A is mid-prefill: nothing waits, nothing decodes, yet the engine is not idle.
    assert not s.waiting_queue and s.running_batch.is_empty() and s.num_partial_prefills() == 1
    s.last_batch = None
    assert s.is_fully_idle() is False
    a = s.partial_reqs[0]
    pending = inquirer._get_num_pending_tokens()
    assert pending == 30_000 - h.prefix_len(a) > 0
    assert inquirer.get_num_waiting_uncached_tokens() == pending
    eng.run_to_completion()
    s.last_batch = None
    assert s.is_fully_idle() is True
    assert inquirer._get_num_pending_tokens() == 0
