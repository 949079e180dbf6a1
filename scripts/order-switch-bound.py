"""What switching the order per phase could buy at best: the hindsight switch on randomized phased workloads.

Per seed (``slipstream.demo.randomized``), every constant (``offline.CONSTANTS``) runs once
over the whole workload, as in ``scripts/sweep-random.py``. Then the *hindsight switch*:
the fleet runs ``reflex:4096`` and, at each phase's start, takes whichever of
``reflex:4096/srpt`` and ``reflex:4096`` (fcfs) was the better static setting in that
phase, with no delay and no canary. No causal tuner choosing between the two orders can
know more, so its figures bound what order switching alone can do: where even it misses
the issue's targets (whole run <= 1.05x the best static, every phase <= 1.25x its
oracle), the miss is not the tuner's timing.

Prints per seed the switch's whole-run and worst-phase ratio beside the two static reflex
orders', then the worst case and the counts over the seeds.

    PYTHONPATH=operator .venv/bin/python scripts/order-switch-bound.py --seeds 0-19 --jobs 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from pathlib import Path

from slipstream.demo import offline, phases, randomized
from slipstream.sim import policies, profiles

sys.path.insert(0, str(Path(__file__).parent))
sweep = __import__("sweep-random")

ORDERS = {"reflex:4096/srpt": "srpt", "reflex:4096": "fcfs"}


def one(seed: int) -> tuple[int, dict[str, offline.SpanFigures], offline.SpanFigures]:
    workload, spans = randomized.random_phases(seed)
    statics = offline.static_figures(workload, spans)
    cfg = offline.engine_config()
    schedule = [(p.start_s, policies.Setting(4096, "reflex", ORDERS[min(ORDERS, key=lambda n: statics[n].phases[i])]))
                for i, p in enumerate(spans)]  # fmt: skip
    jobs = offline.run_engines(offline.split(workload), [schedule] * offline.REPLICAS, profiles.load(phases.PROFILE), cfg)
    return seed, statics, offline.span_figures(offline.Run(offline.results_of(jobs, workload)), spans, offline.FIRST_S)


def ratios(figs: offline.SpanFigures, statics: dict[str, offline.SpanFigures]) -> tuple[float, float]:
    """(whole run / the best static's, the worst phase / its oracle's)."""
    best = min(s.whole for s in statics.values())
    oracle = [min(s.phases[i] for s in statics.values()) for i in range(len(figs.phases))]
    return figs.whole / best, max(x / min(o, x) for x, o in zip(figs.phases, oracle, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-19", help="seeds: ranges and lists (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default %(default)s)")
    args = ap.parse_args()
    rows = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for seed, statics, switch in pool.imap_unordered(one, sweep.numbers(args.seeds)):
            got = {"switch": ratios(switch, statics), **{n: ratios(statics[n], statics) for n in ORDERS}}
            over = sum(x > sweep.PHASE_VS_ORACLE * min(min(s.phases[i] for s in statics.values()), x)
                       for i, x in enumerate(switch.phases))  # fmt: skip
            rows.append((seed, got, over, len(switch.phases)))
            print(f"seed {seed:3d}: " + "; ".join(f"{n} whole {w:.2f}x, worst phase {p:.2f}x" for n, (w, p) in got.items())
                  + f"; switch phases over {sweep.PHASE_VS_ORACLE}x: {over}/{len(switch.phases)}", flush=True)
    print(f"WORST CASE over {len(rows)} seed(s):")
    for name in ("switch", *ORDERS):
        whole = max(rows, key=lambda r: r[1][name][0])
        phase = max(rows, key=lambda r: r[1][name][1])
        print(f"  {name:18s} whole {whole[1][name][0]:.2f}x (seed {whole[0]}), worst phase {phase[1][name][1]:.2f}x "
              f"(seed {phase[0]}); wholes over {sweep.WHOLE_VS_BEST}x: "
              f"{sum(r[1][name][0] > sweep.WHOLE_VS_BEST for r in rows)}/{len(rows)}")
    print(f"  switch phases over {sweep.PHASE_VS_ORACLE}x their oracle: {sum(r[2] for r in rows)}/{sum(r[3] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
