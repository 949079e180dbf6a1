"""The CRD is generated from the pydantic models, and the chart ships the same files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slipstream.api import crdgen, models

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def schema_nodes(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        found += schema_nodes(sub, f"{path}.{name}")
    if "items" in node:
        found += schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += schema_nodes(node["additionalProperties"], f"{path}{{}}")
    return found


def version_schema() -> dict[str, Any]:
    return crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_is_what_the_models_generate() -> None:
    for path in crdgen.targets(ROOT):
        assert path.read_text() == crdgen.render(), f"{path} is stale: run python -m slipstream.api.crdgen"
    assert crdgen.main(["--root", str(ROOT), "--check"]) == 0


def test_chart_crds_are_identical_to_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (ROOT / "charts/slipstream/crds").glob("*.yaml")}
    assert top and top == chart


def test_every_model_field_is_in_the_schema_under_its_alias() -> None:
    def check(model: type[models.Model], schema: dict[str, Any], where: str) -> None:
        props = schema["properties"]
        for name, field in model.model_fields.items():
            alias = field.alias or name
            assert alias in props, f"{where}.{alias} missing from the CRD"
            assert not any(c.isupper() for c in name), name
        assert set(props) == {f.alias or n for n, f in model.model_fields.items()}

    root = version_schema()["properties"]
    check(models.ServingDeploymentSpec, root["spec"], "spec")
    check(models.EngineSpec, root["spec"]["properties"]["engine"], "spec.engine")
    check(models.Tuning, root["spec"]["properties"]["tuning"], "spec.tuning")
    check(models.HiCache, root["spec"]["properties"]["engine"]["properties"]["hicache"], "hicache")
    check(models.ServingDeploymentStatus, root["status"], "status")


def test_schema_is_structural() -> None:
    for path, node in schema_nodes(version_schema()):
        if node.get("x-kubernetes-int-or-string"):
            continue
        assert "type" in node, f"{path or '<root>'} has no type"
        assert "$ref" not in node and "title" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_defaults_in_the_crd_are_the_model_defaults() -> None:
    spec = version_schema()["properties"]["spec"]["properties"]
    tuning = models.Tuning()
    assert spec["tuning"]["default"] == {}
    assert spec["tuning"]["properties"]["mode"]["default"] == tuning.mode == "Fixed"
    assert spec["tuning"]["properties"]["maxConcurrency"]["default"] == tuning.max_concurrency
    engine = spec["engine"]["properties"]
    assert engine["chunkedPrefillSize"]["default"] == 8192
    assert engine["pageSize"]["default"] == 1
    assert "default" not in spec["engine"], "engine is required: image and model have no default"


def test_every_cel_rule_has_a_message_naming_a_field_and_a_fix() -> None:
    rules = [
        rule
        for _, node in schema_nodes(version_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 8
    for rule in rules:
        assert rule["message"].startswith(("spec.", "metadata.name")), rule
        assert ":" in rule["message"], f"no fix in {rule['message']!r}"


def test_printer_columns() -> None:
    version = crdgen.crd()["spec"]["versions"][0]
    names = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert names == ["Threshold", "Concurrency", "Mode", "Heterogeneity", "Phase", "Age"]
    assert version["subresources"] == {"status": {}}
    assert crdgen.crd()["spec"]["names"]["shortNames"] == ["sd"]
    for column in version["additionalPrinterColumns"]:
        head, *rest = column["jsonPath"].lstrip(".").split(".")
        if head == "status":
            assert rest[0] in version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_serving_deployments(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == models.KIND]
    assert len(docs) == 1
    sd = models.ServingDeployment.model_validate(docs[0])
    assert sd.spec.tuning.threshold is not None
    assert sd.spec.tuning.threshold <= sd.spec.engine.chunked_prefill_size
    assert sd.spec.tuning.threshold % sd.spec.engine.page_size == 0
    # what the apiserver would refuse or prune: examples use only schema fields
    assert sd.spec.to_k8s().keys() <= docs[0]["spec"].keys() | {"tuning", "prometheus"}


def test_seed_deployments_have_their_published_settings() -> None:
    by_name = {}
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == models.KIND:
                sd = models.ServingDeployment.model_validate(doc)
                by_name[sd.metadata.name] = sd
    kimi, deepseek = by_name["kimi-k3"].spec, by_name["deepseek-v4-flash"].spec
    assert (kimi.engine.chunked_prefill_size, kimi.tuning.threshold) == (8192, 4096)
    assert kimi.engine.tensor_parallel_size == 8
    assert (deepseek.engine.chunked_prefill_size, deepseek.tuning.threshold) == (16384, 4096)
    assert by_name["llama3-70b"].spec.engine.tensor_parallel_size == 4


def test_models_round_trip_camel_case() -> None:
    spec = models.ServingDeploymentSpec.model_validate(
        {"engine": {"image": "i", "model": "m", "chunkedPrefillSize": 16384}, "tuning": {"threshold": 4096}}
    )
    assert spec.engine.chunked_prefill_size == 16384
    out = spec.to_k8s()
    assert out["engine"]["chunkedPrefillSize"] == 16384 and out["tuning"]["threshold"] == 4096
    with pytest.raises(ValueError):
        models.ServingDeploymentSpec.model_validate({"engine": {"image": "i", "model": "m", "typo": 1}})
    decision = models.DecisionRecord.model_validate(
        {"time": "2026-01-01T00:00:00Z", "from": {"threshold": 0}, "to": {"threshold": 4096}, "reason": "mix"}
    )
    assert decision.to_k8s()["from"] == {"threshold": 0, "mode": "ceiling", "schedulePolicy": "fcfs"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("quantity", "lots"), ("env", "1 BAD=")],
)
def test_pydantic_refuses_what_kubernetes_would(field: str, value: str) -> None:
    engine: dict[str, Any] = {"image": "i", "model": "m"}
    if field == "quantity":
        engine["resources"] = {"requests": {"cpu": value}}
    else:
        engine["env"] = [{"name": value, "value": "1"}]
    with pytest.raises(ValueError):
        models.ServingDeploymentSpec.model_validate({"engine": engine})
    ok = {"image": "i", "model": "m", "resources": {"requests": {"cpu": "500m", "memory": "64Gi"}},
          "env": [{"name": "HF_HOME", "value": "/x"}]}  # fmt: skip
    models.ServingDeploymentSpec.model_validate({"engine": ok, "tuning": {"threshold": 4096}})


LOOP_TIMINGS = {
    # field path: (default, unit as the description says it)
    "spec.tuning.intervalSeconds": (60, "seconds"),
    "spec.tuning.cooldownSeconds": (180, "seconds"),
    "spec.tuning.rollout.analysisWindowSeconds": (120, "seconds"),
    "spec.tuning.rollout.maxRegressionPercent": (100, "percent"),
}


@pytest.mark.parametrize("path", list(LOOP_TIMINGS))
def test_kubectl_explain_shows_each_timing_default_and_unit(path: str) -> None:
    """`kubectl explain` prints a field's schema description: the loop's timings must say
    their default and unit there, and the default said must be the one the schema applies
    (docs/operator.md, "Defaults and the measurements behind them")."""
    node = version_schema()
    for part in path.split("."):
        node = node["properties"][part]
    default, unit = LOOP_TIMINGS[path]
    assert node["default"] == default, node
    assert f"Default {default:g} ({unit}" in node["description"], node["description"]
    model: Any = models.Tuning() if path.startswith("spec.tuning.interval") or "cooldown" in path else models.Rollout()
    assert model.model_dump(by_alias=True)[path.rsplit(".", 1)[1]] == default


def test_docs_name_every_timing_default() -> None:
    """The docs' table of defaults gives the values the schema applies."""
    doc = (ROOT / "docs" / "operator.md").read_text()
    table = doc.split("### Defaults and the measurements behind them", 1)[1].split("\n\n", 3)[2]
    for path, (default, _) in LOOP_TIMINGS.items():
        field = path.removeprefix("spec.tuning.")
        assert any(line.startswith(f"| `{field}` | {default:g} ") for line in table.splitlines()), (field, table)


