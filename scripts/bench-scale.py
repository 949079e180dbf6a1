"""Scale benchmark: N ServingDeployments on the local control plane, the operator measured.

Usage: .venv/bin/python scripts/bench-scale.py [N ...] [--interval S] [--intervals K]
       (default: 50 500, a 20 s tuning interval, 3 intervals measured)

For each N a fresh stack (control plane with kwok, a real Prometheus, the chart and the
operator as a process; see slipstream.scalebench for what runs and why): progress
lines while it runs, then one JSON line of figures. Everything it starts is stopped when it
ends, on an error or on Ctrl-C. Needs the Kubernetes binaries (scripts/build-kube.sh) and
Prometheus (scripts/install-prometheus.sh).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from slipstream import scalebench as scale


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[50, 500], help="numbers of ServingDeployments")
    parser.add_argument("--interval", type=int, default=20, help="spec.tuning.intervalSeconds (>= 10)")
    parser.add_argument("--intervals", type=int, default=3, help="intervals measured")
    parser.add_argument("--deadline", type=float, default=900.0,
                        help="seconds to wait for all reconciled, and again for every loop's first step")
    parser.add_argument("--operator-env", action="append", default=[], metavar="K=V",
                        help="extra operator environment (controller settings)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: every process started so far is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = dict(kv.split("=", 1) for kv in args.operator_env)
    results = []
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix=f"scale-{n}-") as tmp:
            figures = scale.run(Path(tmp), scale.Options(deployments=n, interval_s=args.interval,
                                                         intervals=args.intervals, operator_env=env,
                                                         reconcile_deadline_s=args.deadline))
        print(figures.to_json(), flush=True)
        results.append(figures)
    if len(results) > 1:
        print(scale.table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
