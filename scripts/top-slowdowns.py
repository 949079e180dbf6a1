#!/usr/bin/env python3
"""Which requests set each tenant's p99 slowdown, under each static setting.

A whole run's worst-tenant p99 slowdown (what ``slipstream bench`` ranks settings by) rests
on each tenant's top 1% of requests. When those all arrive in one episode (a few giant
prompts prefilling together), the ranking of static settings is the ranking on that
episode, and a tuner is judged by the setting it ran then. This prints, per setting and
tenant, the requests with the largest slowdown (arrival second, slowdown, uncached
prompt tokens), the tenant's p99, and the workload's giant prompts, so a gap between ``auto`` and
the best static setting can be traced to the moment it came from.

    .venv/bin/python scripts/top-slowdowns.py --workload builtin:multi-tenant \\
        --policy ceiling:4096/srpt --policy floor:4096/srpt
"""

from __future__ import annotations

import argparse
from typing import Any

from slipstream.sim import engine, metrics, policies, profiles, spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, help="a YAML workload spec, or builtin:NAME")
    ap.add_argument("--policy", action="append", required=True, help="a static policy name; repeat")
    ap.add_argument("--top", type=int, default=6, help="requests shown per tenant (default %(default)s)")
    ap.add_argument("--giant-tokens", type=int, default=150_000,
                    help="prompts at least this long are listed as giants (default %(default)s)")
    args = ap.parse_args()
    loaded = spec.load(args.workload)
    profile = profiles.load(loaded.profile or "kimi-k3-8xh200")
    for name in args.policy:
        result = engine.simulate(loaded.workload, policies.parse(name, loaded.engine), profile, loaded.engine)
        per_tenant = metrics.summarize(result)["per_tenant"]
        rows: dict[str, list[dict[str, Any]]] = {}
        for row in metrics.request_rows(result):
            if row["slowdown"] is not None:
                rows.setdefault(row["tenant"], []).append(row)
        print(name)
        for tenant, got in sorted(rows.items()):
            top = sorted(got, key=lambda r: -r["slowdown"])[: args.top]
            shown = ", ".join(f"{r['arrival_s']:.0f} s: {r['slowdown']:.0f} ({r['uncached_tokens']} tok)" for r in top)
            print(f"  {tenant:8s} {len(got):5d} requests, p99 slowdown {per_tenant[tenant]['slowdown_p99']:7.1f}; "
                  f"largest at {shown}")
    giants = [(r.arrival_s, r.prompt_tokens, r.tenant) for r in loaded.workload.requests
              if r.prompt_tokens >= args.giant_tokens]
    print("giants (arrival s, prompt tokens, tenant): " + ", ".join(f"{a:.0f} {p} {t}" for a, p, t in giants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
