"""The queue mix over the real edge: an engine simulator (`slipstream engine-sim`, a real
process) scraped by a real Prometheus, read by the operator's Observer.

One ServingDeployment team-c/mix (pod sim-q, stock fcfs, 8192-token budget). Tenant giant
sends two cold 200,000-token prompts, then tenant chat sends thirty cold 500-token ones:
under fcfs the chat requests wait behind the giants for ~29 twin seconds. While they wait,
the snapshot must show them: arrivals counted on arrival, the queue's composition by size
class. Once everything is through, the per-class token counters say where the work was.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import observe_helpers
import pytest
from observe_helpers import wait_for
from test_observe_enginesim import requests, start_sim

from slipstream.api import snapshot as snap
from slipstream.controller import stages
from slipstream.enginesim import load
from slipstream.localkube import prometheus as localprom
from slipstream.observe import Observer, ObserveSettings
from slipstream.observe.client import PromClient
from slipstream.rollout import sequential

prometheus_binary = observe_helpers.prometheus_binary

TIME_SCALE = 2.0
"""Twin seconds per wall second (the module's sims share test_observe_enginesim's start)."""
SETTINGS = ObserveSettings(window_s=60.0, min_samples=20, max_staleness_s=10.0)
MIX = "team-c/mix"
GIANT_TOKENS, CHAT_TOKENS, CHATS = 200_000, 500, 30
BURST = "burst"
"""The sub-window test's own tenant: what another test leaves in flight cannot fall in its cells."""


def mix_of(s: snap.WorkloadSnapshot, tenant: str) -> snap.TenantMix:
    got = s.mix_of(tenant)
    assert got is not None, (s.mix_fallback, s.queue_mix, s.detail)
    return got


@pytest.fixture(scope="module")
def prom(prometheus_binary, tmp_path_factory) -> Iterator[tuple[localprom.PrometheusServer, str]]:
    workdir = tmp_path_factory.mktemp("queuemix")
    sim, url = start_sim("sim-q", workdir, "--long-prefill-token-threshold", "0", "--schedule-policy", "fcfs")
    server = None
    try:
        target = localprom.StaticTarget(url.removeprefix("http://"), namespace="team-c", pod="sim-q",
                                        servingdeployment="mix")
        server = localprom.PrometheusServer.start(workdir / "prometheus", static=[target])
        server.wait_for_targets(1)
        # One request per tenant first, so every counter's series exists before the load
        # (increase() cannot count what a series held at its first scrape).
        warm = [*requests("giant", 1, 1000, 0, 900), *requests("chat", 1, 1000, 0, 901),
                *requests(BURST, 1, 1000, 0, 902)]
        assert all(o.ok for o in load.replay(warm, [url], TIME_SCALE, prompt="field", report_every_s=0))
        client = PromClient(server.url)
        # Ten scrapes of every tenant's series before the load: increase() extrapolates
        # toward the window's end by up to 1.1 scrape intervals, which on a series scraped
        # only a few times is a large share of what it spans.
        arrivals = 'count_over_time({__name__=~"sglang.request_arrivals_total"}[60s])'
        wait_for(lambda: [x.value for x in client.query(arrivals, time.time())],
                 lambda v: len(v) == 3 and min(v) >= 10, deadline_s=30, what="every tenant's arrival series scraped ten times")
        client.close()
        yield server, url
    finally:
        if server is not None:
            server.stop()
        sim.stop()


