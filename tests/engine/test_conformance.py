"""Conformance with the digital twin: on randomized request mixes, every round's
allocation of the patched scheduler equals `slipstream.sim.admission.allocate` given the
same state (partials in progress, waiting queue in the order's sort, remaining needs)."""

from __future__ import annotations

import harness as h
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.managers.schedule_policy import match_prefix_for_req

from slipstream.sim import admission

AGING = admission.DEFAULT_SRPT_AGING_TOKENS_PER_S


def engine_partials(eng):
    s = eng.s
    if getattr(s, "partial_reqs", None):
        return list(s.partial_reqs)
    return [s.chunked_req] if s.chunked_req is not None else []


def twin_prediction(eng, rule, order):
    partials = engine_partials(eng)
    p_cands = [(r, len(r.origin_input_ids) - r.extend_range.end) for r in partials]
    w_cands = []
    for r in eng.s.waiting_queue:
        match_prefix_for_req(eng.s.tree_cache, r)
        total = len(r.origin_input_ids)
        w_cands.append((r, total - min(len(r.prefix_indices), total - 1)))

    def key(item):
        r, need = item
        arrival = r.time_stats.wait_queue_entry_time
        return (admission.srpt_key(arrival, need, AGING), arrival, r.rid)

    if order == "srpt":
        w_cands.sort(key=key)
    if not admission.partials_first(rule, order):
        w_cands = sorted(p_cands + w_cands, key=key)
        p_cands = []
    cand = lambda items: [admission.Candidate(r.rid, need) for r, need in items]  # noqa: E731
    return admission.allocate(rule, cand(p_cands), cand(w_cands))


mixes = st.lists(
    st.tuples(
        st.integers(0, 6),
        st.sampled_from([1, 30, 500, 2_000, 4_000, 9_000, 30_000]) | st.integers(1, 40_000),
    ),
    min_size=1,
    max_size=9,
)


def check(engine_kwargs, order, mix, prefix_len=0, kv_tokens=600_000):
    C = engine_kwargs["chunked_prefill_size"]
    T = engine_kwargs.get("threshold", 0)
    mode = engine_kwargs.get("mode", "ceiling")
    page = engine_kwargs.get("page_size", 1)
    rule = admission.AdmissionRule(C, T, mode, page, max_prefill_tokens=16384)
    eng = h.make_engine(policy=order, aging=AGING, kv_tokens=kv_tokens, **engine_kwargs)
    prefix = list(range(1, prefix_len + 1))
    arrivals = sorted(mix, key=lambda x: x[0])
    t = 0.0
    rnd = 0
    while arrivals or eng.busy():
        while arrivals and arrivals[0][0] <= rnd:
            _, need = arrivals.pop(0)
            t += 1.0
            eng.add(need, prefix=prefix if need % 2 else None, arrival=t)
        predicted = twin_prediction(eng, rule, order)
        got = eng.step()
        assert got == predicted, f"round {rnd}: engine {got} != twin {predicted}"
        assert list(got) == list(predicted), f"round {rnd}: admission order differs"
        rnd += 1
        assert rnd < 5_000
    assert eng.slots_free() == eng.slots_free_at_start
    assert eng.kv_free() == eng.kv_free_at_start


SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(
    mix=mixes,
    t=st.sampled_from([0, 512, 1024, 2048, 4096]),
    order=st.sampled_from(["fcfs", "srpt"]),
)
def test_ceiling_matches_twin(mix, t, order):
    check({"chunked_prefill_size": 4096, "threshold": t}, order, mix)


@SETTINGS
@given(
    mix=mixes, t=st.sampled_from([512, 1024, 2048, 4096]), order=st.sampled_from(["fcfs", "srpt"])
)
def test_floor_matches_twin(mix, t, order):
    check({"chunked_prefill_size": 4096, "threshold": t, "mode": "floor"}, order, mix)


@SETTINGS
@given(mix=mixes, t=st.sampled_from([0, 256, 1024]), mode=st.sampled_from(["ceiling", "floor"]))
def test_paged_with_prefix_cache_matches_twin(mix, t, mode):
    check(
        {"chunked_prefill_size": 2048, "threshold": t, "mode": mode, "page_size": 16},
        "fcfs",
        mix,
        prefix_len=1000,
    )


def test_stock_three_long_requests_match_twin_to_completion():
    # round 61 of stock: the first request's last 288 tokens, then 7,904 of the next one
    check({"chunked_prefill_size": 8192}, "fcfs", [(0, 500_000)] * 3, kv_tokens=1_600_000)


def test_engine_default_aging_is_the_twins():
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs(model_path="dummy").srpt_aging_tokens_per_s == AGING
