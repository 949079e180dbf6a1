"""The twin's workload keeps what decides a threshold: the window's longest prompts, and the
requests still waiting (a giant prefilling has no first token yet)."""

from __future__ import annotations

from slipstream.api import buckets
from slipstream.api.snapshot import (
    PodSetting,
    SizeClassWindow,
    TenantMix,
    TenantWindow,
    WorkloadSnapshot,
    histogram_of,
)
from slipstream.sim.policies import FirstToken
from slipstream.tune import observed, twin_workload

PODS = tuple(PodSetting(f"pod-{k}", 0, "ceiling", "fcfs") for k in range(2))


def window(lengths: list[float], mix: tuple[TenantMix, ...] = ()) -> WorkloadSnapshot:
    chat = TenantWindow("chat", len(lengths) / 60.0, histogram_of([0.5] * len(lengths), buckets.TTFT_BOUNDS_S),
                        histogram_of(lengths, buckets.PROMPT_TOKENS), 0.0)  # fmt: skip
    return WorkloadSnapshot("prod/kimi", 60.0, 60.0, (chat,), pods=PODS, queue_mix=mix)


def giants(workload) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for r in workload.requests if r.prompt_tokens >= 100_000)


def test_one_giant_in_a_window_of_two_engines_is_always_in_the_replay() -> None:
    # One giant among 199 chat turns over two pods: half a giant per engine. Stratified draws
    # would leave it to the seed; the replay rounds it up, every seed.
    snap = window([2000.0] * 199 + [175_000.0])
    assert all(giants(twin_workload.synthesize(snap, 300, seed)) == 1 for seed in range(20))
    # No giant in the window, none in the replay.
    assert giants(twin_workload.synthesize(window([2000.0] * 200), 300, 0)) == 0


def test_a_waiting_giant_joins_the_lengths_before_its_first_token() -> None:
    classes = tuple(SizeClassWindow(name, queued=1.0 if name == "le300k" else 0.0,
                                    queued_tokens=175_000.0 if name == "le300k" else 0.0)
                    for name in buckets.SIZE_CLASS_NAMES)  # fmt: skip
    snap = window([2000.0] * 200, (TenantMix("chat", 200 / 60.0, classes),))
    merged = twin_workload.with_queued(snap.tenants[0].uncached_tokens, snap.queue_mix[0])
    assert merged.total == 201 and merged.sum == 200 * 2000.0 + 175_000.0
    assert giants(twin_workload.synthesize(snap, 300, 0)) == 1
    # A giant waiting stays cold: its class has no first token to take a cache ratio from.
    (giant,) = [r for r in twin_workload.synthesize(snap, 300, 0).requests if r.prompt_tokens >= 100_000]
    assert giant.warm_blocks == 0


def test_the_queue_mix_of_a_window_counts_arrivals_first_tokens_and_the_waiting() -> None:
    seen = [FirstToken("chat", 10.0 + k, 10.5 + k, 2000, 1500) for k in range(30)]
    snap = observed.snapshot_of("prod/kimi", seen, 60.0, 60.0)
    arrivals = [("chat", 10.0 + k) for k in range(30)] + [("code", 55.0), ("chat", -5.0)]
    mixed = observed.with_queue_mix(snap, seen, arrivals, [("code", 175_000)])
    chat, code = mixed.mix_of("chat"), mixed.mix_of("code")
    assert chat is not None and code is not None and mixed.mix_fallback is None
    assert chat.arrivals_per_s == 30 / 60.0 and code.arrivals_per_s == 1 / 60.0
    le8k = chat.size_class("le8k")
    assert le8k is not None and (le8k.first_tokens, le8k.uncached_tokens, le8k.cached_tokens) == (30, 45_000, 15_000)
    le300k = code.size_class("le300k")
    assert le300k is not None and (le300k.queued, le300k.queued_tokens) == (1, 175_000)
    invalid = observed.snapshot_of("prod/kimi", [], 60.0, 60.0)
    assert observed.with_queue_mix(invalid, [], arrivals, []) is invalid
