"""The operator's runtime apart from the tooling (issue 20 item 1).

The runtime (api, engine, observe, tune, sim, rollout, controller) must import and start
without the tooling modules and without the `tools` extra's packages: the operator image
removes the tooling (Dockerfile) and installs no extra. Here the controller's entry point is
imported in a fresh interpreter in which every tooling module and tooling dependency is made
unimportable, as it is in the image, and none of them may have been loaded.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from slipstream.runtime_only import BLOCKED, TOOLING, TOOLING_DEPENDENCIES

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "slipstream"

ENTRY_POINTS = ("slipstream.controller.runtime.main", "slipstream.controller.handlers", "slipstream.controller.__main__")

BLOCKER = """
import sys
from slipstream import runtime_only
runtime_only.block({blocked!r})
sys.argv = ["slipstream.controller", "--help"]
import importlib
for entry in {entries!r}:
    if entry.endswith("__main__"):
        continue
    importlib.import_module(entry)
print("LOADED", runtime_only.loaded({blocked!r}))
"""


def test_the_tooling_list_names_what_exists() -> None:
    for path in TOOLING:
        assert (PACKAGE / path).exists(), path


def test_the_controller_imports_in_a_runtime_only_environment() -> None:
    script = BLOCKER.format(blocked=list(BLOCKED), entries=ENTRY_POINTS)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"}, cwd="/")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LOADED []" in out.stdout, out.stdout


def test_the_blocker_would_see_a_tooling_import() -> None:
    script = BLOCKER.format(blocked=["slipstream.demo"], entries=("slipstream.demo.phases",))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"}, cwd="/")  # fmt: skip
    assert out.returncode != 0 and "not in the runtime-only environment" in out.stderr


def test_the_runtime_dependencies_hold_none_of_the_tools_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not names & set(TOOLING_DEPENDENCIES), names
    extra = {re.split(r"[<>=\[ ]", d, maxsplit=1)[0].lower() for d in project["optional-dependencies"]["tools"]}
    assert set(TOOLING_DEPENDENCIES) <= extra
    assert "'.[dev,tools]'" in (REPO / "Makefile").read_text(), "the Makefile installs the tools extra"


def test_the_operator_image_removes_the_tooling_and_installs_no_extra() -> None:
    text = (REPO / "Dockerfile").read_text()
    removed = re.search(r"rm -rf ([^;]+);", text)
    assert removed, "the Dockerfile removes the tooling before it installs the package"
    assert set(removed.group(1).split()) == set(TOOLING)
    install = [line for line in text.splitlines() if "pip install" in line]
    assert install and all("[" not in line for line in install), install
    assert "import slipstream.controller.runtime.main" in text, "the build checks the runtime imports"


def test_the_local_stacks_launcher_runs_the_entry_point_with_its_arguments() -> None:
    """`python -m slipstream.runtime_only ARGS` is `python -m slipstream.controller ARGS`
    with the blocker in place (the local stacks start the operator this way)."""
    out = subprocess.run([sys.executable, "-m", "slipstream.runtime_only", "--help"], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"}, cwd="/")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage: python -m slipstream.controller" in out.stdout and "--peering" in out.stdout


def test_blocking_after_a_blocked_module_was_loaded_is_refused() -> None:
    script = "import json\nfrom slipstream import runtime_only\nruntime_only.block(['json'])"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"}, cwd="/")  # fmt: skip
    assert out.returncode != 0 and "already loaded, so they cannot be blocked: ['json'" in out.stderr


def test_mypy_strict_checks_every_runtime_package() -> None:
    """Issue 42 item 4: `make lint` runs mypy strict over every package the image keeps
    (every folder of the package not in TOOLING), so a new runtime package is checked from
    its first commit, not left out of a hand-kept list."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    runtime = {f"slipstream.{d.name}" for d in PACKAGE.iterdir()
               if d.is_dir() and (d / "__init__.py").exists() and d.name not in TOOLING}  # fmt: skip
    assert config.get("strict") is True
    assert runtime <= set(config["packages"]), sorted(runtime - set(config["packages"]))
    assert {"slipstream.controller", "slipstream.tune", "slipstream.observe", "slipstream.api"} <= runtime
