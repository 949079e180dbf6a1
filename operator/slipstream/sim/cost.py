"""Roofline cost of one forward pass (one scheduler round).

    time = overhead(kind of pass) + max(compute, memory) + host load-back
    compute = linear FLOPs of every token in the round / peak
            + attention FLOPs (each token against its whole context) / attention rate
    memory  = (weights read + KV cache read by the round) / (bandwidth x efficiency)
    weights read = dense weights + routed experts x share of experts the round's tokens touch

A prefill chunk of L tokens that starts at context offset s attends to
``L*s + L*(L+1)/2`` (query, key) pairs and reads ``s`` tokens of KV; a decode token at
context c attends to c pairs and reads c tokens of KV. This is the model of seed 003
(prefill is compute-bound, decode memory-bound, the ridge between them) plus the
attention-over-context term that makes later chunks of a long prompt dearer.

A decode step of B requests thus costs overhead + weights read at B tokens + the KV of
every running token: on a mixture-of-experts model B tokens touch
``1 - (1 - k/E)**B`` of each layer's E experts (k per token, routed uniformly), so a step
of 8 reads about a quarter of DeepSeek-V3's experts and a step of 64 nearly all of them.
That, not the KV term, is what makes SGLang's measured TPOT grow from 12.8 to 34.6 ms
between 8 and 64 concurrent requests (the profiles' ``decode_source``).
"""

from __future__ import annotations

import functools
import math

from slipstream.sim.profiles import Profile

SOLO_MEMO = 1 << 14
"""Most ``CostModel.solo_prefill_s`` results a cost model keeps (then it starts afresh)."""

PREFILL, DECODE, MIXED = 0, 1, 2
"""Kinds of pass, for their fixed overhead: prefill (extend) only, decode only, or both."""


def expert_share(profile: Profile, tokens: int) -> float:
    """Expected share of a layer's routed experts that ``tokens`` tokens touch (uniform routing)."""
    if not profile.routed_experts or tokens <= 0:
        return 0.0 if tokens <= 0 else 1.0
    return 1.0 - (1.0 - profile.experts_per_token / profile.routed_experts) ** tokens


def weight_read_bytes(profile: Profile, tokens: int) -> float:
    """Bytes of weights a pass of ``tokens`` tokens reads: the dense part, and the experts touched."""
    dense = profile.weight_bytes - profile.routed_expert_bytes
    return dense + profile.routed_expert_bytes * expert_share(profile, max(tokens, 1))


@functools.lru_cache(maxsize=16)
def _weights_table(profile: Profile, bandwidth: float) -> tuple[float, ...]:
    """Weight-read seconds by pass size, up to the size where the experts are all but all
    touched (share within 1e-6 of 1); empty for a dense model. Cached: every engine run
    builds a cost model, and a recommendation makes some sixty runs on one profile."""
    if not profile.routed_expert_bytes:
        return ()
    table = []
    n = 0
    while expert_share(profile, max(n, 1)) < 1.0 - 1e-6:
        table.append(weight_read_bytes(profile, n) / bandwidth)
        n += 1
    return tuple(table)


def chunk_pairs(offset: int, length: int) -> int:
    """Attention (query, key) pairs of a causal chunk of ``length`` tokens after ``offset``."""
    return length * offset + length * (length + 1) // 2


class CostModel:
    """Per-pass times from a profile, with the constants folded for the hot loop."""

    __slots__ = ("profile", "linear_s", "attn_s", "weights_s", "kv_s", "overhead_s", "host_s",
                 "overheads", "weights_by_tokens", "_solo")

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def of(profile: Profile) -> CostModel:
        """The cost model of ``profile``, shared: its ``solo_prefill_s`` memo then serves
        every engine run on the profile (a recommendation makes some sixty on one workload)."""
        return CostModel(profile)

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.linear_s = profile.flops_per_token / profile.peak_flops
        self.attn_s = (
            profile.attn_flops_per_pair / profile.attn_flops_per_s
            if profile.attn_flops_per_pair
            else 0.0
        )
        bandwidth = profile.mem_bandwidth * profile.mem_efficiency
        self.weights_s = profile.weight_bytes / bandwidth
        """Seconds to read every weight (a pass whose tokens touch every expert)."""
        self.kv_s = profile.kv_bytes_per_token / bandwidth
        self.weights_by_tokens = _weights_table(profile, bandwidth)
        """Seconds of weight reads of a pass of n tokens, for n below the table's length;
        from there on every expert is touched (``weights_s``)."""
        self.overhead_s = profile.overhead_s
        self.overheads = (profile.overhead_s, profile.decode_overhead_s, profile.mixed_overhead_s)
        """Fixed cost per kind of pass, indexed by PREFILL, DECODE, MIXED."""
        self.host_s = (
            profile.kv_bytes_per_token / profile.host_bandwidth if profile.host_bandwidth else 0.0
        )
        self._solo: dict[tuple[int, int, int, int], float] = {}

    def pass_time(
        self, tokens: int, pairs: int, kv_read: int, host_load_tokens: int = 0,
        kind: int = PREFILL,
    ) -> float:
        """Seconds for one forward pass over ``tokens`` new tokens: the one cost formula.

        ``pairs`` are the (query, key) attention pairs of the pass, ``kv_read`` the tokens
        of KV it reads, ``host_load_tokens`` the HiCache tokens loaded back before it.
        """
        compute = tokens * self.linear_s + pairs * self.attn_s
        table = self.weights_by_tokens
        memory = (table[tokens] if tokens < len(table) else self.weights_s) + kv_read * self.kv_s
        return self.overheads[kind] + (compute if compute > memory else memory) + (
            host_load_tokens * self.host_s
        )

    def solo_prefill_s(
        self, cached: int, need: int, budget: int, host_load_tokens: int = 0
    ) -> float:
        """TTFT of a request alone on an idle engine: whole-budget chunks, no decodes.
        Memoised (a pure function of its arguments; at most ``SOLO_MEMO`` entries kept)."""
        key = (cached, need, budget, host_load_tokens)
        memo = self._solo
        found = memo.get(key)
        if found is not None:
            return found
        if len(memo) >= SOLO_MEMO:
            memo.clear()
        total = memo[key] = self._solo_prefill_s(cached, need, budget, host_load_tokens)
        return total

    def _solo_prefill_s(self, cached: int, need: int, budget: int, host_load_tokens: int) -> float:
        total = 0.0
        offset = cached
        left = need
        host = host_load_tokens
        while left > 0:
            take = budget if left > budget else left
            total += self.pass_time(take, chunk_pairs(offset, take), offset, host)
            host = 0
            offset += take
            left -= take
        return total

    def ridge_tokens(self) -> int:
        """Prefill tokens a pass can carry before it turns compute-bound (seed 003's ridge)."""
        return math.floor(self.weights_s / self.linear_s) if self.linear_s else 0
