"""Engine tests: real sglang 0.5.18 (and 0.5.23) scheduler code on CPU (see harness.py).

Run through `tests/engine/run.sh` (or `make engine-test`): it builds the engine
environment (engine_image/test-env/setup.sh) and runs pytest with that environment's
python, the patched sglang copy first on sys.path (SLIPSTREAM_PATCHED_SGLANG) and our
package (operator/) importable. The main test run ignores this folder
(`pytest --ignore=tests/engine`); run any other way, the folder collects nothing.
`SGLANG_VERSION=0.5.23 tests/engine/run.sh` runs the same tests on 0.5.23 (harness.py
reads either version's objects); the 0.5.18 run leaves out the 0.5.23-only files
(VERSION_FILES). A version without a patch would collect only PRISTINE_ONLY.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PATCHED = os.environ.get("SLIPSTREAM_PATCHED_SGLANG")
VERSION = os.environ.get("SLIPSTREAM_SGLANG_VERSION", "0.5.18")
"""The sglang version of the environment run.sh chose (SGLANG_VERSION)."""

PRISTINE_ONLY = ["test_upstream_orders.py"]
"""Tests that need only the pristine sglang: all a version without a patch would run."""
VERSION_FILES = {"test_upstream_orders.py": ("0.5.23",), "test_conformance_spf.py": ("0.5.23",)}
"""Tests that drive code only some versions have (0.5.23's shortest-prefill-first, hrrn)."""

if not os.environ.get("SLIPSTREAM_ENGINE_ENV"):
    collect_ignore_glob = ["test_*.py"]
else:
    collect_ignore = [name for name, versions in VERSION_FILES.items() if VERSION not in versions]
    if not PATCHED:
        collect_ignore_glob = [
            p.name for p in HERE.glob("test_*.py") if p.name not in PRISTINE_ONLY
        ]
    sys.path.insert(0, PATCHED or str(HERE))
    sys.path.insert(1, str(HERE))
    sys.path.insert(2, str(REPO / "operator"))


def run_pristine(cases: dict[str, Any]) -> dict[str, list[dict[str, int]]]:
    """Run harness cases against the unpatched sglang (the env's site-packages)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "harness.py"), json.dumps(cases)],
        cwd=str(HERE),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise AssertionError(f"pristine run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def pristine():
    return run_pristine
