"""The chart's Grafana dashboard JSON: the structure Grafana loads (schemaVersion, panels
with ids, grid positions, a Prometheus datasource and targets), and every query built from
a metric that the engine (simulator) or the operator exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from slipstream.controller import handlers, stages
from slipstream.enginesim.metrics import EngineMetrics
from slipstream.observe import client

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "slipstream" / "dashboards" / "slipstream.json"
DS = {"type": "prometheus", "uid": "${datasource}"}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def series_names(families) -> set[str]:
    """The series names Prometheus scrapes for metric families (a family without samples yet
    still names them: ``_bucket``/``_sum``/``_count``, ``_total``)."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",),
                "gauge": ("",)}
    return {f.name + s for f in families for s in suffixes.get(f.type, ("",))}


def exported_names() -> set[str]:
    """What the engine simulator (the engine's metric names) and the operator export."""
    engine = EngineMetrics("m", ("tenant",))
    names = series_names(engine.registry.collect())
    for collector in (handlers.RECONCILES, handlers.OBJECT_CHANGES, handlers.TUNING_STEPS,
                      handlers.TUNING_STEP_SECONDS, handlers.ROLLOUTS, stages.TUNER_SECONDS, stages.HETEROGENEITY,
                      stages.PREDICTION_ERROR, stages.DECISIONS, client.QUERIES):
        names |= series_names(collector.collect())
    return names


def test_the_top_level_fields_grafana_needs():
    d = load()
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert d["title"] and d["uid"] and isinstance(d["panels"], list) and d["panels"]
    (var,) = d["templating"]["list"]
    assert var["type"] == "datasource" and var["query"] == "prometheus" and var["name"] == "datasource"
    assert all(a["datasource"] == DS and a["expr"] for a in d["annotations"]["list"])


def test_every_panel_has_an_id_a_place_a_datasource_and_targets():
    panels = load()["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    for p in panels:
        assert p["type"] in ("timeseries", "stat", "heatmap", "bargauge", "table"), p["title"]
        assert p["datasource"] == DS and p["title"] and p["description"]
        grid = p["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"} and grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs)
        assert all(t["datasource"] == DS and t["expr"].strip() for t in p["targets"])
    for i, a in enumerate(panels):  # no two panels overlap
        for b in panels[i + 1:]:
            assert not boxes_overlap(a["gridPos"], b["gridPos"]), (a["title"], b["title"])


def boxes_overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]


def test_the_field_types_grafanas_dashboard_schema_gives():
    """What Grafana's dashboard schema (the "Dashboard" kind, schemaVersion 39) types the
    fields this dashboard uses as, checked offline: Grafana (AGPL) is neither built nor
    run here, and its schema ships inside it."""
    d = load()
    assert isinstance(d["title"], str) and isinstance(d["uid"], str) and len(d["uid"]) <= 40
    assert isinstance(d["editable"], bool) and isinstance(d["version"], int) and isinstance(d["refresh"], str)
    assert isinstance(d["tags"], list) and all(isinstance(t, str) for t in d["tags"])
    assert set(d["time"]) == {"from", "to"} and all(isinstance(v, str) for v in d["time"].values())
    for p in load()["panels"]:
        assert isinstance(p["id"], int) and isinstance(p["title"], str) and isinstance(p["description"], str)
        grid = p["gridPos"]
        assert all(isinstance(v, int) for v in grid.values()) and grid["h"] > 0 and grid["w"] > 0, p["title"]
        assert isinstance(p["fieldConfig"]["defaults"], dict) and isinstance(p["fieldConfig"]["overrides"], list)
        assert all(isinstance(t["refId"], str) and t["refId"] for t in p["targets"]), p["title"]
    for a in d["annotations"]["list"]:
        assert isinstance(a["name"], str) and isinstance(a["enable"], bool) and isinstance(a["iconColor"], str), a


def test_the_panels_the_operator_is_watched_by():
    """Issue 18's list: the setting, heterogeneity, p99 TTFT per tenant, queue mix,
    prediction error, rollbacks and holds by reason, step latency, Prometheus read health."""
    d = load()
    exprs = " ".join(t["expr"] for p in d["panels"] for t in p["targets"])
    for series in ("sglang:long_prefill_token_threshold", "slipstream_heterogeneity",
                   "sglang:time_to_first_token_seconds_bucket", "sglang:queue_reqs_by_size_class",
                   "slipstream_twin_prediction_error_ratio", "slipstream_rollouts_total",
                   "slipstream_tuner_decisions_total", "slipstream_tuning_step_seconds_bucket",
                   "slipstream_prometheus_queries_total"):
        assert series in exprs, series
    assert any("RolledBack" in a["expr"] for a in d["annotations"]["list"])


def test_every_query_reads_a_metric_that_is_exported():
    known = exported_names()
    d = load()
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in d["annotations"]["list"]]
    for expr in exprs:
        used = set(re.findall(r"(?:sglang:|slipstream_)[a-z_:]+", expr))
        assert used, expr
        assert used <= known, f"{expr}: {sorted(used - known)} not exported"
        assert expr.count("(") == expr.count(")")
