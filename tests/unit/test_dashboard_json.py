"""The chart's Grafana dashboard JSON: valid against the JSON Schemas Grafana publishes
(vendored in tests/data/grafana: the dashboard, the time series panel, the Prometheus
query), the structure this chart relies on (panels with ids, grid positions that do not
overlap, the datasource variable), and every query built from a metric that the engine
(simulator) or the operator exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

from slipstream.controller import handlers, stages
from slipstream.enginesim.metrics import EngineMetrics
from slipstream.observe import client

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "slipstream" / "dashboards" / "slipstream.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA = Path(__file__).resolve().parents[1] / "data" / "grafana"
PANEL_SCHEMAS = ("timeseries",)  # the panel types whose schema is vendored there; a new type wants its file


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


def grafana_registry() -> Registry:
    """Grafana's published JSON Schemas, vendored in tests/data/grafana (see its README.md
    for the source commit), each under ``urn:grafana:<name>``."""
    return Registry().with_resources(
        (f"urn:grafana:{path.name.removesuffix('.jsonschema.json')}", Resource.from_contents(json.loads(path.read_text())))
        for path in sorted(GRAFANA.glob("*.jsonschema.json"))
    )


def closest(error: ValidationError) -> list[ValidationError]:
    """For a oneOf/anyOf miss (a panel is a Panel or a RowPanel), the errors of the branch
    that came closest, the one with the fewest; otherwise the error itself."""
    if not error.context:
        return [error]
    branches: dict = {}
    for e in error.context:
        branches.setdefault(e.relative_schema_path[0], []).append(e)
    return [leaf for e in min(branches.values(), key=len) for leaf in closest(e)]


def schema_errors(dashboard: dict) -> list[str]:
    """Where the dashboard breaks Grafana's schemas: the dashboard schema for the whole,
    each panel's type schema for its ``options`` and ``fieldConfig.defaults.custom``, and
    the Prometheus query schema for each target."""
    registry = grafana_registry()

    def check(ref: str, instance, where: str) -> list[str]:
        validator = Draft7Validator({"$ref": f"urn:grafana:{ref}"}, registry=registry)
        found = (leaf for e in validator.iter_errors(instance) for leaf in closest(e))
        return [f"{where}{e.json_path[1:]}: {e.message}" for e in found]

    errors = check("dashboard", dashboard, "$")
    for i, panel in enumerate(dashboard.get("panels", [])):
        at, kind = f"$.panels[{i}]", panel.get("type")
        if kind not in PANEL_SCHEMAS:
            errors.append(f"{at}: no schema vendored for panel type {kind!r} (tests/data/grafana)")
            continue
        errors += check(f"{kind}#/definitions/Options", panel.get("options", {}), f"{at}.options")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
        errors += check(f"{kind}#/definitions/FieldConfig", custom, f"{at}.fieldConfig.defaults.custom")
        for j, target in enumerate(panel.get("targets", [])):
            errors += check("prometheus", target, f"{at}.targets[{j}]")
    return errors


def test_the_dashboard_validates_against_grafanas_published_schemas():
    """Grafana (AGPL) is neither built nor run here, so the dashboard is not rendered; it is
    checked against the JSON Schemas Grafana publishes (grafana-foundation-sdk, vendored)."""
    d = load()
    assert schema_errors(d) == []
    assert 8 <= len(d["uid"]) <= 40  # the schema says "string (8-40)" only in its description


def mistake(path: tuple, value=None, rename: str | None = None) -> dict:
    """The dashboard with one field set to ``value`` or, with ``rename``, renamed."""
    d = load()
    *parents, last = path
    node = d
    for key in parents:
        node = node[key]
    if rename is None:
        node[last] = value
    else:
        node[rename] = node.pop(last)
    return d


@pytest.mark.parametrize(
    ("broken", "where"),
    [
        (mistake(("panels", 0, "gridPos", "h"), "8"), "$.panels[0].gridPos.h: '8' is not of type 'integer'"),
        (mistake(("schemaVersion",), rename="schemaVersoin"), "$: 'schemaVersion' is a required property"),
        (mistake(("panels", 1, "gridPos", "w"), 25), "$.panels[1].gridPos.w: 25 is greater than the maximum of 24"),
        (mistake(("annotations", "list", 0, "enable"), "yes"), "$.annotations.list[0].enable: 'yes' is not of type"),
        (mistake(("panels", 2, "options", "legend", "displayMode"), "lists"),
         "$.panels[2].options.legend.displayMode: 'lists' is not one of"),
        (mistake(("panels", 3, "options", "tooltip"), rename="tooltips"), "$.panels[3].options: 'tooltip' is a required"),
        (mistake(("panels", 4, "fieldConfig", "defaults", "custom"), {"lineWidht": 1}),
         "$.panels[4].fieldConfig.defaults.custom: Additional properties are not allowed ('lineWidht'"),
        (mistake(("panels", 5, "targets", 0, "expr"), rename="exp"), "$.panels[5].targets[0]: 'expr' is a required"),
        (mistake(("panels", 6, "type"), "piechart"), "$.panels[6]: no schema vendored for panel type 'piechart'"),
    ],
)
def test_the_schema_check_catches_a_mistake(broken, where):
    errors = schema_errors(broken)
    assert any(e.startswith(where) for e in errors), errors


def test_the_panels_the_operator_is_watched_by():
    """Issue 18's list: the setting, heterogeneity, p99 TTFT per tenant, queue mix,
    prediction error, rollbacks and holds by reason, step latency, Prometheus read health;
    and the share of prefill passes capped."""
    d = load()
    exprs = " ".join(t["expr"] for p in d["panels"] for t in p["targets"])
    for series in ("sglang:long_prefill_token_threshold", "slipstream_heterogeneity",
                   "sglang:time_to_first_token_seconds_bucket", "sglang:queue_reqs_by_size_class",
                   "slipstream_twin_prediction_error_ratio", "slipstream_rollouts_total",
                   "slipstream_tuner_decisions_total", "slipstream_tuning_step_seconds_bucket",
                   "slipstream_prometheus_queries_total", "sglang:long_prefill_rounds_total"):
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


def test_the_capped_share_panel_is_capped_over_all_passes_per_pod():
    (panel,) = [p for p in load()["panels"] if "sglang:long_prefill_rounds_total" in p["targets"][0]["expr"]]
    (target,) = panel["targets"]
    num, den = target["expr"].split(" / ")
    assert num.startswith("sum by (namespace, pod) (") and den.startswith("sum by (namespace, pod) (")
    assert 'sglang:long_prefill_rounds_total{capped="true"}' in num
    assert "sglang:long_prefill_rounds_total[" in den  # every pass, capped or not
    assert panel["fieldConfig"]["defaults"] == {"unit": "percentunit", "min": 0, "max": 1}
    assert "{{pod}}" in target["legendFormat"]
