"""The demo's phases on two twin engines with the operator's tuner, at every timer offset.

Retunes the demo's phases (slipstream.demo.phases) or the closed-loop test's constants
cheaply before any cluster run (slipstream.demo.offline models the fleet: round robin over
two twin engines, the operator's tuner every interval, a canary then a promotion one
analysis window later). The operator's interval timer is not aligned with the phases in
a cluster, so the script sweeps its offset relative to the load's start (default: every
10 s of one interval) and checks at each offset that the tuner decides correctly:

- the first uniform phase is never capped (nothing to gain there);
- each heterogeneous phase is capped within two intervals of its start and ends capped;
- each uniform phase ends uncapped (the tuner steps back).

The worst tenant's p99 TTFT over each whole phase (from its first second) is printed
beside Off's, not asserted: the canary's analysis window, on one engine of two, is in it,
with the time from each phase's start to every engine running the setting it ends on.
``--mix-poll S`` polls the queue mix every S twin seconds between steps, as the operator
does (default: its ``mix_poll_seconds``), and steps at once on a jump; 0: the timer only.

    .venv/bin/python scripts/closed-loop-offline.py                 # sweep, assert, exit 1 on a miss
    .venv/bin/python scripts/closed-loop-offline.py --offsets 0,17 --verbose
    .venv/bin/python scripts/closed-loop-offline.py --rate-factor 8  # wall-clock rates (the old overload)
    .venv/bin/python scripts/closed-loop-offline.py --workload examples/workloads/loopbench-rag.yaml \
        --capped-phases giants --offsets 0,30    # a phased workload file (slipstream loopbench's format)

Prints each offset's moves and each phase's worst-tenant p99 TTFT beside Off's.
"""

from __future__ import annotations

import argparse

from slipstream.demo import loopbench, offline, phases


def capped(name: str) -> bool:
    """A policy name (recommend.policy_name) that caps prefill concurrency: a threshold set."""
    return name.split("/")[0] != "stock"


DEFAULTS = offline.LoopSettings(start=offline.STOCK)
"""The ceiling and floor tuner from stock: the story this script checks (a reflex start,
the demo's, is compared per phase by scripts/reflex-offline.py)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=720.0, help="twin seconds per phase (default %(default)s)")
    ap.add_argument("--offsets", default=None, help="timer offsets, twin s, comma-separated "
                                                     "(default: 0 to the interval, every 10 s)")  # fmt: skip
    ap.add_argument("--interval", type=float, default=DEFAULTS.interval_s, help="twin s (default %(default)s: the CRD's)")
    ap.add_argument("--cooldown", type=float, default=DEFAULTS.cooldown_s, help="twin s (default %(default)s: the CRD's)")
    ap.add_argument("--analysis", type=float, default=DEFAULTS.analysis_s, help="twin s (default %(default)s: the CRD's)")
    ap.add_argument("--max-concurrency", type=int, default=DEFAULTS.max_concurrency)
    ap.add_argument("--rate-factor", type=float, default=1.0)
    ap.add_argument("--mix-poll", type=float, default=DEFAULTS.mix_poll_s,
                    help="twin s between queue-mix polls (step early on a jump); 0: the timer only "
                         "(default %(default)s, the operator's)")  # fmt: skip
    ap.add_argument("--off", action="store_true", help="never move (tuning Off): the decisions are still printed")
    ap.add_argument("--canary", type=int, default=0, help="the canary engine's index in the round robin (0 or 1)")
    ap.add_argument("--verbose", action="store_true", help="print every interval's decision")
    ap.add_argument("--workload", default=None, help="a phased workload file (slipstream loopbench --workload's "
                    "format) instead of the demo's phases; --phase-s is then ignored")
    ap.add_argument("--capped-phases", default=phases.HETEROGENEOUS,
                    help="comma-separated phase kinds (a file's phase names) that should end capped "
                    "(default %(default)s)")
    args = ap.parse_args()

    if args.workload:
        workload, spans = loopbench.load_phases(args.workload)
    else:
        workload, spans = phases.plan(args.phase_s, replicas=offline.REPLICAS)
    heavy = set(args.capped_phases.split(","))
    offsets = ([float(o) for o in args.offsets.split(",")] if args.offsets
               else [float(o) for o in range(0, int(args.interval), 10)])  # fmt: skip
    lset = offline.LoopSettings(args.interval, args.cooldown, args.analysis, args.max_concurrency, args.rate_factor,
                                args.off, args.mix_poll, offline.STOCK)  # fmt: skip
    off = offline.figures(offline.static(workload, "stock"), spans)
    print("Off (stock): " + "  ".join(f"{k} {v:.2f}s" for k, v in off.items()))
    (best_name, best_whole), *_ = offline.ranked_static(workload, spans)
    print(f"best static in hindsight: {best_name}, whole run {best_whole:.2f}s")
    misses: list[str] = []
    for offset in offsets:
        run = offline.closed_loop(workload, spans, offset, lset, log=print if args.verbose else None,
                                  canary=args.canary)
        got = offline.figures(run, spans)
        print(f"== timer at {offset:g} s: {len(run.moves)} move(s): "
              + "; ".join(f"{at:.0f} {a} -> {b}" for at, a, b, _ in run.moves))  # fmt: skip
        print("   auto: " + "  ".join(f"{k} {v:.2f}s ({v / off[k]:.2f}x Off)" for k, v in got.items())
              + f"; whole run {got['whole'] / best_whole:.2f}x the best static")
        print("   on the final setting: " + "  ".join(f"{p.name} {run.settled_after(p.start_s, p.end_s):.0f} s in"
                                                      for p in spans))  # fmt: skip
        for p in spans:
            final = next((to for at, _, to, _ in reversed(run.moves) if at < p.end_s), "stock")
            first_cap = next((at for at, _, to, _ in run.moves if p.holds(at) and capped(to)), None)
            if p.kind in heavy:
                if not capped(final):
                    misses.append(f"offset {offset:g}: {p.name} ends on {final}, not capped")
                if first_cap is None or first_cap - p.start_s > 2 * args.interval:
                    misses.append(f"offset {offset:g}: {p.name} not capped within two intervals "
                                  f"(first capped move: {first_cap})")  # fmt: skip
            elif capped(final):
                misses.append(f"offset {offset:g}: {p.name} ({p.kind}) ends capped on {final}")
            elif p.start_s == 0 and first_cap is not None:
                misses.append(f"offset {offset:g}: {p.name} capped before any heterogeneous traffic")
    for miss in misses:
        print("MISS", miss)
    print(f"{len(offsets)} offset(s), {len(misses)} miss(es)")
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
