"""Run the operator as its image runs it: without the tooling, and without the packages the
image does not install.

The local stacks (cluster tests, demo, `scripts/bench-scale.py`) start the operator through
this module (``python -m slipstream.runtime_only --peering=...``), so what they test and
measure is the image's process: a tooling import in the runtime fails there as it would in
the image, and the memory they report holds no package the image lacks (kopf imports
`kubernetes` whenever it is installed: ~5 MB of the entry point's imports, 68.5 MB
against 63.6 MB without it). The repository's own
environment holds all of them, for the tooling and the tests.

This module itself imports nothing of the package's, so nothing is loaded before the
blocker is in place.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

TOOLING = ("localkube", "demo", "enginesim", "scalebench.py", "canarycheck.py", "cli.py", "sim/plots.py",
           "runtime_only.py")  # fmt: skip
"""The tooling inside the package, as paths under operator/slipstream/ (the Dockerfile
removes each)."""
TOOLING_DEPENDENCIES = ("matplotlib", "cryptography", "tqdm", "kubernetes")
"""Packages in the repository's environment that the operator image does not install (the
`tools` extra)."""


def module_of(path: str) -> str:
    return "slipstream." + path.removesuffix(".py").replace("/", ".")


BLOCKED = tuple(module_of(p) for p in TOOLING if p != "runtime_only.py") + TOOLING_DEPENDENCIES


class Blocker(importlib.abc.MetaPathFinder):
    """Refuses to find any module of `blocked`, as if it were not installed."""

    def __init__(self, blocked: Sequence[str]) -> None:
        self.blocked = tuple(blocked)

    def covers(self, name: str) -> bool:
        return any(name == b or name.startswith(b + ".") for b in self.blocked)

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.covers(name):
            raise ImportError(f"{name} is not in the runtime-only environment")
        return None


def block(blocked: Sequence[str] = BLOCKED) -> Blocker:
    """Install the blocker first on the import path (before anything blocked is imported)."""
    if already := loaded(blocked):
        raise RuntimeError(f"already loaded, so they cannot be blocked: {already}")
    blocker = Blocker(blocked)
    sys.meta_path.insert(0, blocker)
    return blocker


def loaded(blocked: Sequence[str] = BLOCKED) -> list[str]:
    """The modules of `blocked` this process has loaded."""
    return sorted(m for m in sys.modules if Blocker(blocked).covers(m))


def main(argv: list[str] | None = None) -> None:
    block()
    from slipstream.controller.runtime import main as runtime_main

    runtime_main.main(argv)


if __name__ == "__main__":
    main()
