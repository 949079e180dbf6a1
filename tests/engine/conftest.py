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
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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


class PristineWorker:
    """One `harness.py --serve` process on the unpatched sglang (the env's site-packages),
    started at the first call and kept for the session: each call would otherwise pay
    sglang's import (~8 s) in a process of its own. Its stderr goes to a file, read back
    when a call fails."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()

    def _start(self) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.Popen(
            [sys.executable, str(HERE / "harness.py"), "--serve"],
            cwd=str(HERE), env=env, text=True, bufsize=1,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
        )  # fmt: skip

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-4000:]

    def run(self, cases: dict[str, Any], timeout_s: float = 900.0) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(cases) + "\n")
        proc.stdin.flush()
        # Raw reads of the pipe: a buffered reader may hold the answer while select waits.
        fd, pending, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout_s
        with selectors.DefaultSelector() as waiting:
            waiting.register(fd, selectors.EVENT_READ)
            while RESULT.encode() not in pending or not pending.split(RESULT.encode(), 1)[1].count(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not waiting.select(left):
                    proc.kill()
                    raise AssertionError(f"pristine run: no answer within {timeout_s:g} s\n{self._stderr_tail()}")
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise AssertionError(f"pristine run: the worker exited ({proc.wait()})\n{self._stderr_tail()}")
                pending += chunk
        line = pending.split(RESULT.encode(), 1)[1].split(b"\n", 1)[0]
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"pristine run failed:\n{answer['error'][-4000:]}")
        return dict(answer["ok"])

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.stderr.close()


RESULT = "@@result "
"""harness.RESULT (harness.py imports sglang, so it is not imported here)."""


@pytest.fixture(scope="session")
def pristine() -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
    """Run harness cases against the unpatched sglang; one worker process per session."""
    worker = PristineWorker()
    yield worker.run
    worker.close()
