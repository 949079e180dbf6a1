"""No type name is defined twice in the operator's package: a reader who meets
``Recommendation`` or ``Sample`` should never have to ask which one (issue 20)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "slipstream"
TYPE_STATEMENT = getattr(ast, "TypeAlias", ())
"""``type X = ...`` (Python 3.12+; none before)."""


def type_definitions(root: Path) -> dict[str, list[str]]:
    """Module-level classes and type aliases (``X = Literal[...]``, ``X: TypeAlias = ...``,
    ``type X = ...``) by name, with where each is defined."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = str(path.relative_to(root.parent))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{where}:{node.lineno}")
            elif isinstance(node, TYPE_STATEMENT):
                found[node.name.id].append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if "TypeAlias" in ast.unparse(node.annotation):
                    found[node.target.id].append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
                generic = isinstance(value, ast.Subscript) and ast.unparse(value.value).split(".")[-1] in {
                    "Literal", "Union", "Optional", "Callable", "tuple", "dict", "list", "Mapping", "Sequence"}
                if name[:1].isupper() and not name.isupper() and generic:
                    found[name].append(f"{where}:{node.lineno}")
    return found


def test_no_type_name_is_defined_twice() -> None:
    twice = {name: places for name, places in type_definitions(PACKAGE).items() if len(places) > 1}
    assert not twice, "type names defined more than once (rename one): " + "; ".join(
        f"{name} at {', '.join(places)}" for name, places in sorted(twice.items()))


def test_the_check_sees_a_duplicate(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("class Sample:\n    pass\nCall = Literal['x']\n")
    (pkg / "b.py").write_text("from typing import Literal\nSample = tuple[int, int]\nCall = Literal['y']\n")
    found = type_definitions(pkg)
    assert len(found["Sample"]) == 2 and len(found["Call"]) == 2
