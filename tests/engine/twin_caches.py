"""SGLang's radix cache beside the twin's prefix cache, fed the same prefixes: the common
part of the tests that order one queue on both sides round by round
(``test_upstream_orders.py``, ``test_srpt_rematch.py``).

Token ids: a token id appears in only one prefix context (shared prefixes reuse the same
ids, fresh tokens are unique), so one twin block per token (size 1, block id = token id)
is the same prefix chain as SGLang's radix key."""

from __future__ import annotations

from array import array

import torch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.sampling.sampling_params import SamplingParams

from slipstream.sim import engine
from slipstream.sim.cache import PrefixCache
from slipstream.sim.engine import Job
from slipstream.sim.workload import Request


class Caches:
    def __init__(self) -> None:
        self.tree = RadixCache.create_simulated()
        self.cache = PrefixCache(10**9)
        self.next_token = 10**9

    def fresh(self, n: int) -> list[int]:
        """``n`` token ids no other prefix has."""
        start = self.next_token
        self.next_token += n
        return list(range(start, start + n))

    def cache_prefix(self, tokens: list[int]) -> None:
        """A computed prefix enters both caches."""
        self.tree.insert(
            InsertParams(
                key=RadixKey(token_ids=array("q", tokens), extra_key=None),
                value=torch.empty(len(tokens), dtype=torch.bool),
            )
        )
        self.cache.insert(tokens, (1,) * len(tokens))

    def arrived_job(self, seq: int, rid: str, tokens: list[int], at_s: float) -> Job:
        """The twin's request of ``tokens`` arriving at ``at_s`` (its prefix looked up)."""
        request = Request(rid, "t", at_s, len(tokens), 4, tuple(tokens), (1,) * len(tokens))
        job = Job(request, seq)
        engine._arrive(job, self.cache)
        return job


def sglang_req(rid: str, tokens: list[int], entry_s: float) -> Req:
    """SGLang's request of ``tokens``, entered into the waiting queue at ``entry_s``."""
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    params.normalize(None)
    req = Req(rid, "", array("q", tokens), params, vocab_size=1 << 40)
    req.time_stats.wait_queue_entry_time = entry_s
    return req
