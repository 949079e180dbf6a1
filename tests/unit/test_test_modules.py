"""Test modules have one basename each within a pytest run: the suite has no packages
(rootdir imports), so two ``test_x.py`` in different tiers make collection fail with
"import file mismatch" and nothing runs. The engine tier is its own run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique_within_a_run() -> None:
    runs = {"main": [p for p in TESTS.rglob("test_*.py") if "engine" not in p.relative_to(TESTS).parts[:1]],
            "engine": list((TESTS / "engine").rglob("test_*.py"))}  # fmt: skip
    for run, paths in runs.items():
        by_name: dict[str, list[str]] = defaultdict(list)
        for p in paths:
            by_name[p.name].append(str(p.relative_to(TESTS)))
        twice = {n: ps for n, ps in by_name.items() if len(ps) > 1}
        assert not twice, f"{run} run: test modules sharing a basename (rename one): {twice}"
