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
    finally:
        if prom is not None:
            prom.stop()
        for sim in running:
            sim.stop()
        server.shutdown()
        server.server_close()


# -- the dashboard's JSON as Grafana reads it (offline) ------------------------------------------
# What Grafana's dashboard schema (schemaVersion 39, the "Dashboard" kind) requires of the
# fields this dashboard uses; Grafana itself is AGPL and is neither built nor run here.

GRID_COLUMNS = 24
PANEL_TYPES = {"timeseries", "stat", "gauge", "table", "heatmap", "bargauge", "text", "row"}


def boxes_overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]


def test_the_dashboard_json_has_what_grafanas_schema_requires() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert isinstance(d["title"], str) and d["title"]
    assert isinstance(d["uid"], str) and 0 < len(d["uid"]) <= 40
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36, "datasource refs by uid need >= 36"
    assert isinstance(d["editable"], bool) and all(isinstance(t, str) for t in d["tags"])
    assert set(d["time"]) == {"from", "to"} and isinstance(d["refresh"], str)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert all(v["type"] in {"datasource", "query", "custom", "constant", "interval"} for v in variables.values())
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus", source

    def datasource_ok(ref: dict, where: str) -> None:
        assert ref["type"] == "prometheus", where
        # Every reference goes through the datasource variable: no uid of someone's Grafana.
        assert ref["uid"].startswith("${") and ref["uid"][2:-1] in variables, (where, ref)

    ids = [p["id"] for p in d["panels"]]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids), ids
    for p in d["panels"]:
        where = f"panel {p['id']} ({p.get('title')})"
        assert p["type"] in PANEL_TYPES and isinstance(p["title"], str) and p["title"], where
        box = p["gridPos"]
        assert set(box) == {"h", "w", "x", "y"} and all(isinstance(v, int) and v >= 0 for v in box.values()), where
        assert box["h"] > 0 and box["w"] > 0 and box["x"] + box["w"] <= GRID_COLUMNS, where
        datasource_ok(p["datasource"], where)
        assert p["targets"], where
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs) and all(isinstance(r, str) and r for r in refs), where
        for t in p["targets"]:
            assert isinstance(t["expr"], str) and t["expr"].strip(), where
            datasource_ok(t["datasource"], where)
        assert isinstance(p["fieldConfig"]["defaults"], dict) and isinstance(p["fieldConfig"]["overrides"], list)
    panels = d["panels"]
    for i, a in enumerate(panels):
        for b in panels[i + 1:]:
            assert not boxes_overlap(a["gridPos"], b["gridPos"]), (a["id"], b["id"])
    for a in d["annotations"]["list"]:
        assert isinstance(a["name"], str) and isinstance(a["enable"], bool) and a["expr"].strip(), a
        datasource_ok(a["datasource"], f"annotation {a['name']}")
    # What the issue asks the dashboard to show, by the operator's own metric names.
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in ("slipstream_rollouts_total", "slipstream_prometheus_queries_total",
                   "slipstream_tuner_decisions_total", "slipstream_tuning_step_seconds_bucket",
                   "slipstream_twin_prediction_error_ratio", "slipstream_heterogeneity"):
        assert metric in exprs, metric
