"""How often today's canary rule rolls back a candidate that is no worse (A/A), offline.

The demo's phases (slipstream.demo.phases) go round robin to two twin engines that run the
same setting, as the load generator spreads requests over the ready pods. Engine 0 plays
the canary, engine 1 the baseline. Every analysis window (non-overlapping, per phase) is
judged by the operator's own rule (`rollout.analysis.compare`: per-tenant p99 TTFT of the
first tokens in the window, the noise floor a quarter of the 2 s target), for several
`maxRegressionPercent` bounds. With ``--slower F`` the canary's TTFTs are multiplied by F:
the rate at which a canary F times slower is caught.

    .venv/bin/python scripts/canary-aa-offline.py --phase-s 3600 --window 120
    .venv/bin/python scripts/canary-aa-offline.py --phase-s 3600 --window 120 --slower 2

The twin's p99s are exact; the operator reads them from SGLang's TTFT buckets, which adds
the buckets' own coarseness on top (so the live rate is no lower than this).
"""

from __future__ import annotations

import argparse

from slipstream.demo import loop, phases
from slipstream.rollout import analysis
from slipstream.sim import engine, policies, profiles
from slipstream.sim.workload import build

FLOOR_S = 0.25 * 2.0  # controller.settings canary_noise_floor x the default ttftP99Seconds
BOUNDS = (5.0, 25.0, 50.0, 100.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=720.0, help="twin seconds per phase (default %(default)s)")
    ap.add_argument("--window", type=float, default=120.0, help="analysis window, twin s (default %(default)s)")
    ap.add_argument("--policy", default="stock", help="the setting both engines run (default %(default)s)")
    ap.add_argument("--slower", type=float, default=1.0, help="multiply the canary's TTFTs by this (default 1: A/A)")
    args = ap.parse_args()

    profile = profiles.load(phases.PROFILE)
    cfg = policies.EngineConfig(chunked_prefill_size=8192, page_size=1)
    workload, spans = phases.plan(args.phase_s, replicas=2)
    sides = []
    for k in range(2):
        requests = [r for i, r in enumerate(workload.requests) if i % 2 == k]
        jobs = engine.simulate(build(f"engine-{k}", requests), policies.parse(args.policy, cfg), profile, cfg).jobs
        factor = args.slower if k == 0 else 1.0
        # Keyed by first-token time: the operator reads the TTFTs observed in the window.
        sides.append([loop.Result(j.req.tenant, j.rid, j.first_token_s, (j.first_token_s - j.arrival_s) * factor, True)
                      for j in jobs if j.first_token_s >= 0])  # fmt: skip
    print(f"policy {args.policy}, window {args.window:g} s, canary TTFT x{args.slower:g}; "
          f"share of windows the rule rolls back, per maxRegressionPercent")  # fmt: skip
    print(f"{'phase':18s} {'windows':>7s} " + " ".join(f"{b:>6g}%" for b in BOUNDS))
    for span in spans:
        starts = [span.start_s + i * args.window for i in range(int((span.end_s - span.start_s) // args.window))]
        judged = [(loop.tenant_p99(sides[0], s, s + args.window), loop.tenant_p99(sides[1], s, s + args.window))
                  for s in starts]  # fmt: skip
        rates = [sum(not analysis.compare(c, b, bound, FLOOR_S).passed for c, b in judged) / len(judged)
                 for bound in BOUNDS]  # fmt: skip
        print(f"{span.name:18s} {len(judged):7d} " + " ".join(f"{r:7.0%}" for r in rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
