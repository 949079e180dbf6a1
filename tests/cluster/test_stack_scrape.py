"""The local stack's Prometheus scrapes the operator (docs/localkube.md): the dashboard's
operator panels read its series there, with the operator's own labels kept.

The stack as `slipstream cluster up` runs it (Stack.attach: Prometheus, the chart, the
operator, the engine-pod runner) and one Auto ServingDeployment on simulated engines, no
traffic: what a steady deployment feeds (reconciles, object changes, tuning steps and their
time, Prometheus queries) must come back from the dashboard's own expressions. Panels fed
only by traffic or a rollout (heterogeneity, the twin's error, decisions, rollouts and the
rollback annotation) are outside this test.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import eventually
from slipstream import localkube
from slipstream.demo import loop
from slipstream.localkube import stack as stack_mod

NAMESPACE = "scrape"
DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "slipstream" / "dashboards" / "slipstream.json"
FED_BY_A_STEADY_DEPLOYMENT = (
    "slipstream_reconciles_total", "slipstream_object_changes_total", "slipstream_tuning_steps_total",
    "slipstream_tuning_step_seconds_bucket", "slipstream_prometheus_queries_total",
)  # fmt: skip


@pytest.fixture(scope="module")
def stack(cluster: localkube.Cluster) -> Iterator[stack_mod.Stack]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    running = stack_mod.Stack.attach(cluster, stack_mod.StackOptions(time_scale=8.0, engine_namespace=NAMESPACE))
    try:
        yield running
    finally:
        running.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def query(prometheus_url: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def dashboard_exprs(metric: str) -> list[str]:
    """The dashboard's queries that read ``metric``."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", []) if metric in t.get("expr", "")]
    assert exprs, f"no dashboard query reads {metric}"
    return exprs


def test_the_operators_series_are_scraped_with_its_own_labels(cluster: localkube.Cluster, stack: stack_mod.Stack) -> None:
    assert stack.prometheus is not None and stack.operator_metrics_url is not None
    sd = loop.serving_deployment("scraped", stack.prometheus.url, replicas=1, interval_s=60)
    sd["metadata"]["namespace"] = NAMESPACE
    cluster.kubectl("apply", "-f", "-", input=json.dumps(sd))

    def stepped() -> list[dict[str, Any]]:
        found = query(stack.prometheus.url, 'slipstream_tuning_last_step_timestamp_seconds{servingdeployment="scraped"}')
        assert found, "no tuning step scraped yet"
        return found

    (series,) = eventually(stepped, deadline_s=120, what="the operator's tuning-step gauge in Prometheus")
    # honor_labels: the gauge's namespace is the served one, not the scrape target's.
    assert series["metric"]["namespace"] == NAMESPACE, series["metric"]
    assert series["metric"]["component"] == stack_mod.OPERATOR_COMPONENT, series["metric"]
    up = query(stack.prometheus.url, f'up{{component="{stack_mod.OPERATOR_COMPONENT}"}}')
    assert [s["value"][1] for s in up] == ["1"], up


@pytest.mark.parametrize("metric", FED_BY_A_STEADY_DEPLOYMENT)
def test_each_operator_panel_a_steady_deployment_feeds_shows_data(stack: stack_mod.Stack, metric: str) -> None:
    """Run after the deployment above stepped: rates over 5m need two scrapes of a counter."""
    assert stack.prometheus is not None
    url = stack.prometheus.url
    for expr in dashboard_exprs(metric):
        eventually(lambda expr=expr: has_data(url, expr), deadline_s=60, what=f"data for {expr}")


def has_data(url: str, expr: str) -> list[dict[str, Any]]:
    found = query(url, expr)
    assert found, f"{expr}: no data"
    return found
