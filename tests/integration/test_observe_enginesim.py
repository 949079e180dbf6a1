"""Observe against engine simulators (`slipstream engine-sim`, real processes) scraped by a
real Prometheus: the whole observe edge as the closed loop sees it.

Two ServingDeployments: team-a/chat (pod sim-0, tenants short and long) and team-b/solo
(pod sim-1, tenant solo). The load generator's Python API sends the traffic; the
simulators' own admin endpoints change a setting and break one pod's metrics.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import observe_helpers
import pytest
from observe_helpers import wait_for

from slipstream.api import snapshot as snap
from slipstream.enginesim import load
from slipstream.localkube import health, ports, processes
from slipstream.localkube import prometheus as localprom
from slipstream.observe import Observer, ObserveSettings
from slipstream.observe.client import PromClient
from slipstream.sim.workload import Request

prometheus_binary = observe_helpers.prometheus_binary
"""Fixtures from observe_helpers (no conftest.py here: see its docstring)."""

KEY = "observe-test-key"
TIME_SCALE = 5.0
SETTINGS = ObserveSettings(window_s=60.0, min_samples=20, max_staleness_s=10.0)
CHAT, SOLO = "team-a/chat", "team-b/solo"


@dataclass
class Sims:
    prom: localprom.PrometheusServer
    urls: dict[str, str]

    def admin(self, pod: str, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"{self.urls[pod]}{path}", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())


def start_sim(pod: str, workdir: Path, *flags: str) -> tuple[processes.Component, str]:
    (port,) = ports.free_ports(1)
    argv = [sys.executable, "-m", "slipstream.cli", "engine-sim", "--host", ports.LOOPBACK,
            "--port", str(port), "--enable-metrics", "--pod-name", pod,
            "--tokenizer-metrics-custom-labels-header", "x-custom-labels",
            "--tokenizer-metrics-allowed-custom-labels", "tenant",
            "--chunked-prefill-size", "8192", "--time-scale", str(TIME_SCALE), *flags]
    sim = processes.Component(pod, argv, workdir / f"{pod}.log",
                              env={**os.environ, "SLIPSTREAM_ADMIN_API_KEY": KEY})
    url = f"http://{ports.LOOPBACK}:{port}"
    health.wait_healthy(sim, f"{url}/health", deadline_s=60)
    return sim, url


def requests(tenant: str, n: int, prompt_tokens: int, every_s: float, first_block: int,
             output_tokens: int = 4) -> list[Request]:
    """``n`` cold prompts (one block each, never shared) every ``every_s`` twin seconds."""
    return [Request(f"{tenant}-{i}", tenant, i * every_s, prompt_tokens, output_tokens, (first_block + i,),
                    (prompt_tokens,)) for i in range(n)]


@pytest.fixture(scope="module")
def sims(prometheus_binary, tmp_path_factory) -> Iterator[Sims]:
    workdir = tmp_path_factory.mktemp("enginesim")
    running: list[processes.Component] = []
    prom = None
    try:
        sim0, url0 = start_sim("sim-0", workdir, "--long-prefill-token-threshold", "0",
                               "--schedule-policy", "fcfs")
        running.append(sim0)
        sim1, url1 = start_sim("sim-1", workdir, "--long-prefill-token-threshold", "4096",
                               "--long-prefill-mode", "floor", "--schedule-policy", "srpt")
        running.append(sim1)
        targets = [
            localprom.StaticTarget(url0.removeprefix("http://"), namespace="team-a", pod="sim-0",
                                   servingdeployment="chat"),
            localprom.StaticTarget(url1.removeprefix("http://"), namespace="team-b", pod="sim-1",
                                   servingdeployment="solo"),
        ]
        prom = localprom.PrometheusServer.start(workdir / "prometheus", static=targets)
        prom.wait_for_targets(2)
        # One request per tenant first: SGLang creates a tenant's series at its first
        # request, and increase() cannot count what a series held at its first scrape. Once
        # every series has been scraped, the load proper is counted in full.
        warm = [*requests("short", 1, 1000, 0, 900), *requests("long", 1, 1000, 0, 901)]
        sent = load.replay(warm, [url0], TIME_SCALE, prompt="field", report_every_s=0)
        sent += load.replay(requests("solo", 1, 1000, 0, 902), [url1], TIME_SCALE,
                            prompt="field", report_every_s=0)
        series = 'count({__name__=~"sglang.uncached_prompt_tokens_histogram_count"})'
        client = PromClient(prom.url)
        wait_for(lambda: [x.value for x in client.query(series, time.time())],
                 lambda v: v == [3.0], deadline_s=20, what="every tenant's series scraped")
        client.close()
        chat = [*requests("short", 40, 1000, 0.25, 1000), *requests("long", 20, 60_000, 0.5, 2000, output_tokens=40)]
        sent += load.replay(sorted(chat, key=lambda r: r.arrival_s), [url0], TIME_SCALE,
                            prompt="field", report_every_s=0)
        sent += load.replay(requests("solo", 30, 2000, 0.25, 3000), [url1], TIME_SCALE,
                            prompt="field", report_every_s=0)
        assert all(o.ok for o in sent), [o.error for o in sent if not o.ok][:3]

        def finished(snapshot: snap.WorkloadSnapshot) -> float:
            mix = snapshot.uncached_tokens
            return mix.total if mix is not None else 0.0

        wait_for(lambda: Observer(prom.url, SETTINGS).read([CHAT, SOLO]),
                 lambda got: finished(got[CHAT]) >= 60 and finished(got[SOLO]) >= 30,
                 deadline_s=30, what="the simulators' finished requests in Prometheus")
        yield Sims(prom, {"sim-0": url0, "sim-1": url1})
    finally:
        if prom is not None:
            prom.stop()
        for sim in running:
            sim.stop()


def test_simulator_metrics_make_a_valid_per_tenant_snapshot(sims):
    got = Observer(sims.prom.url, SETTINGS).read([CHAT, SOLO])
    chat, solo = got[CHAT], got[SOLO]
    assert chat.valid and solo.valid, (chat.detail, solo.detail)
    assert [t.name for t in chat.tenants] == ["long", "short"]
    long_, short = chat.tenants
    # 60,000-token prompts (eight 8192-token chunks each) wait longer for their first token.
    assert long_.ttft_p99_s > short.ttft_p50_s
    assert long_.uncached_tokens.quantile(0.5) > 40_000 > 1_000 >= short.uncached_tokens.quantile(0.5)
    # Output lengths from sglang:generation_tokens_histogram: long asked for 40, short for 4.
    assert long_.output_tokens is not None and short.output_tokens is not None
    # increase() extrapolates a window's count toward its edges (by up to half a scrape
    # interval each side), so the count is 20 plus that slack; the mean is exact.
    assert long_.output_tokens.total == pytest.approx(20, rel=0.25)
    assert long_.output_tokens.mean == pytest.approx(40, rel=0.05)
    assert short.output_tokens.mean == pytest.approx(4, rel=0.05)
    assert chat.pods == (snap.PodSetting("sim-0", 0, "ceiling", "fcfs"),)
    assert solo.pods == (snap.PodSetting("sim-1", 4096, "floor", "srpt"),)
    assert [t.name for t in solo.tenants] == ["solo"]


def test_a_setting_changed_in_place_shows_in_the_pod_gauges(sims):
    answer = sims.admin("sim-0", "/set_internal_state", {"server_args": {
        "long_prefill_token_threshold": 2048, "long_prefill_mode": "floor", "schedule_policy": "lpm"}})
    assert answer["updated"] is True, answer
    observer = Observer(sims.prom.url, SETTINGS)
    wait_for(lambda: observer.read([CHAT])[CHAT].pods,
             lambda pods: pods == (snap.PodSetting("sim-0", 2048, "floor", "lpm"),),
             deadline_s=15, what="the new setting scraped")


def test_one_pods_garbage_metrics_leave_the_other_deployment_untouched(sims):
    observer = Observer(sims.prom.url, SETTINGS)
    sims.admin("sim-1", "/slipstream/faults", {"metrics": "garbage"})
    reads: list[dict[str, snap.WorkloadSnapshot]] = []

    def read() -> snap.WorkloadSnapshot:
        reads.append(observer.read([CHAT, SOLO]))
        return reads[-1][SOLO]

    try:
        solo = wait_for(read, lambda s: s.invalid == snap.STALE, deadline_s=15,
                        what="the failed scrapes noticed")
        assert "0 of 1 scrape targets up" in solo.detail
        assert all(r[CHAT].invalid is None for r in reads), [r[CHAT].detail for r in reads]
        assert all(r[SOLO].invalid in (None, snap.STALE) for r in reads)
    finally:
        sims.admin("sim-1", "/slipstream/faults", {"metrics": "ok"})
    wait_for(lambda: observer.read([SOLO])[SOLO], lambda s: s.invalid != snap.STALE,
             deadline_s=15, what="recovery once the metrics are good again")
