"""The chart's values.yaml, values.schema.json and templates agree with each other."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "slipstream"


def values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def test_default_values_match_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.validate(values(), schema())


@pytest.mark.parametrize(
    ("path", "bad"),
    [(("replicaCount",), "two"), (("replicaCount",), 0), (("image", "pullPolicy"), "Sometimes"),
     (("metrics", "port"), 80), (("peering", "name"), "Not_A_Name"), (("unknownKey",), 1),
     (("rbac", "secretNamespaces"), ["Not_A_Namespace"]), (("rbac", "secretNamespaces"), ["a", "a"]),
     (("networkPolicy", "enginePorts"), []), (("networkPolicy", "apiServer", "cidrs"), ["10.0.0.1"]),
     (("networkPolicy", "egressAnywhere"), True)],
)  # fmt: skip
def test_schema_refuses_bad_values(path: tuple[str, ...], bad: Any) -> None:
    broken = copy.deepcopy(values())
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema())


def test_every_value_a_template_uses_is_in_values_yaml() -> None:
    used = set()
    for template in (CHART / "templates").iterdir():
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()))
    for dotted in used:
        node: Any = values()
        for key in dotted.split("."):
            assert isinstance(node, dict) and key in node, f".Values.{dotted} is not in values.yaml"
            node = node[key]


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "slipstream"
    assert (CHART / "templates" / "NOTES.txt").read_text().count("kubectl") >= 4


def test_the_scale_bench_runs_the_tuner_threads_the_charts_cpu_limit_gives(tmp_path: Path) -> None:
    """The chart's limit of 1 CPU resolves to one tuner thread in its pod; the bench's
    operator, a process with no cgroup quota, is given the same (`chart_tuner_threads`)."""
    from slipstream import scalebench

    assert scalebench.chart_tuner_threads() == 1
    cpus = len(os.sched_getaffinity(0))
    for values, threads in (("resources: {limits: {cpu: 500m}}", 1), ("resources: {limits: {cpu: '3'}}", min(3, cpus)),
                            ("resources: {}", min(4, cpus))):  # fmt: skip
        (tmp_path / "values.yaml").write_text(values)
        assert scalebench.chart_tuner_threads(tmp_path / "values.yaml") == threads, values
