"""What-if for the demo's workload: uniform long documents around the heterogeneous phase.

Issue 16 wants a demo where no single static setting is best: a phase where a cap costs
(uniform long documents: a 4096 ceiling splits each 16K prefill over more passes) beside
the phase where it saves p99 (giant cold prompts). This replays documents -> heterogeneous
-> documents on the twin (`demo.offline`: two engines, round robin) under each static
setting the demo considers and under the operator's loop (`offline.closed_loop`, the CRD's
default timings), and prints the worst tenant's p99 TTFT per phase and over the whole run,
each phase from its first second.

    .venv/bin/python scripts/documents-phase-offline.py --rate 0.8
    .venv/bin/python scripts/documents-phase-offline.py --rate 0.8 --het-s 2880
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import yaml

from slipstream.demo import loop, offline, phases
from slipstream.sim import spec as spec_mod
from slipstream.sim.workload import build


def documents_spec(rate_per_s: float):
    def spec(duration_s: float, replicas: int, seed: int) -> dict[str, object]:
        return {"name": "documents", "profile": phases.PROFILE, "engine": phases.DEMO_ENGINE, "seed": seed,
                "duration_s": duration_s,
                "tenants": [{"name": "docs", "rate_per_s": rate_per_s * replicas,
                             "prompt_tokens": {"dist": "lognormal", "median": 16000, "sigma": 0.15,
                                               "min": 10000, "max": 24000},
                             "output_tokens": {"dist": "lognormal", "median": 20, "sigma": 0.5, "min": 1,
                                               "max": 100}}]}  # fmt: skip
    return spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=0.8, help="documents per second per engine (default %(default)s)")
    ap.add_argument("--docs-s", type=float, default=720.0, help="twin seconds of each documents phase")
    ap.add_argument("--het-s", type=float, default=720.0, help="twin seconds of the heterogeneous phase")
    ap.add_argument("--offset", type=float, default=17.0, help="the loop's timer offset, twin s")
    args = ap.parse_args()
    specs = dict(phases.SPECS, documents=documents_spec(args.rate))
    requests, spans, start = [], [], 0.0
    for index, (kind, duration) in enumerate((("documents", args.docs_s), (phases.HETEROGENEOUS, args.het_s),
                                              ("documents", args.docs_s))):  # fmt: skip
        name = f"{index + 1}-{kind}"
        doc = specs[kind](duration, offline.REPLICAS, index + 1)
        part = spec_mod.parse(yaml.safe_dump(doc), f"<phase {kind}>", tenant_base=index * 8).workload
        requests += [replace(r, rid=f"{name}/{r.rid}", arrival_s=r.arrival_s + start) for r in part.requests]
        spans.append(phases.Phase(name, kind, start, start + duration))
        start += duration
    workload = build("documents-phases", requests, " -> ".join(s.name for s in spans))
    cols = [s.name for s in spans] + ["whole"]
    print(f"{'setting':24s}" + "".join(f"{c:>18s}" for c in cols))
    for name in (*offline.STATIC, "ceiling:8192/srpt"):
        fig = offline.figures(offline.static(workload, name), spans)
        print(f"{name:24s}" + "".join(f"{fig[c]:18.2f}" for c in cols))
    run = offline.closed_loop(workload, spans, args.offset)
    fig = offline.figures(run, spans)
    print(f"{'auto (the loop)':24s}" + "".join(f"{fig[c]:18.2f}" for c in cols))
    print("auto's moves:", ", ".join(f"{t:.0f} s {a} -> {b}" for t, a, b, _ in run.moves) or "none")
    print("auto per tenant, whole run:", {t: round(v, 2) for t, v in loop.tenant_p99(run.results, 0, start).items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
