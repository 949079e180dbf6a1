"""The chart's values.yaml, values.schema.json and templates agree with each other."""

from __future__ import annotations

import copy
import json
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
