"""SGLang 0.5.23's shortest-prefill-first with T > 0 on the patched scheduler against the
twin's ``spf`` order (``sim.policies.spf_allocate``), round by round.

The patch composes the two caps for each partial in turn: a partial's chunk takes at most T
and at most ``SchedulePolicy.shortest_prefill_chunk_limit`` computed against the waiting
queue with the budget left when its turn comes; the waiting queue is in shortest-prefill
order (uncached work, then queue entry time). The tuner may choose this order at any T on
0.5.23 (``spec.tuning.orders``), so the twin must predict it as the engine runs it. Mixes
carry no shared prefixes: upstream's in-batch prefix de-duplication is checked at T = 0 in
test_upstream_orders.py.
"""

from __future__ import annotations

import harness as h
import sglang
from hypothesis import example, given
from hypothesis import strategies as st
from test_conformance import AGING, SETTINGS, Cand, engine_partials, run_rounds

from slipstream.sim import admission, policies

assert sglang.__version__ == "0.5.23", f"this file drives sglang 0.5.23, not {sglang.__version__}"


def spf_prediction(eng, rule, max_partials):
    partials = engine_partials(eng)
    for r in partials:
        end = h.extend_end(r)
        if end is not None and end > h.prefix_len(r):
            eng.s.stash_chunked_request(r)
    p_cands = [Cand(r.rid, len(r.origin_input_ids) - h.extend_end(r)) for r in partials]
    waiting = []
    for r in eng.s.waiting_queue:
        h.match_prefix(eng.s.tree_cache, r)
        total = len(r.origin_input_ids)
        waiting.append((total - min(h.prefix_len(r), total - 1), r.time_stats.wait_queue_entry_time, r.rid))
    waiting.sort(key=lambda w: (w[0], w[1]))
    w_cands = [Cand(rid, need) for need, _, rid in waiting]
    return policies.spf_allocate(rule, p_cands, w_cands, max_partials=max_partials)


def check(t, mix, chunked_prefill_size=4096):
    rule = admission.AdmissionRule(chunked_prefill_size, t, "ceiling", 1, max_prefill_tokens=16384)
    eng = h.make_engine(policy="shortest-prefill-first", aging=AGING, kv_tokens=400_000, max_reqs=32,
                        max_context_len=h.context_for(max(need for _, need in mix) + 1),
                        chunked_prefill_size=chunked_prefill_size, threshold=t)
    max_partials = eng.s.max_partial_prefills
    run_rounds(eng, mix, lambda: spf_prediction(eng, rule, max_partials))
    assert eng.slots_free() == eng.slots_free_at_start


mixes = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from([1, 30, 500, 2_000, 4_000, 9_000, 30_000]) | st.integers(1, 40_000)),
    min_size=1,
    max_size=9,
)


@SETTINGS
@given(mix=mixes, t=st.sampled_from([512, 1024, 2048, 4096]))
# Two long partials and short requests behind them: the second partial is cut to leave the
# short ones their room (the case sim/policies' unit test works out by hand).
@example(mix=[(0, 20_000), (0, 20_000), (1, 100), (1, 300)], t=2048)
def test_spf_with_a_threshold_matches_twin(mix, t):
    check(t, mix)