def test_kubectl_explain_shows_every_default() -> None:
    """`kubectl explain` shows descriptions, not every schema `default`: each field that
    has a default says it in its description, with the value the schema applies."""
    defaulted = [(path, node) for path, node in schema_nodes(version_schema()) if node.get("default", {}) != {}]
    assert len(defaulted) >= 20
    for path, node in defaulted:
        text = node.get("description", "")
        assert "default" in text.lower(), f"{path}: {text!r} does not say its default"
        assert crdgen._default_text(node["default"]) in text, f"{path}: {text!r} does not give {node['default']!r}"
    tuning = version_schema()["properties"]["spec"]["properties"]["tuning"]["properties"]
    for field, said in (("mode", "Default Fixed"), ("engineMode", "Default ceiling"), ("schedulePolicy", "Default fcfs"),
                        ("minConcurrency", "Default 1"), ("maxConcurrency", "Default 8")):  # fmt: skip
        assert said in tuning[field]["description"], (field, tuning[field]["description"])


UNITS = {
    # field path: the unit its description must name
    "spec.tuning.threshold": "in tokens",
    "spec.tuning.objective.ttftP99Seconds": "in seconds",
    "spec.tuning.objective.tenants[].ttftP99Seconds": "in seconds",
    "spec.engine.chunkedPrefillSize": "token",
    "spec.engine.pageSize": "in tokens",
}


@pytest.mark.parametrize("path", list(UNITS))
def test_kubectl_explain_shows_each_unit(path: str) -> None:
    nodes = dict(schema_nodes(version_schema()))
    assert UNITS[path] in nodes["." + path]["description"], nodes["." + path]["description"]
