"""The twin's SGLang 0.5.23 orders (``sim/upstream_orders.py``) on hand-worked queues.

The same orders are compared with SGLang 0.5.23's own ``calc_priority`` in
tests/engine/test_upstream_orders.py (engine environment); these cases need no sglang.
"""

from __future__ import annotations

from test_sglang_policies import J

from slipstream.sim import engine, policies, profiles
from slipstream.sim.queue import LPM_FCFS_FALLBACK, WaitQueue
from slipstream.sim.upstream_orders import deprioritized
from slipstream.sim.workload import Request


def ids(q: WaitQueue) -> list[int]:
    return [j.seq for j in q.items]


def _blocks(j: J) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return j.blocks, (16,) * len(j.blocks)


def test_in_batch_dedup_sends_later_sharers_back_in_list_order():
    a = J(0, 0.0, 100, blocks=(1, 2, 3))
    b = J(1, 0.1, 10, blocks=(1, 2, 9))        # shares 32 tokens with a: deprioritised
    c = J(2, 0.2, 10, blocks=(1, 8))           # shares 16 < 32: inserted
    d = J(3, 0.3, 10, cached_est=48, blocks=(1, 2, 3))  # 48 cached > 32: never checked
    assert deprioritized([a, b, c, d], _blocks) == {1}
    assert deprioritized([b, a, c, d], _blocks) == {0}  # the walk's order decides who goes back
    assert deprioritized([a, b], None) == set()


def test_spf_dedup_and_entry_time_ties():
    q: WaitQueue[J] = WaitQueue("spf", 1024)
    q.prefix = _blocks
    q.push(J(0, 0.0, 500, blocks=(1, 2, 3)))
    q.push(J(1, 0.1, 10, blocks=(1, 2, 4)))    # shortest, but shares a's prefix
    q.push(J(2, 0.2, 200, blocks=(7,)))
    q.push(J(3, 0.05, 200, blocks=(8,)), entry_s=9.0)  # re-entered late (a retraction)
    q.start_round(0)
    assert ids(q) == [2, 3, 0, 1]


def test_hrrn_past_128_keeps_its_last_order_and_queues_newcomers_behind():
    q: WaitQueue[J] = WaitQueue("hrrn", 1024)
    for k in range(LPM_FCFS_FALLBACK):
        q.push(J(k, float(k), 1000 - k))        # the later, the shorter
    q.start_round(1000)
    ranked = ids(q)
    assert ranked == list(range(LPM_FCFS_FALLBACK))[::-1]  # highest ratio: shortest first
    q.push(J(500, 500.0, 1))                    # 129 waiting: no sort, behind the rest
    q.start_round(5000)
    assert ids(q) == [*ranked, 500]
    q.pop_front(1)                              # back at 128: sorted again
    q.start_round(6000)                         # the newcomer waited 5000 tokens for 1: first
    assert ids(q) == [500, *range(LPM_FCFS_FALLBACK - 2, -1, -1)]


def test_hrrn_ties_follow_one_seeded_rng_per_run():
    def order(seed: int) -> list[int]:
        q: WaitQueue[J] = WaitQueue("hrrn", 1024, seed=seed)
        for k in range(20):
            q.push(J(k, 0.0, 100))
        q.start_round(0)                         # every ratio is 0: ties only
        return ids(q)

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert sorted(order(1)) == list(range(20))


def test_every_waiting_request_is_rematched_each_round():
    """A prefix cached after arrival moves a request that is not at the head."""
    def req(rid: str, t: float, blocks: tuple[int, ...]) -> Request:
        return Request(rid, "t", t, 16 * len(blocks), 1, blocks, (16,) * len(blocks))

    eng = engine.Engine(policies.parse("sglang-spf", policies.EngineConfig()),
                        profiles.load("kimi-k3-8xh200"))
    jobs = [engine.Job(req("long", 0.0, tuple(range(100, 140))), 0),
            engine.Job(req("mid", 0.1, tuple(range(200, 220))), 1)]
    for job in jobs:
        engine._arrive(job, eng.cache)
        eng.queue.push(job)
    eng.queue.start_round(0)
    assert [j.rid for j in eng.queue.items] == ["mid", "long"]
    eng.cache.insert(tuple(range(100, 135)), (16,) * 35)   # most of "long" is now cached
    eng.queue.start_round(0)
    assert [j.rid for j in eng.queue.items] == ["long", "mid"]
    assert jobs[0].need == 16 * 5
