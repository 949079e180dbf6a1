"""The chart's Grafana dashboard JSON: the structure Grafana loads (schemaVersion, panels
with ids, grid positions, a Prometheus datasource and targets), and every query built from
a metric that the engine (simulator) or the operator exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from slipstream.controller import handlers, stages
from slipstream.enginesim.metrics import EngineMetrics

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
                      handlers.TUNING_STEP_SECONDS, stages.TUNER_SECONDS, stages.HETEROGENEITY,
                      stages.PREDICTION_ERROR, stages.DECISIONS):
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
    cells = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}
    assert len(cells) == len(panels)  # no two panels on one spot


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
