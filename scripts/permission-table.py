"""Rewrite docs/operator.md's permission tables from the chart's RBAC (`helm template`).

    PYTHONPATH=operator python scripts/permission-table.py [--check]

--check writes nothing and exits 1 when the doc differs from the chart.
tests/cluster/test_chart_render.py checks the same.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from slipstream.localkube import binaries, chartrbac

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "operator.md"


def rendered(sets: tuple[str, ...]) -> list[dict]:
    """The chart rendered offline by the built helm, with ``sets`` as --set values."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "KUBECONFIG": f"{tmp}/none", "HELM_CACHE_HOME": f"{tmp}/c",
               "HELM_CONFIG_HOME": f"{tmp}/cfg", "HELM_DATA_HOME": f"{tmp}/d"}  # fmt: skip
        argv = [str(binaries.default_bin_dir() / "helm"), "template", chartrbac.RELEASE, str(ROOT / "charts" / "slipstream"),
                f"--namespace={chartrbac.RELEASE_NAMESPACE}", *(f"--set={s}" for s in sets)]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc differs; write nothing")
    args = parser.parse_args()
    text = DOC.read_text()
    new = text
    for mode, sets in chartrbac.INSTALLS.items():
        new = chartrbac.replace_section(new, mode, chartrbac.table(rendered(sets)))
    if args.check:
        return 0 if new == text else 1
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
