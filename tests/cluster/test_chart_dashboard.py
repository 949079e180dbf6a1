"""The Grafana dashboard ConfigMap, rendered by the real helm binary: only when
``dashboard.enabled``, labelled for Grafana's sidecar, holding the chart's JSON whole."""

from __future__ import annotations

import json
from pathlib import Path

from test_chart_render import CHART, docs, helm_template, one


def test_off_by_default(tmp_path: Path) -> None:
    assert not [d for d in docs(tmp=tmp_path) if d["kind"] == "ConfigMap"
                and "grafana_dashboard" in d["metadata"].get("labels", {})]


def test_one_value_turns_it_on(tmp_path: Path) -> None:
    cm = one(docs("dashboard.enabled=true", "dashboard.labels.team=ml", tmp=tmp_path),
             "ConfigMap", "r-slipstream-dashboard")
    assert cm["metadata"]["namespace"] == "ops"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["team"] == "ml"
    shipped = json.loads((CHART / "dashboards" / "slipstream.json").read_text())
    assert json.loads(cm["data"]["slipstream.json"]) == shipped


def test_the_schema_refuses_a_misspelt_value(tmp_path: Path) -> None:
    result = helm_template("dashboard.enable=true", tmp=tmp_path, check=False)
    assert result.returncode != 0 and "enable" in result.stderr
