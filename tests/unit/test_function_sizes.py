"""Every function in ``controller/`` fits on a screen: under 80 lines (issue 20). A step
that grows past it reads as one block again; split it into named stages instead."""

from __future__ import annotations

import ast
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[2] / "operator" / "slipstream" / "controller"
LIMIT = 80


def function_lengths(root: Path) -> list[tuple[int, str]]:
    """(lines, "path:line name") of every function and method under ``root``, nested ones too."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                out.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"))
    return out


def test_the_measure_sees_the_controller() -> None:
    assert len(function_lengths(CONTROLLER)) > 100


def test_no_controller_function_reaches_80_lines() -> None:
    long = sorted((n, where) for n, where in function_lengths(CONTROLLER) if n >= LIMIT)
    assert not long, f"functions of {LIMIT} lines or more in controller/: {long}"
