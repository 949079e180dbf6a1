"""Hand-checked allocation cases of the rule shared by the twin and the engine patch."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slipstream.sim.admission import AdmissionRule, Candidate, allocate, partials_first, srpt_key

C = 8192
THREE_LONG = [Candidate("a", 500_000), Candidate("b", 500_000), Candidate("c", 500_000)]


def alloc_list(rule: AdmissionRule, waiting: list[Candidate], partials=()) -> list[int]:
    got = allocate(rule, list(partials), waiting)
    return [got.get(c.rid, 0) for c in [*partials, *waiting]]


def test_stock_gives_the_first_long_request_the_whole_budget():
    assert alloc_list(AdmissionRule(C), THREE_LONG) == [8192, 0, 0]


def test_ceiling_splits_the_budget_among_c_over_t_long_requests():
    assert alloc_list(AdmissionRule(C, 4096, "ceiling"), THREE_LONG) == [4096, 4096, 0]
    assert alloc_list(AdmissionRule(C, 2048, "ceiling"), THREE_LONG + [Candidate("d", 10**6)]) == [
        2048, 2048, 2048, 2048
    ]


def test_floor_gives_a_lone_long_request_the_whole_budget():
    assert alloc_list(AdmissionRule(C, 4096, "floor"), THREE_LONG[:1]) == [8192]


def test_floor_with_two_long_requests_gives_each_its_floor():
    assert alloc_list(AdmissionRule(C, 4096, "floor"), THREE_LONG[:2]) == [4096, 4096]


def test_floor_leftover_goes_to_partials_oldest_first():
    rule = AdmissionRule(C, 2048, "floor", max_prefill_tokens=None)
    partials = [Candidate("old", 100_000)]
    waiting = [Candidate("short", 1000), Candidate("new", 50_000)]
    # old 2048, short 1000, new 2048, leftover 3096 -> old (oldest first)
    assert alloc_list(rule, waiting, partials) == [2048 + 3096, 1000, 2048]


def test_ceiling_leaves_budget_idle_for_a_lone_long_request():
    assert alloc_list(AdmissionRule(C, 4096, "ceiling"), THREE_LONG[:1]) == [4096]


def test_short_requests_are_admitted_whole_beside_a_capped_long_one():
    rule = AdmissionRule(C, 4096, "ceiling")
    waiting = [Candidate("cold", 600_000), Candidate("s1", 900), Candidate("hit", 3000)]
    assert alloc_list(rule, waiting) == [4096, 900, 3000]


def test_stock_chunked_request_holds_the_budget_until_it_finishes():
    rule = AdmissionRule(C)
    partials = [Candidate("cold", 1984)]
    waiting = [Candidate("s1", 900), Candidate("s2", 1500), Candidate("hit", 3000),
               Candidate("s3", 600), Candidate("s4", 1200)]
    # the rest of the budget after cold's last chunk: whole requests, then one truncated
    assert alloc_list(rule, waiting, partials) == [1984, 900, 1500, 3000, 600, 208]
    assert alloc_list(rule, waiting, [Candidate("cold", 500_000)]) == [8192, 0, 0, 0, 0, 0]


def test_truncation_is_page_aligned_and_stops_the_round():
    rule = AdmissionRule(C, 0, page_size=64)
    waiting = [Candidate("a", 8000), Candidate("b", 5000), Candidate("c", 10)]
    assert alloc_list(rule, waiting) == [8000, 192, 0]
    assert allocate(rule, [], waiting)["b"] % 64 == 0


def test_max_prefill_tokens_check_stops_once_it_is_used_up():
    # stock 0.5.18 with chunked prefill on (checked against the real PrefillAdder in
    # tests/engine): a 20K request is chunked in after a short one; rem_input_tokens
    # only stops admission after an admission has used it up.
    rule = AdmissionRule(C, 0, max_prefill_tokens=16384)
    assert alloc_list(rule, [Candidate("s", 1000), Candidate("big", 20_000)]) == [1000, 7192]
    small_m = AdmissionRule(C, 0, max_prefill_tokens=4096)
    waiting = [Candidate("a", 3000), Candidate("b", 2000), Candidate("c", 500)]
    assert alloc_list(small_m, waiting) == [3000, 2000, 0]


def test_budgets_are_charged_in_whole_pages():
    rule = AdmissionRule(2048, 0, page_size=16)
    waiting = [Candidate("a", 1001), Candidate("b", 1001), Candidate("c", 30), Candidate("d", 40)]
    # 1001 charges 1008 (63 pages); after a and b, 32 tokens are left: c (2 pages) fits.
    assert alloc_list(rule, waiting) == [1001, 1001, 30, 0]


def test_budget_override_for_mixed_batches():
    assert allocate(AdmissionRule(C), [], [Candidate("a", 9000)], budget=256) == {"a": 256}


@pytest.mark.parametrize("kwargs, message", [
    ({"threshold": 100, "page_size": 64}, "multiple of page_size"),
    ({"threshold": 16384}, "<= chunked_prefill_size"),
    ({"threshold": -1}, r"0 \(off\)"),
    ({"mode": "spiral"}, "mode must be one of"),
])
def test_invalid_rules_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdmissionRule(C, **kwargs)


def test_srpt_aging_bounds_overtaking():
    aging = 4096.0
    long_key = srpt_key(0.0, 409_600, aging)  # 100 s of aging
    assert srpt_key(99.0, 1, aging) < long_key  # arrived within the bound: may overtake
    assert srpt_key(100.5, 1, aging) > long_key  # arrived after it: never overtakes


def test_partials_first_except_srpt_ceiling():
    assert partials_first(AdmissionRule(C, 4096, "ceiling"), "fcfs")
    assert partials_first(AdmissionRule(C, 4096, "floor"), "srpt")
    assert partials_first(AdmissionRule(C, 0), "srpt")
    assert not partials_first(AdmissionRule(C, 4096, "ceiling"), "srpt")


# ---- memory: the KV reservation rule (kv_free, max_partials) ---------------------------

ISSUE = AdmissionRule(8192, 2048, "ceiling", max_prefill_tokens=None)
"""The issue's reproduction: C = 8192, T = 2048, ceiling, page 1."""


