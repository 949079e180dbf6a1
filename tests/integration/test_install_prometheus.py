"""scripts/install-prometheus.sh: idempotent, pinned, and leaves no system service running."""

from __future__ import annotations

import subprocess
from pathlib import Path

import observe_helpers

prometheus_binary = observe_helpers.prometheus_binary
"""Fixtures from observe_helpers (no conftest.py here: see its docstring)."""

REPO = Path(__file__).resolve().parents[2]
PINNED = "2.42.0+ds-5+deb12u1"


def package_servers() -> list[str]:
    """Command lines of running prometheus processes using the package's own config."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith("/usr/bin/prometheus") and "--config.file=" not in cmdline:
            found.append(cmdline)  # the Debian service's defaults: /etc/prometheus/prometheus.yml
        elif "/etc/prometheus/prometheus.yml" in cmdline:
            found.append(cmdline)
    return found


def test_second_run_says_cached_and_no_package_service_runs(prometheus_binary):
    run = subprocess.run(["bash", str(REPO / "scripts/install-prometheus.sh")],
                         capture_output=True, text=True, timeout=300, check=True)
    assert run.stdout.startswith(f"cached: prometheus {PINNED}"), run.stdout + run.stderr
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "prometheus"],
                             capture_output=True, text=True, check=True).stdout
    assert version == PINNED
    assert package_servers() == []
