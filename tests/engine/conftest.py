"""Engine tests: real sglang 0.5.18 scheduler code on CPU (see harness.py).

Run through `tests/engine/run.sh` (or `make engine-test`): it builds the engine
environment (engine_image/test-env/setup.sh) and runs pytest with that environment's
python, the patched sglang copy first on sys.path (SLIPSTREAM_PATCHED_SGLANG) and our
package (operator/) importable. The main test run ignores this folder
(`pytest --ignore=tests/engine`); run any other way, the folder collects nothing.
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

if not PATCHED:
    collect_ignore_glob = ["test_*.py"]
else:
    sys.path.insert(0, PATCHED)
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
