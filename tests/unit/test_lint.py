"""`make lint` in CI: ruff and mypy strict (every runtime package: pyproject's [tool.mypy])
run in the unit tier, so that CI, which runs `make test`, fails on what `make lint` finds."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    done = run("ruff", "check", "--no-cache", "operator", "tests")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_strict_finds_nothing() -> None:
    with tempfile.TemporaryDirectory() as cache:  # a cache of its own: xdist workers run beside each other
        done = run("mypy", "--cache-dir", cache)
    assert done.returncode == 0 and "Success" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
