"""Generate the ServingDeployment CRD from the pydantic models.

    python -m slipstream.api.crdgen            # writes crds/ and charts/slipstream/crds/
    python -m slipstream.api.crdgen --check    # exits 1 if either file is stale

The models' JSON schema (pydantic, JSON Schema 2020-12) is rewritten into a Kubernetes
structural schema (OpenAPI v3.0 subset): references inlined, `Optional` unwrapped,
`exclusiveMinimum: x` turned into `minimum: x, exclusiveMinimum: true`, titles dropped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from slipstream.api import models

CRD_FILE = f"{models.PLURAL}.{models.GROUP}.yaml"
_DROP = {"title", "additionalProperties", "$defs"}

PRINTER_COLUMNS = [
    {"name": "Threshold", "type": "integer", "jsonPath": ".status.threshold",
     "description": "T the engines run now (0 = off)"},
    {"name": "Concurrency", "type": "integer", "jsonPath": ".status.concurrency",
     "description": "Concurrent prefills, chunkedPrefillSize // T"},
    {"name": "Mode", "type": "string", "jsonPath": ".status.mode",
     "description": "Engine mode in effect (ceiling | floor | reflex)"},
    {"name": "Heterogeneity", "type": "number", "jsonPath": ".status.heterogeneity",
     "description": "Measured heterogeneity of the traffic mix"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Tuning", "type": "string", "jsonPath": ".spec.tuning.mode", "priority": 1,
     "description": "Auto | Recommend | Fixed | Off"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas", "priority": 1},
]


def _keys_rule(path: str, pattern: str) -> dict[str, str]:
    """A map's key pattern (pydantic's patternProperties, which a structural schema lacks)
    as a CEL rule on the map."""
    return {
        "rule": f"self.all(k, k.matches(r'{pattern}'))",  # raw: the pattern's backslashes
        "message": f"{path}: every key must be a qualified name such as cpu, nvidia.com/gpu or "
        "kubernetes.io/hostname (letters, digits, '-', '_', '.'; an optional DNS prefix and '/'): "
        "fix the key",
    }


def _structural(node: dict[str, Any], defs: dict[str, Any], path: str = "") -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _structural({**target, **siblings}, defs, path)
    if "patternProperties" in node:
        ((pattern, values),) = node["patternProperties"].items()
        rest = {k: v for k, v in node.items() if k not in ("patternProperties", "propertyNames")}
        rules = [*rest.get("x-kubernetes-validations", []), _keys_rule(path, pattern)]
        return _structural({**rest, "additionalProperties": values, "x-kubernetes-validations": rules}, defs, path)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        if len(variants) != 1:
            raise ValueError(f"only Optional[X] unions are supported, got {node['anyOf']}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", ...) is None:
            del rest["default"]
        return _structural({**variants[0], **rest}, defs, path)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs, f"{path}[]")
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "minLength" and node.get("type") == "array":
            out["minItems"] = value
        elif key == "maxLength" and node.get("type") == "array":
            out["maxItems"] = value
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if "properties" in out:
        out.setdefault("type", "object")
    else:
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = _structural(extra, defs, f"{path}{{}}")
    if out.get("enum") and "type" not in out:
        out["type"] = "string"
    if out.get("required") == []:
        del out["required"]
    return _with_default_said(out)


def _default_text(value: Any) -> str:
    """A default as YAML would write it: true, fcfs, [fcfs, lpm], 8192."""
    if isinstance(value, list):
        return "[" + ", ".join(_default_text(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _with_default_said(node: dict[str, Any]) -> dict[str, Any]:
    """`kubectl explain` prints a field's description, and not its schema `default` on
    every kubectl: a description that does not give its default gets "Default: X."
    appended, so every default is read where users look. Section defaults ({}) are left out: the fields
    inside say theirs."""
    if "default" not in node or node["default"] == {}:
        return node
    description, value = node.get("description", ""), _default_text(node["default"])
    if "default" in description.lower() and value in description:
        return node
    said = f"Default: {value}."
    return {**node, "description": f"{description} {said}".strip()}


def model_schema(model: type[models.Model], path: str = "") -> dict[str, Any]:
    """The structural schema of one model, as it appears in the CRD at `path`."""
    raw = model.model_json_schema(by_alias=True)
    return _structural(raw, raw.get("$defs", {}), path)


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec = model_schema(models.ServingDeploymentSpec, "spec")
    spec["description"] = "Desired state: the engine, how T is tuned, where metrics are read."
    status = model_schema(models.ServingDeploymentStatus, "status")
    status["description"] = "Observed state, written by the operator."
    root = {
        "type": "object",
        "description": "An SGLang serving deployment whose long-prefill token threshold "
        "Slipstream keeps matched to the traffic.",
        "required": ["spec"],
        "x-kubernetes-validations": [{"rule": models.NAME_RULE[0], "message": models.NAME_RULE[1]}],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{models.PLURAL}.{models.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "slipstream"},
        },
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": list(models.SHORT_NAMES),
                "categories": ["slipstream"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Writes repeated sub-schemas in full: no YAML anchors in a CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    header = "# Generated by `python -m slipstream.api.crdgen` from slipstream/api/models.py; do not edit.\n"
    return header + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=100)


def targets(root: Path) -> list[Path]:
    return [root / "crds" / CRD_FILE, root / "charts" / "slipstream" / "crds" / CRD_FILE]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args(argv)
    text = render()
    stale = []
    for path in targets(args.root):
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if args.check and stale:
        print("stale: " + ", ".join(map(str, stale)) + " (run python -m slipstream.api.crdgen)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