def test_without_kv_free_or_max_partials_the_rule_is_unchanged():
    waiting = THREE_LONG + [Candidate("s", 900)]
    rule = AdmissionRule(C, 2048, "ceiling")
    assert allocate(rule, [], waiting) == allocate(rule, [], waiting, kv_free=None,
                                                    max_partials=None)
    assert allocate(rule, [], waiting) == {"a": 2048, "b": 2048, "c": 2048, "s": 900}


def test_a_new_request_needs_its_whole_need_beside_the_partials_remainder():
    # Pool 40,000, three 30,000-token prompts: only A fits; B would over-commit.
    waiting = [Candidate("a", 30_000), Candidate("b", 30_000), Candidate("c", 30_000)]
    assert allocate(ISSUE, [], waiting, kv_free=40_000) == {"a": 2048}
    # Next round: A's remainder (27,952) is reserved, so B still does not fit.
    assert allocate(ISSUE, [Candidate("a", 27_952)], waiting[1:], kv_free=40_000 - 2048) == {
        "a": 2048
    }


def test_a_short_request_is_admitted_beside_a_reserved_partial():
    # free 37,952; A's remainder 27,952 (2048 this round): a 5,000-token prompt fits.
    got = allocate(ISSUE, [Candidate("a", 27_952)], [Candidate("s", 5_000)], kv_free=37_952)
    assert got == {"a": 2048, "s": 2048}
    # 10,000 does not: 10,000 + 1 page + 25,904 >= 37,952 - 2,049.
    got = allocate(ISSUE, [Candidate("a", 27_952)], [Candidate("s", 10_000)], kv_free=37_952)
    assert got == {"a": 2048}


