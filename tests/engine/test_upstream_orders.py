"""SGLang 0.5.23's own ``SchedulePolicy.calc_priority`` against the twin's queue, round by round.

Run in the 0.5.23 environment (``SGLANG_VERSION=0.5.23 bash tests/engine/run.sh``), on the
patched copy there: with T = 0 the patch must leave upstream's orders as they are. Both sides get the
same queue, round after round: requests arrive (appended, as ``Scheduler._add_request_to_queue``
does), prefixes enter the cache between rounds, retracted requests re-enter, the front of the
queue is admitted. Each round ``calc_priority`` (real ``SchedulePolicy``, real ``RadixCache``,
real ``Req`` objects) and the twin's ``WaitQueue.start_round`` (with the engine's own
``_rematch`` and ``_prefix``) order the queue, and the orders must be the same.

Shared token ids: a token id appears in only one prefix context (shared prefixes reuse the
same ids, fresh tokens are unique), so one twin block per token (size 1, block id = token id)
is the same prefix chain as SGLang's radix key. hrrn's tie-break is the request id: the
SGLang ``Req`` is given the twin's tie string (drawn from the queue's seeded RNG) as its rid.
A retracted request is given output tokens and no cached prefix on both sides (the twin's
rule: SGLang evicts before it retracts), and re-enters with a new entry time.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass

import pytest
import sglang
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import WAITING_QUEUE_PREFIX_MATCH_MAX, SchedulePolicy
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from twin_caches import Caches, sglang_req

from slipstream.sim import engine, upstream_orders
from slipstream.sim.engine import Job
from slipstream.sim.queue import WaitQueue
from slipstream.sim.workload import Request

assert sglang.__version__ == "0.5.23", f"this file drives sglang 0.5.23, not {sglang.__version__}"
assert WAITING_QUEUE_PREFIX_MATCH_MAX == upstream_orders.WAITING_QUEUE_PREFIX_MATCH_MAX

SGLANG_NAME = {"spf": "shortest-prefill-first", "hrrn": "hrrn"}


@dataclass
class Both:
    """One request on both sides."""

    job: Job
    req: Req


class Pair(Caches):
    """SGLang's waiting list and tree cache beside the twin's WaitQueue and PrefixCache."""

    def __init__(self, order: str, seed: int) -> None:
        set_global_server_args_for_scheduler(
            ServerArgs(
                model_path="dummy",
                schedule_policy=SGLANG_NAME[order],
                device="cpu",
                attention_backend="torch_native",
                disable_overlap_schedule=True,
            )
        )
        self.order = order
        super().__init__()
        self.policy = SchedulePolicy(SGLANG_NAME[order], self.tree, False, False, False)
        self.waiting: list[Req] = []
        self.queue: WaitQueue[Job] = WaitQueue(order, 1024.0, seed=seed, ties=True)  # ties name both sides
        cache = self.cache
        self.queue.rematch = lambda job: engine._rematch(job, cache)
        self.queue.prefix = engine._prefix
        self.processed = 0
        self.seq = 0
        self.by_seq: dict[int, Both] = {}

    def arrive(self, tokens: list[int], at_s: float) -> Both:
        """A new request of ``tokens`` (its prefix shared by reusing another's ids)."""
        seq = self.seq
        self.seq += 1
        job = self.arrived_job(seq, f"q{seq}", tokens, at_s)
        self.queue.push(job)
        req = self._req(self.queue.tie[seq], tokens, at_s)
        both = Both(job, req)
        self.by_seq[seq] = both
        return both

    def retracted(self, tokens: list[int], produced: int, arrived_s: float, now_s: float) -> Both:
        """A request that decoded ``produced`` tokens and was retracted at ``now_s``."""
        seq = self.seq
        self.seq += 1
        request = Request(
            f"q{seq}", "t", arrived_s, len(tokens), produced + 4, tuple(tokens), (1,) * len(tokens)
        )
        job = Job(request, seq)
        # what Engine._retract leaves in the job
        job.redo = produced
        job.need = len(tokens) + produced
        job.cached_est = 0
        self.queue.push(job, entry_s=now_s)
        req = self._req(self.queue.tie[seq], tokens, now_s)
        req.output_ids = array("q", self.fresh(produced))
        both = Both(job, req)
        self.by_seq[seq] = both
        return both

    def _req(self, rid: str, tokens: list[int], entry_s: float) -> Req:
        req = sglang_req(rid, tokens, entry_s)
        req.arrival_processed_tokens = self.processed
        self.waiting.append(req)
        return req

    def round(self) -> tuple[list[str], list[str]]:
        """Both sides order their queue; returns (SGLang's rids, the twin's)."""
        self.policy.calc_priority(self.waiting, processed_tokens=self.processed)
        self.queue.start_round(self.processed)
        return [r.rid for r in self.waiting], [self.queue.tie[j.seq] for j in self.queue.items]

    def admit(self, k: int, prefill_tokens: int) -> None:
        """The first ``k`` requests leave the queue; the pass computed ``prefill_tokens``."""
        del self.waiting[:k]
        self.queue.pop_front(k)
        self.processed += prefill_tokens
        self.queue.processed = self.processed  # as Engine does after each pass


def _check(pair: Pair, label: str) -> list[str]:
    sglang_order, twin_order = pair.round()
    assert twin_order == sglang_order, (
        f"{pair.order} {label}: twin {twin_order[:12]}... vs SGLang {sglang_order[:12]}..."
    )
    return sglang_order


@pytest.mark.parametrize("order", ["spf", "hrrn"])
def test_shared_prefixes_deprioritised_and_rematched(order):
    """In-batch de-duplication, and a cache hit that lands after arrival re-sorts the queue."""
    pair = Pair(order, seed=1)
    doc = pair.fresh(400)
    a = pair.arrive(doc + pair.fresh(100), 0.0)  # first with the document: checked, inserted
    b = pair.arrive(doc[:200] + pair.fresh(50), 0.1)  # shares 200 >= 32 with a: to the back
    c = pair.arrive(pair.fresh(300), 0.2)
    d = pair.arrive(doc[:20] + pair.fresh(600), 0.3)  # shares 20 < 32: not deprioritised
    first = _check(pair, "round 1")
    assert first[-1] == b.req.rid
    pair.admit(0, 500)
    pair.cache_prefix(doc)  # the document is now cached
    second = _check(pair, "round 2 (after the document is cached)")
    # a and b now hit the cache (400 and 200 cached > 32): neither is checked in the batch
    assert a.job.need == 100 and b.job.need == 50 and b.req.num_matched_prefix_tokens == 200
    assert second != first
    assert {c.req.rid, d.req.rid} <= set(second)


@pytest.mark.parametrize("order", ["spf", "hrrn"])
def test_ties(order):
    """Equal work and equal entry times (spf keeps the list order; hrrn breaks by rid)."""
    pair = Pair(order, seed=7)
    for k in range(12):
        pair.arrive(pair.fresh(100 if k % 2 else 300), 1.0)  # all enter at the same time
    _check(pair, "round 1 (all ratios 0)")
    pair.admit(3, 700)
    for _ in range(5):
        pair.arrive(pair.fresh(100), 2.0)
    _check(pair, "round 2")


@pytest.mark.parametrize("order", ["spf", "hrrn"])
def test_retracted_requests_reenter_with_a_new_entry_time(order):
    pair = Pair(order, seed=3)
    for k in range(6):
        pair.arrive(pair.fresh(200 + 10 * k), 0.1 * k)
    pair.admit(0, 2000)
    shared = pair.fresh(64)
    pair.arrive(shared + pair.fresh(10), 0.8)
    # shares 64 tokens with the request before it (de-duplicated); its work counts its output
    r = pair.retracted(shared + pair.fresh(90), produced=30, arrived_s=0.0, now_s=5.0)
    pair.arrive(pair.fresh(120), 5.0)
    order = _check(pair, "after a retraction")
    assert r.job.need == 154 + 30 and order[-1] == r.req.rid
    pair.admit(2, 1500)
    _check(pair, "next round")


@pytest.mark.parametrize("order", ["spf", "hrrn"])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_queues_below_and_above_128(order, seed):
    """Many rounds of random traffic across the 128 limit: hrrn keeps its last order past
    it (new requests behind), spf sorts at any length; both re-match and de-duplicate."""
    rng = random.Random(seed)
    pair = Pair(order, seed=seed)
    docs = [pair.fresh(rng.choice((40, 200, 1000))) for _ in range(6)]
    never_cached = pair.fresh(300)  # retracted requests' prefix: no cache hit on either side
    now = 0.0
    sizes: list[int] = []
    crossed_above = crossed_below = False
    for rnd in range(40):
        burst = rng.choice((0, 2, 8, 40)) if rnd < 25 else rng.choice((0, 1))
        for _ in range(burst):
            now += rng.choice((0.0, 0.01, 0.5))
            head = (
                rng.choice(docs + [never_cached])[: rng.choice((10, 40, 1000))]
                if rng.random() < 0.6
                else []
            )
            pair.arrive(head + pair.fresh(rng.randint(1, 3000)), now)
        if rng.random() < 0.2:
            pair.retracted(
                never_cached[: rng.choice((10, 50, 300))] + pair.fresh(rng.randint(10, 500)),
                produced=rng.randint(1, 200),
                arrived_s=max(0.0, now - 3.0),
                now_s=now,
            )
        if rng.random() < 0.3:
            pair.cache_prefix(rng.choice(docs))
        size = len(pair.waiting)
        sizes.append(size)
        if size > WAITING_QUEUE_PREFIX_MATCH_MAX:
            crossed_above = True
        elif crossed_above:
            crossed_below = True
        before = [r.rid for r in pair.waiting]
        after = _check(pair, f"seed {seed} round {rnd} ({size} waiting)")
        if order == "hrrn" and size > WAITING_QUEUE_PREFIX_MATCH_MAX:
            assert after == before  # past 128: last order kept, newcomers behind
        admit = rng.choice((0, 1, 3, 10)) if rnd < 25 else rng.choice((10, 30))
        pair.admit(min(size, admit), rng.randint(0, 8192))
    assert crossed_above and crossed_below, sizes
