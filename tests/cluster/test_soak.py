"""The soak's short form (issue 40, item 4): `slipstream soak` as a user runs it, on its own
local stack (a real apiserver and etcd, Prometheus, the chart installed with helm, the
operator), half a twin hour of the diurnal mix with one fault of each kind injected.

The long form is a documented command (docs/reliability.md, "Fault soak"). The checks'
rules, and that each fails on the run it should, are tests/unit/test_soak_plan.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slipstream.demo import soak_plan

pytestmark = pytest.mark.slow

ARGS = ("--hours", "0.5", "--time-scale", "8", "--fault-gap-s", "180", "--warmup-s", "180", "--start-hour", "12", "--phase-s", "600",
        "--hold-s", "60", "--seed", "2")  # fmt: skip
"""Seven faults 180 twin s apart between a 180 s warm-up and the tail: one of each kind."""


def test_the_short_soak_injects_every_fault_and_passes_every_check(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, "-m", "slipstream.cli", "soak", *ARGS, "--json", str(out)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    print(done.stdout[-6000:])
    assert out.exists(), f"no figures written (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    figures = json.loads(out.read_text())
    assert sorted(f["kind"] for f in figures["faults"]) == sorted(soak_plan.FAULT_KINDS), figures["faults"]
    failed = [c for c in figures["checks"] if not c["ok"]]
    assert not failed, failed
    assert done.returncode == 0, done.stderr[-3000:]
    assert {c["name"] for c in figures["checks"]} == {
        "decisions", "no stuck rollout", "fleet accounted for", "memory flat", "no move on missing data"}  # fmt: skip
    assert figures["requests"] > 0 and figures["failed"] < 0.2 * figures["requests"], figures
