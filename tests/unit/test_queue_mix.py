"""The queue mix, observed: size classes, the engine simulator's series, the snapshot built
from them (with its named fallbacks) and the twin workload made from that snapshot.

Samples are written by hand (as in test_observe.py) and the simulated pod is driven by an
injected clock, so each rule is pinned by a case that fails if it moves.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slipstream.api import buckets
from slipstream.api import snapshot as snap
from slipstream.enginesim import bodies, flags
from slipstream.enginesim.clock import Clock
from slipstream.enginesim.pod import SimPod
from slipstream.observe import assemble, parse
from slipstream.tune import twin_workload

NOW = 1_800_000_000.0
RULES = assemble.Rules(window_s=60.0, min_samples=10, max_staleness_s=10.0)
DEP = {"namespace": "ns", "servingdeployment": "chat"}


# -- size classes --------------------------------------------------------------------


def test_size_classes_are_ascending_le_bounds_of_the_uncached_histogram():
    uppers = [upper for _, upper in buckets.SIZE_CLASSES]
    assert uppers == sorted(uppers) and math.isinf(uppers[-1]) and len(uppers) == 5
    assert all(u in buckets.PROMPT_TOKENS for u in uppers[:-1])
    assert [buckets.size_class(n) for n in (1, 1000, 1001, 8000, 60_001, 300_000, 600_000)] == [
        "le1k", "le1k", "le8k", "le8k", "le300k", "le300k", "gt300k"]


# -- the engine simulator's series ---------------------------------------------------


def scraped(pod: SimPod) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(pod.scrape().decode()):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k in ("tenant", "size_class", "cache", "le")))
            out[(s.name, labels)] = s.value
    return out


def request(prompt_tokens: int) -> bodies.Incoming:
    return bodies.completion({"prompt": "x", "max_tokens": 2, "slipstream": {"prompt_tokens": prompt_tokens}})


def test_enginesim_counts_arrivals_and_the_waiting_queue_by_tenant_and_size_class():
    cfg = flags.parse(["--tokenizer-metrics-allowed-custom-labels", "tenant", "--chunked-prefill-size", "8192"], {})
    wall = [0.0]
    pod = SimPod(cfg, Clock(1.0, wall=lambda: wall[0]))
    for _ in range(6):
        pod.submit(request(50_000), {"tenant": "docs"})
    for _ in range(3):
        pod.submit(request(500), {"tenant": "chat"})
    pod.step()
    got = scraped(pod)
    arrivals = {t: got[("sglang:request_arrivals_total", (("tenant", t),))] for t in ("docs", "chat")}
    assert arrivals == {"docs": 6.0, "chat": 3.0}
    queued = {k[1]: v for k, v in got.items() if k[0] == "sglang:queue_reqs_by_size_class"}
    # Stock order at t=0: the budget goes to the first long prompts; the rest wait. Both
    # have no first token yet, and both count.
    assert sum(queued.values()) == pod.driver.waiting + pod.driver.partials and pod.driver.waiting > 0
    assert set(queued) <= {(("size_class", "le60k"), ("tenant", "docs")), (("size_class", "le1k"), ("tenant", "chat"))}
    docs = (("size_class", "le60k"), ("tenant", "docs"))
    # Each counts whole, the ones part-way through their prefill too (as the patched engine
    # counts a prompt until its first output).
    assert pod.driver.partials > 0 and sum(need for _, need in pod.driver.partial_needs()) < 50_000 * pod.driver.partials
    assert got[("sglang:queue_tokens_by_size_class", docs)] == 50_000 * queued[docs]

    for _ in range(200):  # run the twin to the end: every request gets its first token
        wall[0] = min(pod.step(), wall[0] + 100.0)
        if not pod.in_flight:
            break
    got = scraped(pod)
    assert all(v == 0 for k, v in got.items() if k[0] == "sglang:queue_reqs_by_size_class"), "a drained queue reads 0"
    assert got[("sglang:ttft_by_size_class_seconds_count", (("size_class", "le60k"), ("tenant", "docs")))] == 6
    assert got[("sglang:ttft_by_size_class_seconds_count", (("size_class", "le1k"), ("tenant", "chat")))] == 3
    uncached = got[("sglang:prompt_tokens_by_size_class_total", (("cache", "uncached"), ("size_class", "le60k"), ("tenant", "docs")))]
    cached = got[("sglang:prompt_tokens_by_size_class_total", (("cache", "cached"), ("size_class", "le60k"), ("tenant", "docs")))]
    assert uncached + cached == 6 * 50_000 and cached == 0


# -- the snapshot --------------------------------------------------------------------


def sample(value: float, **labels: str) -> parse.Sample:
    return parse.Sample({**DEP, **labels}, value, NOW)


def results(**over: list[parse.Sample]) -> dict[str, list[parse.Sample]]:
    base = {
        "ttft": [sample(20, tenant="chat", le="1", part="bucket"), sample(20, tenant="chat", le="+Inf", part="bucket"),
                 sample(5.0, tenant="chat", part="sum")],
        "uncached": [sample(20, tenant="chat", le="1000", part="bucket"),
                     sample(20, tenant="chat", le="+Inf", part="bucket"), sample(8000, tenant="chat", part="sum")],
        "tokens": [sample(30000, tenant="chat", part="cached"), sample(38000, tenant="chat", part="prompt")],
        "queue": [sample(4, part="depth"), sample(NOW - 1, part="newest")],
        "settings": [sample(0, pod="chat-0", part="threshold")],
        "targets": [sample(1, pod="chat-0", part="up")],
        "mix": mix_rows(),
    }
    return {**base, **over}


def mix_rows() -> list[parse.Sample]:
    return [
        sample(30, tenant="chat", part="arrivals"),
        sample(20, tenant="chat", size_class="le1k", part="first_tokens"),
        sample(8000, tenant="chat", size_class="le1k", cache="uncached", part="tokens"),
        sample(30000, tenant="chat", size_class="le1k", cache="cached", part="tokens"),
        sample(6, tenant="chat", size_class="le1k", part="queued"),
        sample(2400, tenant="chat", size_class="le1k", part="queued_tokens"),
        # A tenant whose giant prompts all still wait: no first token, yet it shows.
        sample(4, tenant="batch", part="arrivals"),
        sample(4, tenant="batch", size_class="gt300k", part="queued"),
        sample(2_400_000, tenant="batch", size_class="gt300k", part="queued_tokens"),
    ]


def one(res: dict[str, list[parse.Sample]]) -> snap.WorkloadSnapshot:
    return assemble.snapshots(res, now=NOW, rules=RULES, deployments=["ns/chat"])["ns/chat"]


def test_the_snapshot_keeps_arrivals_and_the_composition_per_size_class():
    s = one(results())
    assert s.valid and s.mix_fallback is None, s.detail
    chat, batch = s.mix_of("chat"), s.mix_of("batch")
    assert chat is not None and batch is not None
    assert chat.arrivals_per_s == pytest.approx(30 / 60)
    assert [c.name for c in chat.classes] == list(buckets.SIZE_CLASS_NAMES)
    le1k = chat.size_class("le1k")
    assert le1k == snap.SizeClassWindow("le1k", 20, 8000, 30000, 6, 2400)
    assert le1k.cached_per_uncached == pytest.approx(30000 / 8000)
    assert batch.arrivals_per_s == pytest.approx(4 / 60) and batch.queued == 4
    assert [t.name for t in s.tenants] == ["chat"], "first-token tenants are unchanged"
    assert s.extra["arrivals_per_s"] == pytest.approx(34 / 60)


def test_an_engine_without_the_mix_series_falls_back_by_name():
    for res in (results(mix=[]), {k: v for k, v in results().items() if k != "mix"}):
        s = one(res)
        assert s.valid and s.mix_fallback == snap.NO_MIX_SERIES and s.queue_mix == ()


def test_an_unknown_size_class_is_not_used():
    s = one(results(mix=[*mix_rows(), sample(1, tenant="chat", size_class="le2k", part="queued")]))
    assert s.valid and s.mix_fallback == snap.UNKNOWN_SIZE_CLASS and s.queue_mix == ()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -3.0])
@pytest.mark.parametrize("part", ["arrivals", "queued"])
def test_garbled_mix_values_make_the_snapshot_not_finite(bad, part):
    rows = [sample(bad, tenant="chat", part=part, **({} if part == "arrivals" else {"size_class": "le1k"})),
            *(r for r in mix_rows() if not (r.label("tenant") == "chat" and r.label("part") == part))]
    s = one(results(mix=rows))
    assert s.invalid == snap.NOT_FINITE and "queue mix of tenant chat" in s.detail


def test_starving_requests_show_when_no_first_token_came():
    empty = [sample(0, tenant="chat", le="+Inf", part="bucket"), sample(0, tenant="chat", part="sum")]
    s = one(results(ttft=empty, uncached=empty))
    assert s.invalid == snap.NO_TRAFFIC
    assert "34 arrived, 10 waiting" in s.detail


# -- the twin workload ---------------------------------------------------------------


def test_the_twin_replays_arrivals_and_keeps_long_cold_prompts_cold():
    s = one(results())
    w = twin_workload.synthesize(s, max_requests=2000, max_span_s=math.inf)
    chat = [r for r in w.requests if r.tenant == "chat"]
    batch = [r for r in w.requests if r.tenant == "batch"]
    # Rates from arrivals (30 and 4 in 60 s), not from first tokens (20 and 0).
    assert len(chat) / len(batch) == pytest.approx(30 / 4, rel=0.1)
    # The waiting giant prompts are replayed from the queue's composition, cold.
    assert batch and all(r.prompt_tokens > 300_000 and r.warm_blocks == 0 for r in batch)
    assert sum(r.prompt_tokens for r in batch) / len(batch) == pytest.approx(600_000, rel=0.05)
    # Chat keeps its class's hit: cached per uncached 30000 / 8000.
    assert all(r.warm_blocks == 1 and r.block_sizes[0] == round(r.block_sizes[1] * 3.75) for r in chat)


def test_without_the_mix_one_hit_ratio_applies_to_every_request():
    s = one(results(mix=[]))
    w = twin_workload.synthesize(s, max_requests=200)
    assert {r.tenant for r in w.requests} == {"chat"}
    hit = 30000 / 38000
    assert all(abs(r.block_sizes[0] - r.block_sizes[1] * hit / (1 - hit)) <= 1 for r in w.requests)


# -- the tuner's memo ----------------------------------------------------------------


def test_a_change_in_the_queue_mix_alone_is_not_the_same_workload_to_the_memo():
    """The twin's workload is made from the mix, so a snapshot whose first-token figures are
    unchanged but whose arrivals or waiting giants moved must run the twin again."""
    from slipstream.tune import memo

    base = one(results())
    seen = memo.fingerprint(base, 10)
    assert memo.fingerprint(one(results()), 10).close_to(seen)
    more_giants = [r for r in mix_rows() if r.label("tenant") != "batch"] + [
        sample(40, tenant="batch", part="arrivals"),
        sample(40, tenant="batch", size_class="gt300k", part="queued"),
        sample(24_000_000, tenant="batch", size_class="gt300k", part="queued_tokens"),
    ]
    moved = one(results(mix=more_giants))
    assert moved.tenants == base.tenants, "first-token figures unchanged"
    assert not memo.fingerprint(moved, 10).close_to(seen)
    assert not memo.fingerprint(one(results(mix=[])), 10).close_to(seen), "mix gone"


def test_a_giant_counts_in_the_queue_mix_while_it_is_prefilled():
    """A giant part-way through its prefill has no first token yet and blocks the queue:
    the gauges count it whole, as the patched engine counts a prompt until its first output,
    so the mix shows it at its full size while it hurts (the mix-jump trigger), not
    shrinking as its chunks run, nor only once its first token lands in the window."""
    cfg = flags.parse(["--tokenizer-metrics-allowed-custom-labels", "tenant", "--chunked-prefill-size", "8192"], {})
    wall = [0.0]
    pod = SimPod(cfg, Clock(1.0, wall=lambda: wall[0]))
    pod.submit(request(200_000), {"tenant": "docs"})
    wall[0] = 1.0
    pod.step()
    assert pod.driver.partials == 1 and pod.driver.waiting == 0  # the giant is being prefilled
    got = scraped(pod)
    giant = (("size_class", "le300k"), ("tenant", "docs"))
    assert got[("sglang:queue_reqs_by_size_class", giant)] == 1
    (rid, need), = pod.driver.partial_needs()
    assert 0 < need < 200_000 and got[("sglang:queue_tokens_by_size_class", giant)] == 200_000
