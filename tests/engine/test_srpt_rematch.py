"""srpt's bounded re-match: the patch's real ``SchedulePolicy.calc_priority`` against the
twin's queue, round by round, with more than ``SRPT_REMATCH_MAX`` (128) waiting.

Both releases, patched (``srpt`` is the patch's order). Both sides get the same queue,
round after round, as ``tests/engine/test_upstream_orders.py`` drives 0.5.23's own orders:
requests arrive (appended, as ``Scheduler._add_request_to_queue`` does), prefixes enter
the cache between rounds, the front of the queue is admitted. Each round ``calc_priority``
(real ``SchedulePolicy``, real ``RadixCache``, real ``Req`` objects) and the twin's
``WaitQueue.start_round`` (with the twin engine's own ``_rematch`` and ``_unmatched``)
order the queue, and the orders must be the same: both re-match only the first 128 of the
list (last round's order, new requests behind), keep every other request's last key (a
prefix cached since then does not move it) and key a request never matched by its whole
prompt.

Both caches are fed the same prefixes (``twin_caches.Caches``). srpt's tie-break is the
request id: the rids are the twin's sequence numbers, zero-padded, so both sides break
ties alike.
"""

from __future__ import annotations

import random

import pytest
from sglang.srt.managers import long_prefill as lp
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from twin_caches import Caches, sglang_req

from slipstream.sim import engine, queue
from slipstream.sim.engine import Job
from slipstream.sim.queue import WaitQueue

AGING = 1024.0
K = lp.SRPT_REMATCH_MAX
assert K == queue.SRPT_REMATCH_MAX == 128


class Pair(Caches):
    """The patched scheduler's srpt over SGLang's waiting list and radix cache, beside the
    twin's WaitQueue and PrefixCache."""

    def __init__(self, rematch_max: int = queue.SRPT_REMATCH_MAX) -> None:
        set_global_server_args_for_scheduler(
            ServerArgs(
                model_path="dummy",
                schedule_policy="srpt",
                device="cpu",
                attention_backend="torch_native",
                disable_overlap_schedule=True,
            )
        )
        super().__init__()
        self.policy = SchedulePolicy("srpt", self.tree, False, False, False)
        self.policy.srpt_aging_tokens_per_s = AGING
        self.waiting: list[Req] = []
        self.queue: WaitQueue[Job] = WaitQueue("srpt", AGING)
        self.queue.rematch_max = rematch_max
        cache = self.cache
        self.queue.rematch = lambda job: engine._rematch(job, cache)
        self.queue.unmatched = engine._unmatched
        self.seq = 0

    def arrive(self, tokens: list[int], at_s: float) -> None:
        seq = self.seq
        self.seq += 1
        self.queue.push(self.arrived_job(seq, f"{seq:06d}", tokens, at_s))
        self.waiting.append(sglang_req(f"{seq:06d}", tokens, at_s))

    def round(self) -> tuple[list[str], list[str]]:
        """Both sides order their queue; returns (the engine's rids, the twin's)."""
        self.policy.calc_priority(self.waiting)
        self.queue.start_round(0)
        return [r.rid for r in self.waiting], [j.rid for j in self.queue.items]

    def admit(self, k: int) -> None:
        del self.waiting[:k]
        self.queue.pop_front(k)


def traffic(pair: Pair, seed: int) -> list[tuple[int, list[str], list[str]]]:
    """Rounds of random traffic across 128 waiting: bursts of arrivals, many of them a
    cached document's prefix plus a few fresh tokens (a big hit that a whole-prompt key
    hides), documents cached between rounds, the front admitted. (waiting, engine order,
    twin order) per round."""
    rng = random.Random(seed)
    docs = [pair.fresh(rng.choice((500, 2000, 6000))) for _ in range(6)]
    now = 0.0
    out = []
    for rnd in range(40):
        burst = rng.choice((0, 5, 40, 90)) if rnd < 20 else rng.choice((0, 2))
        for _ in range(burst):
            now += rng.choice((0.0, 0.01, 0.3))
            if rng.random() < 0.5:
                tokens = rng.choice(docs) + pair.fresh(rng.randint(1, 50))
            else:
                tokens = pair.fresh(rng.randint(1, 8000))
            pair.arrive(tokens, now)
        if rng.random() < 0.3:
            pair.cache_prefix(rng.choice(docs))
        size = len(pair.waiting)
        got, twin = pair.round()
        out.append((size, got, twin))
        admit = rng.choice((0, 1, 4)) if rnd < 20 else rng.choice((40, 80))
        pair.admit(min(size, admit))
    return out


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_twin_orders_as_the_patch_above_and_below_128(seed):
    rounds = traffic(Pair(), seed)
    for rnd, (size, got, twin) in enumerate(rounds):
        assert twin == got, f"seed {seed} round {rnd} ({size} waiting): twin {twin[:10]} vs engine {got[:10]}"
    sizes = [size for size, _, _ in rounds]
    assert max(sizes) > 2 * K and min(sizes[sizes.index(max(sizes)) :]) < K, sizes


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_a_twin_that_rematches_everyone_orders_otherwise(seed):
    """The same traffic with a twin that re-matches every waiting request (no bound): its
    order leaves the engine's once more than 128 wait, so the bound is what the first
    test checks, not an accident of the traffic."""
    rounds = traffic(Pair(rematch_max=10**9), seed)
    differ = [size for size, got, twin in rounds if twin != got]
    assert differ and min(differ) > K, differ
