"""Admission orders of the waiting queue."""

from __future__ import annotations

from dataclasses import dataclass

from slipstream.sim.queue import LPM_FCFS_FALLBACK, SRPT_REMATCH_MAX, WaitQueue


@dataclass
class J:
    seq: int
    arrival_s: float
    need: int
    cached_est: int
    redo: int = 0
    srpt_key: tuple[float, float, int] | None = None


def ids(q: WaitQueue) -> list[int]:
    return [j.seq for j in q.items]


def test_fcfs_is_arrival_order():
    q: WaitQueue[J] = WaitQueue("fcfs", 4096)
    for k, need in enumerate([5000, 10, 300]):
        q.push(J(k, float(k), need, 0))
    assert ids(q) == [0, 1, 2]


def test_srpt_puts_short_work_first_within_the_aging_bound():
    q: WaitQueue[J] = WaitQueue("srpt", 1000)
    q.push(J(0, 0.0, 50_000, 0))  # key 50
    q.push(J(1, 1.0, 100, 0))     # key 1.1
    q.push(J(2, 60.0, 10, 0))     # key 60.01: arrived after the long one's bound
    assert ids(q) == [0, 1, 2]  # as the engine's list: sorted at the start of a round
    q.start_round(0)
    assert ids(q) == [1, 0, 2]


def test_lpm_prefers_long_cached_prefixes_then_falls_back_to_fcfs():
    q: WaitQueue[J] = WaitQueue("lpm", 4096)
    q.push(J(0, 0.0, 100, 0))
    q.push(J(1, 1.0, 100, 9000))
    assert ids(q) == [1, 0]
    for k in range(2, LPM_FCFS_FALLBACK + 2):
        q.push(J(k, float(k), 100, k))
    assert ids(q)[:3] == [0, 1, 2]  # past 128 waiting: arrival order, as SGLang
    q.pop_front(10)
    assert ids(q)[0] == LPM_FCFS_FALLBACK + 1  # back under the limit: longest prefix first


def test_changing_the_order_resorts_the_queue():
    q: WaitQueue[J] = WaitQueue("fcfs", 4096)
    q.push(J(0, 0.0, 90_000, 0))
    q.push(J(1, 0.5, 100, 0))
    q.set_order("srpt")
    q.start_round(0)
    assert ids(q) == [1, 0]


def test_srpt_rematches_the_first_128_of_the_list_and_keeps_the_others_keys():
    """As the engine patch's ``srpt_order`` (the twin against the real scheduler:
    tests/engine/test_srpt_rematch.py): a round re-matches the first ``SRPT_REMATCH_MAX``
    of the list; a request never matched is keyed by its whole prompt; a kept key does
    not move when the cache changes until its request is among the first 128 again."""
    whole = 10_000
    q: WaitQueue[J] = WaitQueue("srpt", 1000)
    hits: dict[int, int] = {}
    matched: list[int] = []

    def rematch(job: J) -> None:
        matched.append(job.seq)
        job.need = whole - hits.get(job.seq, 0)

    q.rematch, q.unmatched = rematch, lambda job: whole
    for k in range(SRPT_REMATCH_MAX + 72):
        q.push(J(k, 0.0, whole, 0))
    late = J(999, 0.0, 10, 0)  # its prompt is nearly all cached: need 10 when matched
    hits[999] = whole - 10
    q.push(late)
    q.start_round(0)
    assert matched == list(range(SRPT_REMATCH_MAX)), "the first 128 of the list only"
    assert ids(q)[-1] == 999, "never matched: keyed by its whole prompt, behind the ties"
    q.pop_front(150)  # the front admitted: it is among the first 128 now
    matched.clear()
    q.start_round(0)
    assert 999 in matched and ids(q)[0] == 999
    # A cache change reaches a kept key only once its request is re-matched.
    q2: WaitQueue[J] = WaitQueue("srpt", 1000)
    q2.rematch, q2.unmatched = rematch, lambda job: whole
    for k in range(SRPT_REMATCH_MAX + 1):
        q2.push(J(2000 + k, float(k) * 1e-3, whole, 0))
    q2.start_round(0)
    hits[2000 + SRPT_REMATCH_MAX] = whole - 10  # the last one's prefix is cached now
    q2.start_round(0)
    assert ids(q2)[-1] == 2000 + SRPT_REMATCH_MAX, "beyond 128: its last key, not the cache's"
    q2.rematch_max = SRPT_REMATCH_MAX + 1
    q2.start_round(0)
    assert ids(q2)[0] == 2000 + SRPT_REMATCH_MAX


def test_hrrn_ties_are_drawn_at_push_only_where_hrrn_may_sort():
    # A queue that never sorts by hrrn draws no ties; one turned to hrrn draws them for the
    # requests waiting then and every push after; one told that it may turn (the engine
    # with a controller) draws at every push, the same ties as a queue under hrrn throughout.
    q: WaitQueue[J] = WaitQueue("fcfs", 4096)
    q.push(J(0, 0.0, 100, 0))
    q.push(J(1, 1.0, 200, 0))
    assert q.tie == {}
    q.pop_front(1)
    q.set_order("hrrn")
    assert set(q.tie) == {1}
    q.push(J(2, 2.0, 300, 0))
    assert set(q.tie) == {1, 2}
    hrrn: WaitQueue[J] = WaitQueue("hrrn", 4096, seed=7)
    may_turn: WaitQueue[J] = WaitQueue("fcfs", 4096, seed=7, ties=True)
    for k in range(3):
        hrrn.push(J(k, float(k), 100, 0))
        may_turn.push(J(k, float(k), 100, 0))
    assert len(set(hrrn.tie.values())) == 3 and may_turn.tie == hrrn.tie
