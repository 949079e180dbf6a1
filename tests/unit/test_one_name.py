"""One name, one meaning (issue 42 item 3): a public module-level function or an UPPER_CASE
constant is defined in one package of ``slipstream`` only, so that ``decide`` or
``DEFAULT_PROFILE`` is never three things, and a constant is never a copy that can drift
from its source. An alias (``X = other.X``) counts as a second definition: use the source.

``KNOWN`` holds the names defined in more than one package when this test was written; it
may only shrink. A name on it that is no longer duplicated fails too, so that the list
stays the truth and the ratchet tightens."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "slipstream"

KNOWN = frozenset({
    "NAME_LABEL",
    "add_parser", "chat", "engine_config",
    "from_dict", "main", "merge", "parse", "plan",
    "replay", "run", "table", "targets",
})  # fmt: skip


def definitions() -> dict[str, set[str]]:
    """{name: the top-level packages (or root modules) of ``slipstream`` defining it}."""
    where: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        unit = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                where[node.name].add(unit)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id.isupper():
                        where[t.id].add(unit)
    return where


def test_no_new_name_is_defined_in_two_packages() -> None:
    twice = {name for name, units in definitions().items() if len(units) > 1}
    new = sorted(twice - KNOWN)
    assert not new, {name: sorted(definitions()[name]) for name in new}


def test_the_known_duplicates_are_still_duplicates() -> None:
    twice = {name for name, units in definitions().items() if len(units) > 1}
    gone = sorted(KNOWN - twice)
    assert not gone, f"defined once now: take {gone} off KNOWN"


def test_the_names_issue_42_named_are_defined_once() -> None:
    where = definitions()
    for name in ("decide", "DEFAULT_PROFILE", "MODES", "TTFT_BUCKETS", "SIZE_CLASSES", "MODEL_MISMATCH", "OVERLOADED"):
        assert len(where.get(name, set())) <= 1, (name, sorted(where[name]))
