"""Prefix cache: hits come from the blocks the traffic shares, LRU eviction, host tier."""

from __future__ import annotations

from slipstream.sim.cache import PrefixCache


def test_hit_is_the_leading_run_of_cached_blocks():
    c = PrefixCache(10_000)
    c.insert([1, 2, 3], [512, 512, 100])
    assert c.match([1, 2, 9, 3], [512, 512, 512, 100]) == (1024, 0)
    assert c.match([9, 1], [512, 512]) == (0, 0)


def test_lru_evicts_the_least_recently_used_block():
    c = PrefixCache(1024)
    c.insert([1, 2], [512, 512])
    c.match([1], [512])  # 1 is now most recent
    c.insert([3], [512])  # evicts 2
    assert c.peek([1], [512]) == 512
    assert c.peek([2], [512]) == 0
    assert c.peek([3], [512]) == 512


def test_evicted_blocks_move_to_the_host_tier_and_hit_there():
    c = PrefixCache(512, host_capacity_tokens=10_000)
    c.insert([1], [512])
    c.insert([2], [512])  # 1 goes to host
    assert c.match([1], [512]) == (0, 512)
    assert c.peek([1, 5], [512, 512]) == 512


def test_zero_capacity_caches_nothing():
    c = PrefixCache(0)
    c.insert([1], [512])
    assert c.peek([1], [512]) == 0