def test_waiting_requests_show_by_size_class_and_arrivals_before_their_first_token(prom):
    server, url = prom
    load_ = [*requests("giant", 2, GIANT_TOKENS, 0, 5000),
             *requests("chat", CHATS, CHAT_TOKENS, 0.1, 6000)]
    outcomes: list[load.Outcome] = []
    sender = threading.Thread(target=lambda: outcomes.extend(
        load.replay(sorted(load_, key=lambda r: r.arrival_s), [url], TIME_SCALE, prompt="field",
                    report_every_s=0)))
    sender.start()
    try:
        observer = Observer(server.url, SETTINGS)
        # While the chats wait: every one has arrived, most have no first token yet.
        waiting = wait_for(lambda: observer.read([MIX])[MIX],
                           lambda s: s.mix_of("chat") is not None and s.mix_of("chat").queued >= CHATS - 5,
                           deadline_s=20, what="the waiting chats in the queue mix")
        assert waiting.mix_fallback is None
        chat = mix_of(waiting, "chat")
        le1k = chat.size_class("le1k")
        assert le1k is not None and le1k.queued == chat.queued
        assert le1k.queued_tokens == CHAT_TOKENS * le1k.queued
        # increase() extrapolates toward the window's edges; the count is 30 plus that slack.
        assert chat.arrivals_per_s * SETTINGS.window_s == pytest.approx(CHATS, rel=0.25)
        first = next((t.ttft.total for t in waiting.tenants if t.name == "chat"), 0.0)
        assert first < CHATS - 5 + 2, "first tokens alone would hide the waiting chats"
        giant = mix_of(waiting, "giant")
        # Two arrivals; with so few, increase()'s extrapolation adds up to about one more.
        assert 2 <= giant.arrivals_per_s * SETTINGS.window_s < 3.5
        le300k = giant.size_class("le300k")
        assert le300k is not None and le300k.queued_tokens == GIANT_TOKENS * le300k.queued
    finally:
        sender.join(timeout=120)
    assert outcomes and all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok][:3]

    # Everything through: the queue reads empty, the per-class counters hold the work.
    done = wait_for(lambda: observer.read([MIX])[MIX],
                    lambda s: s.mix_of("chat") is not None and s.mix_of("chat").queued == 0
                    and (c := s.mix_of("chat").size_class("le1k")) is not None and c.first_tokens >= CHATS * 0.9,
                    deadline_s=20, what="the chats' first tokens counted by class")
    giant_done = mix_of(done, "giant").size_class("le300k")
    assert giant_done is not None and giant_done.cached_tokens == 0, "cold giants stay cold"
    assert giant_done.uncached_tokens / giant_done.first_tokens == pytest.approx(GIANT_TOKENS, rel=0.01)
    # Both giants count, the first one too: its tenant's size-class series exist at 0 from
    # its arrival, so increase() sees the first token (a series born at 200,000 adds 0).
    assert giant_done.first_tokens >= 1.9, giant_done
    assert giant_done.uncached_tokens >= 1.9 * GIANT_TOKENS, giant_done
    chat_done = mix_of(done, "chat").size_class("le1k")
    assert chat_done is not None
    # The warm-up's 1,000-token request is le1k too and may fall in the window.
    mean = chat_done.uncached_tokens / chat_done.first_tokens
    assert CHAT_TOKENS * 0.99 <= mean <= (CHATS * CHAT_TOKENS + 1000) / (CHATS + 1) * 1.01


def test_sub_window_cells_of_a_pod_subset_count_its_first_tokens(prom):
    """The sequential canary rule's input over the real edge: per (tenant, size class)
    ``_count``/``_sum`` increases of pod subsets over successive 5 s sub-windows, one query."""
    server, url = prom
    n = 20
    # The tenant's series exist since the fixture's warm-up and are scraped every second, so
    # the first sub-window holds samples from before these requests. (A quiet stretch on a
    # shared tenant is not enough: a late scrape can hide another test's last first tokens.)
    start = time.time() - 3
    sent = load.replay(requests(BURST, n, CHAT_TOKENS, 0.2, 7000), [url], TIME_SCALE, prompt="field",
                       report_every_s=0)
    assert all(o.ok for o in sent), [o.error for o in sent if not o.ok][:3]
    latency = stages.ObserveLatency(Observer(server.url, SETTINGS), min_samples=1)

    def read() -> list[sequential.SubWindow]:
        now = time.time()
        return asyncio.run(latency.sub_windows("team-c", "mix", ["sim-q"], ["sim-q"], start, now, 5.0))

    def counted(windows: list[sequential.SubWindow]) -> float:
        return sum(h.count for w in windows for c, h in w.canary.items() if c == (BURST, "le1k"))

    # Scraped every second. increase() sees only the samples inside a sub-window and
    # extrapolates to its edges, so the sub-windows hold about n: a token between two
    # sub-windows' samples is partly lost, the edges' extrapolation adds some.
    windows = wait_for(read, lambda ws: counted(ws) >= n * 0.75, deadline_s=20, what="the chats in the cells")
    assert n * 0.75 <= counted(windows) <= n * 1.6
    assert all(w.end_s - w.start_s == 5.0 for w in windows)
    assert all(w.canary == w.baseline for w in windows), "the same pod on both sides reads the same"
    cells = [h for w in windows for c, h in w.canary.items() if c == (BURST, "le1k")]
    assert cells and all(0 < h.mean_s < 10 for h in cells)
    # equal sides are never slower: the rule never rolls back on them
    assert sequential.evaluate(windows, sequential.SequentialRule(min_samples=1), final=True).outcome == "Promote"


def test_the_size_class_series_is_found_for_the_pods_that_export_it(prom):
    """What tells a scrape gap over a whole analysis from engines without the histogram:
    the real Prometheus finds the simulator's size-class series for its pod, and none for a
    pod name it never scraped (or another deployment)."""
    server, _ = prom
    latency = stages.ObserveLatency(Observer(server.url, SETTINGS), min_samples=1)

    def exports(deployment: str, pods: list[str]) -> bool:
        return asyncio.run(latency.exports_size_classes("team-c", deployment, pods, time.time(), 600.0))

    assert wait_for(lambda: exports("mix", ["sim-q"]), bool, deadline_s=20, what="the size-class series")
    assert exports("mix", ["sim-q", "sim-none"])
    assert not exports("mix", ["sim-none"])
    assert not exports("other", ["sim-q"])
