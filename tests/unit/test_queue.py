"""Admission orders of the waiting queue."""

from __future__ import annotations

from dataclasses import dataclass

from slipstream.sim.queue import LPM_FCFS_FALLBACK, WaitQueue


@dataclass
class J:
    seq: int
    arrival_s: float
    need: int
    cached_est: int


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
    assert ids(q) == [1, 0]