def test_the_boundary_is_stocks_strict_check_plus_the_reservation():
    # kv_left = 10,000; need + out + page + reserve must stay below it.
    rule = AdmissionRule(C, 0, max_prefill_tokens=None)
    assert allocate(rule, [], [Candidate("a", 9_998)], kv_free=10_000) == {"a": 8192}
    assert allocate(rule, [], [Candidate("a", 9_999)], kv_free=10_000) == {}


@dataclass(frozen=True)
class WithOut:
    rid: str
    need: int
    out_reserve: int


def test_out_reserve_counts_in_the_check_and_in_the_charge():
    rule = AdmissionRule(C, 0, max_prefill_tokens=None)
    assert allocate(rule, [], [WithOut("a", 1000, 8999)], kv_free=10_000) == {}
    assert allocate(rule, [], [WithOut("a", 1000, 8998)], kv_free=10_000) == {"a": 1000}
    # a (finishing) charges 1000 + 1 + 4000 = 5001; b needs 4997 + 1 + 1 < 4999: no.
    got = allocate(rule, [], [WithOut("a", 1000, 4000), WithOut("b", 4997, 1)], kv_free=10_000)
    assert got == {"a": 1000}


def test_partials_are_never_refused_for_memory():
    got = allocate(ISSUE, [Candidate("a", 9_000), Candidate("b", 100)], [Candidate("w", 10)],
                   kv_free=0)
    assert got == {"a": 2048, "b": 100}


def test_srpt_a_refused_short_request_does_not_stall_the_partials():
    # The issue's stall: A and B hold 16,384 each; W (8,000) sorts first but does not fit
    # beside their reserved remainders; A and B are still served.
    merged = [Candidate("w", 8_000), Candidate("a", 13_616), Candidate("b", 13_616)]
    got = allocate(ISSUE, [], merged, kv_free=7_232, partial_rids={"a", "b"})
    assert got == {"a": 2048, "b": 2048}
    # Without partial_rids (today's twin call) they count as new and are refused too.
    assert allocate(ISSUE, [], merged, kv_free=7_232) == {}


def test_srpt_merged_partials_keep_todays_allocation_without_memory():
    merged = [Candidate("w", 1_000), Candidate("a", 13_616), Candidate("b", 13_616),
              Candidate("x", 50_000)]
    assert allocate(ISSUE, [], merged, partial_rids={"a", "b"}) == allocate(ISSUE, [], merged)


def test_max_partials_bounds_new_partials_and_ends_new_admissions():
    four = [Candidate(r, 100_000) for r in "abcd"] + [Candidate("s", 100)]
    assert allocate(ISSUE, [], four, max_partials=2) == {"a": 2048, "b": 2048}
    # A request that finishes this round is not a partial: the bound does not stop it.
    assert allocate(ISSUE, [Candidate("p", 50_000)], [Candidate("s", 100)],
                    max_partials=1) == {"p": 2048, "s": 100}
    # A partial finishing this round frees its place.
    assert allocate(ISSUE, [Candidate("p", 1_000)], [Candidate("n", 50_000)],
                    max_partials=1) == {"p": 1000, "n": 2048}


def test_stock_with_memory_checks_new_requests_after_the_last_chunk():
    rule = AdmissionRule(C, 0, max_prefill_tokens=None)
    got = allocate(rule, [Candidate("p", 1_000)], [Candidate("n", 20_000)], kv_free=22_000)
    assert got == {"p": 1000, "n": 7192}
    got = allocate(rule, [Candidate("p", 1_000)], [Candidate("n", 21_000)], kv_free=22_000)
    assert got == {"p": 1000}


def test_memory_is_charged_in_pages():
    rule = AdmissionRule(2048, 1024, "ceiling", page_size=16, max_prefill_tokens=None)
    # a: 1001 -> charges 1008 + 16; b's check: 1001 + 16 + 0 < 3000 - 1024 = 1976.
    got = allocate(rule, [], [Candidate("a", 1001), Candidate("b", 1001)], kv_free=3_000)
    assert got == {"a": 1001, "b": 1001}
    got = allocate(rule, [], [Candidate("a", 1001), Candidate("b", 1001)], kv_free=2_041)
    assert got == {"a": 1001}
