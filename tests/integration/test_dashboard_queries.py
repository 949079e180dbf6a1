"""Every query of the chart's Grafana dashboard against a real Prometheus that scrapes two
engine simulators (`slipstream engine-sim`, real processes, with traffic and a setting
change) and an endpoint serving the operator's own prometheus_client metrics: each
returns data, with no error."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import observe_helpers
import prometheus_client
from observe_helpers import wait_for

from slipstream.controller import handlers, stages
from slipstream.enginesim import load
from slipstream.localkube import health, ports, processes
from slipstream.localkube import prometheus as localprom
from slipstream.observe.client import PromClient, QueryFailed
from slipstream.sim.workload import Request

prometheus_binary = observe_helpers.prometheus_binary

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "slipstream" / "dashboards" / "slipstream.json"
KEY = "dashboard-test-key"
TIME_SCALE = 5.0


def start_sim(pod: str, workdir: Path) -> tuple[processes.Component, str]:
    (port,) = ports.free_ports(1)
    argv = [sys.executable, "-m", "slipstream.cli", "engine-sim", "--host", ports.LOOPBACK,
            "--port", str(port), "--enable-metrics", "--pod-name", pod,
            "--tokenizer-metrics-custom-labels-header", "x-custom-labels",
            "--tokenizer-metrics-allowed-custom-labels", "tenant",
            "--chunked-prefill-size", "8192", "--time-scale", str(TIME_SCALE)]
    sim = processes.Component(pod, argv, workdir / f"{pod}.log",
                              env={**os.environ, "SLIPSTREAM_ADMIN_API_KEY": KEY})
    url = f"http://{ports.LOOPBACK}:{port}"
    health.wait_healthy(sim, f"{url}/health", deadline_s=60)
    return sim, url


def set_threshold(url: str, threshold: int) -> None:
    body = json.dumps({"server_args": {"long_prefill_token_threshold": threshold}}).encode()
    request = urllib.request.Request(url + "/set_internal_state", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {KEY}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert json.loads(resp.read())["updated"] is True


def query(prom_url: str, expr: str) -> dict:
    url = f"{prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": time.time()})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def operator_step(prom_url: str, dead_url: str) -> None:
    """What one pass of the operator counts (the real collectors of controller/handlers);
    the Prometheus read health from real queries through the operator's own client, one
    answered by the real Prometheus and one to a port where nothing listens."""
    for url in (prom_url, dead_url):
        client = PromClient(url, timeout_s=5)
        try:
            client.query("up", time.time())
        except QueryFailed as error:
            assert url == dead_url and error.kind == "unreachable", error
        finally:
            client.close()
    handlers.ROLLOUTS.labels("team-a", "Promoted").inc()
    handlers.ROLLOUTS.labels("team-a", "RolledBack").inc()
    handlers.TUNING_STEPS.labels("ok").inc()
    handlers.TUNING_STEP_SECONDS.observe(0.2)
    handlers.RECONCILES.labels("ok").inc()
    handlers.OBJECT_CHANGES.labels("Deployment", "updated").inc()
    stages.HETEROGENEITY.labels("team-a", "chat").set(0.4)
    stages.PREDICTION_ERROR.labels("team-a", "chat", "short").set(1.2)
    stages.DECISIONS.labels("Hold", "AtBest").inc()


def test_every_dashboard_query_returns_data(prometheus_binary, tmp_path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"]]
    running: list[processes.Component] = []
    prom = None
    op_port, dead_port = ports.free_ports(2)
    dead_url = f"http://{ports.LOOPBACK}:{dead_port}"
    server, _thread = prometheus_client.start_http_server(op_port, addr=ports.LOOPBACK)
    try:
        sim_urls = []
        for pod in ("sim-0", "sim-1"):
            sim, url = start_sim(pod, tmp_path)
            running.append(sim)
            sim_urls.append(url)
        targets = [localprom.StaticTarget(u.removeprefix("http://"), namespace="team-a",
                                          pod=f"sim-{i}", servingdeployment="chat")
                   for i, u in enumerate(sim_urls)]
        targets.append(localprom.StaticTarget(f"{ports.LOOPBACK}:{op_port}", namespace="ops",
                                              pod="operator", servingdeployment="operator"))
        prom = localprom.PrometheusServer.start(tmp_path / "prometheus", static=targets)
        prom.wait_for_targets(3)
        operator_step(prom.url, dead_url)
        reqs = [Request(f"{t}-{i}", t, i * 0.25, n, 4, (b + i,), (n,))
                for t, n, b in (("short", 1000, 1000), ("long", 20_000, 2000)) for i in range(12)]
        reqs.sort(key=lambda r: r.arrival_s)
        sent = load.replay(reqs, sim_urls, TIME_SCALE, prompt="field", report_every_s=0)
        assert all(o.ok for o in sent), [o.error for o in sent if not o.ok][:3]
        for url in sim_urls:
            set_threshold(url, 2048)
        operator_step(prom.url, dead_url)
        sent = load.replay([Request(f"late-{r.rid}", r.tenant, r.arrival_s, r.prompt_tokens, 4,
                                    tuple(b + 10_000 for b in r.blocks), r.block_sizes)
                            for r in reqs], sim_urls, TIME_SCALE, prompt="field", report_every_s=0)
        assert all(o.ok for o in sent)
        operator_step(prom.url, dead_url)

        def answers() -> dict[str, dict]:
            return {e: query(prom.url, e) for e in exprs}

        def every_one_has_data(got: dict[str, dict]) -> bool:
            return all(a["status"] == "success" and a["data"]["result"] for a in got.values())

        got = wait_for(answers, every_one_has_data, deadline_s=30,
                       what="every dashboard query answering with data")
        for expr, answer in got.items():
            assert answer["status"] == "success" and "error" not in answer, (expr, answer)
            assert answer["data"]["result"], expr
        # Ceiling mode at T = 2048 caps every pass of the long path (stock ran none).
        (capped,) = [e for e in exprs if 'capped="true"' in e]
        share = {r["metric"]["pod"]: float(r["value"][1]) for r in got[capped]["data"]["result"]}
        assert share == {"sim-0": 1.0, "sim-1": 1.0}, share
    finally:
        if prom is not None:
            prom.stop()
        for sim in running:
            sim.stop()
        server.shutdown()
        server.server_close()

