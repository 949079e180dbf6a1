"""Import layering (kopf's .importlinter idea, checked by reading the source's imports).

Data flows one way: observe -> tune (consults sim) -> rollout -> engine/controller. A stage
may import only the stages beneath it, so a reader can follow one decision from a metric to
an Event by opening folders in order, and the pure stages stay free of I/O clients.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "slipstream"

ALLOWED: dict[str, set[str]] = {
    "sim": set(),
    "api": set(),
    "localkube": set(),
    "engine": {"api"},
    "observe": {"api", "engine"},
    "tune": {"api", "sim"},
    "rollout": {"api", "engine", "tune"},
    "enginesim": {"sim", "engine", "api"},
    "controller": {"api", "engine", "observe", "tune", "rollout", "sim"},
    # The tooling (not in the operator image: tests/unit/test_runtime_only.py) sits on top.
    "canarycheck": {"api", "rollout", "sim"},
    "runtime_only": {"controller"},
    "scalebench": {"api", "controller", "engine", "localkube"},
    "demo": {"api", "engine", "observe", "tune", "rollout", "sim", "controller", "enginesim", "localkube"},
    "cli": {"api", "engine", "observe", "tune", "rollout", "sim", "controller", "enginesim", "localkube",
            "demo", "canarycheck", "scalebench"},
}
"""Stage -> the other stages it may import (its own modules always). A stage is a folder
or a top-level module of the package."""

RUNTIME = {"api", "engine", "observe", "tune", "sim", "rollout", "controller"}
"""What the operator image holds: no runtime stage may import the tooling."""


def stage_files(stage: str) -> list[Path]:
    module = PACKAGE / f"{stage}.py"
    return [module] if module.is_file() else sorted((PACKAGE / stage).rglob("*.py"))


def test_every_stage_of_the_package_is_in_the_layering() -> None:
    stages = {p.stem for p in PACKAGE.iterdir() if (p.is_dir() and (p / "__init__.py").exists())
              or (p.suffix == ".py" and p.name != "__init__.py")}  # fmt: skip
    assert stages == set(ALLOWED), f"not in ALLOWED: {sorted(stages - set(ALLOWED))}"
    for stage in RUNTIME:
        assert ALLOWED[stage] <= RUNTIME, f"the runtime stage {stage} may import tooling"

FORBIDDEN_EVERYWHERE = {"torch", "sglang"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "slipstream":
                names.update(f"slipstream.{alias.name}" for alias in node.names)
    return names


def test_every_stage_imports_only_the_stages_beneath_it():
    problems = []
    for stage, allowed in ALLOWED.items():
        for path in stage_files(stage):
            for name in imports_of(path):
                parts = name.split(".")
                if parts[0] != "slipstream" or len(parts) < 2 or parts[1] == stage:
                    continue
                if parts[1] not in allowed:
                    problems.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not problems, "layering broken:\n" + "\n".join(problems)


def test_the_operator_package_never_imports_torch_or_sglang():
    bad = [f"{p.relative_to(PACKAGE)}: {n}" for p in sorted(PACKAGE.rglob("*.py"))
           for n in imports_of(p) if n.split(".")[0] in FORBIDDEN_EVERYWHERE]
    assert not bad, bad


def test_the_layering_check_sees_a_violation(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("from slipstream.controller import handlers\nimport torch\n")
    assert {"slipstream.controller", "torch"} <= imports_of(sample)
