"""Observe against a real Prometheus scraping real exporters every second.

Three ServingDeployments' pods (static targets with the labels of INTERFACES.md section E):
team-a/chat (pods chat-0, chat-1; tenants acme and zeta), team-b/batch (two idle pods,
batch-1 a stock engine without setting gauges),
team-c/gone (one pod whose exporter is stopped in the last test). Observations are driven
by the test; every figure the observer reports is checked against the observations and
against Prometheus's own ``histogram_quantile`` at the same evaluation time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import observe_helpers
import pytest
from engine_exporter import EngineExporter
from observe_helpers import wait_for

from slipstream.api import models
from slipstream.api import snapshot as snap
from slipstream.localkube import prometheus as localprom
from slipstream.observe import Observer, ObserveSettings, queries
from slipstream.observe.client import PromClient
from slipstream.observe.fleet import FleetObserver

prometheus_binary = observe_helpers.prometheus_binary
"""Fixtures from observe_helpers (no conftest.py here: see its docstring)."""

WINDOW_S = 60.0
SETTINGS = ObserveSettings(window_s=WINDOW_S, min_samples=50, max_staleness_s=10.0)

PODS = {
    "chat-0": ("team-a", "chat"),
    "chat-1": ("team-a", "chat"),
    "batch-0": ("team-b", "batch"),
    "batch-1": ("team-b", "batch"),
    "gone-0": ("team-c", "gone"),
}

# (pod, tenant) -> [(ttft_s, prompt_tokens, cached_tokens)]
TRAFFIC = {
    ("chat-0", "acme"): [(0.05 + 0.03 * i, 2000, 1500) for i in range(40)],
    ("chat-1", "acme"): [(0.3 + 0.02 * i, 1000, 0) for i in range(20)],
    ("chat-1", "zeta"): [(5.0 + i, 50_000, 10_000) for i in range(30)],
    ("gone-0", "acme"): [(0.5, 100, 0) for _ in range(10)],
}
OUTPUT_TOKENS = {"acme": 200, "zeta": 1500}
"""Output length of every request of a tenant (sglang:generation_tokens_histogram)."""


@dataclass
class Fleet:
    prom: localprom.PrometheusServer
    exporters: dict[str, EngineExporter]
    t_eval: float
    """A time at which every observation is inside the window (fixed-clock reads)."""

    def observer(self, settings: ObserveSettings = SETTINGS, at: float | None = None) -> Observer:
        t = self.t_eval if at is None else at
        return Observer(self.prom.url, settings, clock=lambda: t)

    def promql(self, expr: str) -> list[float]:
        client = PromClient(self.prom.url)
        try:
            return [s.value for s in client.query(expr, self.t_eval)]
        finally:
            client.close()


@pytest.fixture(scope="module")
def fleet(prometheus_binary, tmp_path_factory) -> Iterator[Fleet]:
    exporters: dict[str, EngineExporter] = {}
    prom = None
    try:
        exporters["chat-0"] = EngineExporter(threshold=2048, mode="floor", policy="srpt")
        exporters["chat-1"] = EngineExporter(threshold=4096, mode="ceiling", policy="fcfs")
        exporters["batch-0"] = EngineExporter()
        exporters["batch-1"] = EngineExporter(threshold=None)
        exporters["gone-0"] = EngineExporter()
        targets = [
            localprom.StaticTarget(exporters[pod].address, namespace=ns, pod=pod, servingdeployment=sd)
            for pod, (ns, sd) in PODS.items()
        ]
        prom = localprom.PrometheusServer.start(
            tmp_path_factory.mktemp("prometheus"), static=targets, scrape_interval_s=1.0
        )
        prom.wait_for_targets(len(targets))
        # Every tenant's series exists at zero before its first request (as in SGLang, where
        # the first request creates them), and a scrape has seen the zeros; batch-0 gets a
        # tenant too, which never sends anything.
        for pod, tenant in [*TRAFFIC, ("batch-0", "idle")]:
            exporters[pod].open_tenant(tenant)
        client = PromClient(prom.url)
        count = 'count(sglang:time_to_first_token_seconds_count{servingdeployment!=""})'
        wait_for(lambda: [s.value for s in client.query(count, time.time())],
                 lambda v: v == [5.0], deadline_s=20, what="zero series scraped")
        client.close()
        for (pod, tenant), requests in TRAFFIC.items():
            for ttft, prompt, cached in requests:
                exporters[pod].request(tenant, ttft, prompt, cached, OUTPUT_TOKENS[tenant])
        exporters["chat-0"].set_queue(3)
        exporters["chat-1"].set_queue(4)

        # increase() extrapolates to the window's end by (gap to the last sample) / (span of
        # the samples): with >= 15 one-second samples per series that is under 1/14, so the
        # counts below hold within 10%.
        samples = ('min(count_over_time({__name__=~"sglang.time_to_first_token_seconds_count",'
                   ' servingdeployment!=""}[1m]))')
        client = PromClient(prom.url)
        wait_for(lambda: [s.value for s in client.query(samples, time.time())],
                 lambda v: bool(v) and v[0] >= 15, deadline_s=40, what="15 samples per series")
        client.close()

        def chat_and_gone() -> tuple[float, float, float | None]:
            got = Observer(prom.url, SETTINGS).read(["team-a/chat", "team-c/gone"])
            chat = got["team-a/chat"]
            return chat.requests, got["team-c/gone"].requests, chat.queue_depth

        wait_for(chat_and_gone, lambda r: r[0] >= 89.5 and r[1] >= 9.5 and r[2] == 7,
                 deadline_s=30, what="observations and queue gauges visible in Prometheus")
        yield Fleet(prom, exporters, time.time())
    finally:
        if prom is not None:
            prom.stop()
        for exporter in exporters.values():
            exporter.stop()


def test_a_valid_snapshot_per_deployment_with_per_tenant_figures(fleet):
    chat = fleet.observer().read(["team-a/chat"])["team-a/chat"]
    assert chat.valid, chat.detail
    assert [t.name for t in chat.tenants] == ["acme", "zeta"]
    acme, zeta = chat.tenants
    # increase() extrapolates (see the fixture): within 10%.
    assert acme.ttft.total == pytest.approx(60, rel=0.1)
    assert zeta.ttft.total == pytest.approx(30, rel=0.1)
    assert acme.requests_per_s == pytest.approx(acme.ttft.total / WINDOW_S)
    # acme's slowest is 1.22 s, in the (1, 2] bucket; zeta's 34 s, in (20, 40].
    assert 20 < zeta.ttft_p99_s <= 40
    assert 1 < acme.ttft_p99_s <= 2
    assert acme.ttft_p50_s < acme.ttft_p99_s
    # The mean TTFT from _sum/_count: acme's 60 observations average 0.61 s.
    expected_mean = sum(t for pod in ("chat-0", "chat-1") for t, _, _ in TRAFFIC[(pod, "acme")]) / 60
    assert acme.ttft.mean == pytest.approx(expected_mean, rel=0.05)
    # Cache hits: acme 40*1500 / (40*2000 + 20*1000); zeta 10000/50000.
    assert acme.cache_hit_ratio == pytest.approx(60_000 / 100_000, rel=0.02)
    assert zeta.cache_hit_ratio == pytest.approx(0.2, rel=0.02)
    # Uncached tokens: zeta's 40,000 each fall in (35000, 40000]; acme's 500 and 1000.
    assert zeta.uncached_tokens.quantile(0.5) == pytest.approx(37_500, rel=0.01)
    assert chat.uncached_tokens is not None
    assert chat.uncached_tokens.total == pytest.approx(90, rel=0.1)
    # Output lengths: acme's 200 each in (100, 300], zeta's 1500 in (1000, 1500].
    assert acme.output_tokens is not None and zeta.output_tokens is not None
    assert acme.output_tokens.total == pytest.approx(60, rel=0.1)
    assert acme.output_tokens.mean == pytest.approx(200, rel=0.01)
    assert 100 < acme.output_tokens.quantile(0.5) <= 300
    assert 1000 < zeta.output_tokens.quantile(0.99) <= 1500
    assert chat.queue_depth == 7
    assert chat.pods == (
        snap.PodSetting("chat-0", 2048, "floor", "srpt"),
        snap.PodSetting("chat-1", 4096, "ceiling", "fcfs"),
    )
    assert chat.extra["targets_up"] == 2 and chat.extra["targets_down"] == 0
    assert 0 <= chat.extra["newest_sample_age_s"] <= SETTINGS.max_staleness_s


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("tenant", ["acme", "zeta"])
def test_quantiles_agree_with_promql_histogram_quantile(fleet, tenant, q):
    chat = fleet.observer().read(["team-a/chat"])["team-a/chat"]
    mine = {t.name: t for t in chat.tenants}[tenant].ttft.quantile(q)
    sel = f'namespace="team-a", servingdeployment="chat", tenant="{tenant}"'
    expr = (f"histogram_quantile({q}, sum by (le) "
            f"(increase(sglang:time_to_first_token_seconds_bucket{{{sel}}}[{queries.window(WINDOW_S)}])))")
    (theirs,) = fleet.promql(expr)
    assert math.isfinite(theirs)
    assert mine == pytest.approx(theirs, rel=1e-9)


def test_one_query_per_metric_family_whatever_the_number_of_deployments(fleet):
    observer = fleet.observer()
    observer.read(["team-a/chat"])
    one = observer.queries_made
    observer.read(["team-a/chat", "team-b/batch", "team-c/gone", "team-z/ghost"])
    four = observer.queries_made - one
    observer.read()
    everything = observer.queries_made - one - four
    assert one == four == everything == len(queries.fleet_reads(WINDOW_S)) == 23


def test_an_idle_deployment_is_no_traffic_not_zero_latency(fleet):
    batch = fleet.observer().read(["team-b/batch"])["team-b/batch"]
    assert batch.invalid == snap.NO_TRAFFIC
    assert "Prometheus answered" in batch.detail
    # batch-1 exports no setting gauge and is still one of the deployment's pods.
    assert batch.pods == (snap.PodSetting("batch-0", 0, "ceiling", "fcfs"), snap.PodSetting("batch-1", None, "", ""))
    assert batch.extra["targets_up"] == 2


def test_a_deployment_nobody_scrapes_has_no_series(fleet):
    ghost = fleet.observer().read(["team-z/ghost"])["team-z/ghost"]
    assert ghost.invalid == snap.NO_SERIES
    assert 'up{servingdeployment="ghost"}' in ghost.detail


def test_too_few_samples_below_the_minimum(fleet):
    settings = ObserveSettings(window_s=WINDOW_S, min_samples=1000, max_staleness_s=10.0)
    chat = fleet.observer(settings).read(["team-a/chat"])["team-a/chat"]
    assert chat.invalid == snap.TOO_FEW_SAMPLES
    assert "fewer than the 1000 needed" in chat.detail
    assert chat.tenants  # what was seen stays visible in status


def test_data_older_than_the_freshness_bound_is_stale(fleet):
    later = fleet.observer(at=fleet.t_eval + 120).read(["team-a/chat"])["team-a/chat"]
    assert later.invalid == snap.STALE
    assert "s old" in later.detail


def test_canary_and_baseline_ttft_by_tenant_over_pod_subsets(fleet):
    observer = fleet.observer(ObserveSettings(window_s=WINDOW_S, min_samples=10))
    canary = observer.ttft_p99_by_tenant("team-a", "chat", ["chat-0"], WINDOW_S)
    baseline = observer.ttft_by_tenant("team-a", "chat", ["chat-1"], WINDOW_S)
    both = observer.ttft_by_tenant("team-a", "chat", ["chat-0", "chat-1"], WINDOW_S)
    assert canary.valid and baseline.valid and both.valid, (canary.detail, baseline.detail)
    assert [t.name for t in canary.tenants] == ["acme"]
    assert [t.name for t in baseline.tenants] == ["acme", "zeta"]
    assert canary.tenants[0].ttft_p99_s > baseline.tenants[0].ttft_p99_s
    sel = 'namespace="team-a", servingdeployment="chat", tenant="acme", pod="chat-0"'
    (theirs,) = fleet.promql(
        f"histogram_quantile(0.99, sum by (le) (increase("
        f"sglang:time_to_first_token_seconds_bucket{{{sel}}}[{queries.window(WINDOW_S)}])))"
    )
    assert canary.tenants[0].ttft_p99_s == pytest.approx(theirs, rel=1e-9)
    whole = fleet.observer().read(["team-a/chat"])["team-a/chat"]
    assert both.tenants[0].ttft == whole.tenants[0].ttft
    too_few = observer.ttft_by_tenant("team-a", "chat", ["chat-0"], WINDOW_S, min_samples=500)
    assert too_few.invalid == snap.TOO_FEW_SAMPLES
    nobody = observer.ttft_by_tenant("team-a", "chat", ["chat-9"], WINDOW_S)
    assert nobody.invalid == snap.NO_SERIES


def sd(namespace: str, name: str, url: str, tenant_label: str = "tenant") -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "apiVersion": "serving.slipstream.dev/v1alpha1", "kind": "ServingDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"engine": {"image": "i", "model": "m"}, "prometheus": {"url": url},
                 "tuning": {"mode": "Recommend", "objective": {"tenantLabel": tenant_label}}},
    })


def test_per_deployment_loops_share_one_fleet_read(fleet):
    """The controller's loops ask one deployment at a time; the fleet observer answers
    them all from one read (23 queries) per reuse period."""
    observer = FleetObserver(SETTINGS, reuse_s=5.0, token_for=lambda sd: None)
    sds = [sd(*PODS[p], fleet.prom.url) for p in ("chat-0", "batch-0")] + [sd("team-z", "ghost", fleet.prom.url)]

    async def every(now: float) -> list[snap.WorkloadSnapshot]:
        return await asyncio.gather(*(observer.snapshot(s, WINDOW_S, now) for s in sds))

    n = len(queries.fleet_reads(WINDOW_S))

    async def scenario() -> None:  # one event loop, as in the operator
        first = await every(fleet.t_eval)
        assert [s.invalid for s in first] == [None, snap.NO_TRAFFIC, snap.NO_SERIES]
        assert first[0] == fleet.observer().read(["team-a/chat"])["team-a/chat"]
        assert observer.queries_made == n == 23
        await every(fleet.t_eval + 1)
        assert observer.queries_made == n, "reused within reuse_s"
        await every(fleet.t_eval + 6)
        assert observer.queries_made == 2 * n
        other = await observer.snapshot(sd("team-a", "chat", fleet.prom.url, "customer"), WINDOW_S,
                                        fleet.t_eval + 6)
        assert other.tenants[0].name == "unlabelled", "another tenant label is another read"
        assert observer.queries_made == 3 * n
        no_url = sds[0].model_copy(update={"spec": sds[0].spec.model_copy(
            update={"prometheus": models.Prometheus()})})
        unset = await observer.snapshot(no_url, WINDOW_S, 0)
        assert unset.invalid == snap.UNREACHABLE and "spec.prometheus.url" in unset.detail

    asyncio.run(scenario())
    observer.close()


def test_failing_scrapes_make_the_deployment_stale_not_idle(fleet):
    """Last: stops team-c/gone's exporter. Prometheus marks its series stale at the next
    failed scrape; the window still holds its requests, and no read may call it NoTraffic."""
    observer = Observer(fleet.prom.url, SETTINGS)
    before = observer.read(["team-c/gone"])["team-c/gone"]
    assert before.invalid in (snap.TOO_FEW_SAMPLES, snap.NO_TRAFFIC), before.detail
    fleet.exporters["gone-0"].stop()
    reads = []

    def read() -> snap.WorkloadSnapshot:
        reads.append(observer.read(["team-a/chat", "team-c/gone"]))
        return reads[-1]["team-c/gone"]

    gone = wait_for(read, lambda s: s.invalid == snap.STALE, deadline_s=15,
                    what="the failed scrape noticed")
    assert "0 of 1 scrape targets up" in gone.detail
    assert all(r["team-c/gone"].invalid in (before.invalid, snap.STALE) for r in reads)
    assert all(r["team-a/chat"].invalid != snap.STALE for r in reads)
