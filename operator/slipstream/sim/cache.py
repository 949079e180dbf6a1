"""Prefix cache over block hashes, with LRU eviction and an optional host tier (HiCache).

Blocks are the traces' prefix hashes (Mooncake: one id per 512 tokens; equal ids are
shared prefix blocks). A request's cached prefix is the run of its leading blocks found
in the cache, so hits come from the traffic itself rather than from a constant. Blocks
evicted from the device tier move to the host tier when there is one; a hit there is
loaded back at the profile's host bandwidth (charged by the cost model).

Simplification, stated: blocks used by running requests are not pinned against eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


def usable_hit(prompt_tokens: int, cached: int) -> int:
    """Cached tokens a prompt can use: SGLang always computes at least its last token."""
    return min(cached, prompt_tokens - 1)


class _Tier:
    __slots__ = ("capacity", "used", "blocks")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.blocks: OrderedDict[int, int] = OrderedDict()

    def add(self, block: int, tokens: int) -> list[tuple[int, int]]:
        """Insert or refresh a block; returns the blocks evicted to make room."""
        blocks = self.blocks
        if block in blocks:
            blocks.move_to_end(block)
            return []
        blocks[block] = tokens
        self.used += tokens
        evicted: list[tuple[int, int]] = []
        while self.used > self.capacity and blocks:
            old, size = blocks.popitem(last=False)
            self.used -= size
            evicted.append((old, size))
        return evicted


class PrefixCache:
    """Device prefix cache of ``capacity_tokens`` plus an optional host tier."""

    def __init__(self, capacity_tokens: int, host_capacity_tokens: int = 0) -> None:
        if capacity_tokens < 0 or host_capacity_tokens < 0:
            raise ValueError("cache capacities must be >= 0 tokens")
        self.device = _Tier(capacity_tokens)
        self.host = _Tier(host_capacity_tokens) if host_capacity_tokens else None

    def match(self, blocks: Sequence[int], sizes: Sequence[int]) -> tuple[int, int]:
        """Tokens of the leading blocks cached (device, host); refreshes their recency."""
        device = self.device.blocks
        host = self.host.blocks if self.host is not None else None
        on_device = on_host = 0
        for block, size in zip(blocks, sizes, strict=True):
            if block in device:
                if on_host:
                    break  # a device block after a host-only one: the prefix chain is broken
                device.move_to_end(block)
                on_device += size
            elif host is not None and block in host:
                host.move_to_end(block)
                on_host += size
            else:
                break
        return on_device, on_host

    def admit(self, blocks: Sequence[int], sizes: Sequence[int], prompt_tokens: int
              ) -> tuple[int, int]:
        """A prompt's usable hit (refreshing recency) and how much of it is on the host tier."""
        on_device, on_host = self.match(blocks, sizes)
        cached = usable_hit(prompt_tokens, on_device + on_host)
        return cached, max(0, cached - on_device)

    def peek(self, blocks: Sequence[int], sizes: Sequence[int]) -> int:
        """Tokens of the leading blocks cached on either tier, without touching recency."""
        device = self.device.blocks
        host = self.host.blocks if self.host is not None else {}
        total = 0
        for block, size in zip(blocks, sizes, strict=True):
            if block in device or block in host:
                total += size
            else:
                break
        return total

    def insert(self, blocks: Iterable[int], sizes: Iterable[int]) -> None:
        """Cache a computed prefix (the whole prompt once its prefill is done).

        The same steps as ``_Tier.add`` per block, inlined: every prompt passes through
        here once per run, which made the per-block call the twin's hottest line.
        """
        device = self.device
        capacity = device.capacity
        if capacity == 0:
            return
        dev = device.blocks
        host = self.host
        used = device.used
        move, popitem = dev.move_to_end, dev.popitem
        for block, size in zip(blocks, sizes, strict=True):
            if block in dev:
                move(block)
                continue
            dev[block] = size
            used += size
            while used > capacity and dev:
                old, old_size = popitem(last=False)
                used -= old_size
                if host is not None:
                    host.add(old, old_size)
        device.used = used
