"""Auto started on a reflex against Auto started on stock, on the twin's loop, per phase.

For a phased workload (``demo:PHASE_S`` for the demo's documents -> heterogeneous ->
documents at that phase length, ``random:SEED`` for one of ``demo.randomized``'s, or a
loopbench workload file), every constant within the
demo's bounds (``demo.offline.CONSTANTS``: stock, and T 4096 as ceiling, floor or reflex,
in every order) is run once; then Auto (``demo.offline.closed_loop``) from
``reflex:4096/srpt`` (a reflex spec: T and the order tuned, the reflex kept) and from stock
(ceiling and floor tuned), at each timer offset. Prints, per run, the whole run against
the best constant and Off, and the worst phase against that phase's best constant (the
per-phase oracle). ``--constants`` prints every constant's figures per phase too.

    .venv/bin/python scripts/reflex-offline.py demo:240 0,20,40
    .venv/bin/python scripts/reflex-offline.py examples/workloads/loopbench-rag.yaml 0,20,40
    .venv/bin/python scripts/reflex-offline.py random:12 0 --constants
"""

from __future__ import annotations

import argparse

from slipstream.demo import loopbench, offline, phases, randomized


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", help="demo:PHASE_S or a loopbench workload file")
    ap.add_argument("offsets", nargs="?", default="0,20,40", help="timer offsets, twin s (default 0,20,40)")
    ap.add_argument("--constants", action="store_true", help="print every constant's worst-tenant p99 per phase")
    args = ap.parse_args()
    offsets = [float(x) for x in args.offsets.split(",")]
    if args.workload.startswith("demo:"):
        wl, spans = phases.plan(float(args.workload[5:]))
    elif args.workload.startswith("random:"):
        wl, spans = randomized.random_phases(int(args.workload[7:]))
    else:
        wl, spans = loopbench.load_phases(args.workload)
    statics = {n: offline.figures(offline.static(wl, n), spans) for n in offline.CONSTANTS}
    best_name, best = min(statics.items(), key=lambda kv: kv[1]["whole"])
    oracle = {p.name: min(f[p.name] for f in statics.values()) for p in spans}
    off = statics["stock"]["whole"]
    if args.constants:
        for name, f in statics.items():
            print(f"  {name:20s} " + "  ".join(f"{k} {v:.2f} s" for k, v in f.items()))
    print(f"{args.workload}: best constant {best_name} {best['whole']:.2f} s, Off {off:.2f} s, per-phase oracle "
          + ", ".join(f"{k} {v:.2f} s" for k, v in oracle.items()))
    for label, start in (("reflex", offline.REFLEX_START), ("stock", offline.STOCK)):
        for offset in offsets:
            f = offline.figures(offline.closed_loop(wl, spans, offset, offline.LoopSettings(start=start)), spans)
            ratio, phase = max((f[p.name] / oracle[p.name], p.name) for p in spans)
            print(f"  Auto from {label:6s} offset {offset:3.0f} s: whole {f['whole']:.2f} s = "
                  f"{f['whole'] / best['whole']:.2f}x the best constant, {f['whole'] / off:.2f}x Off; "
                  f"worst phase {phase} {ratio:.2f}x its oracle", flush=True)


if __name__ == "__main__":
    main()
