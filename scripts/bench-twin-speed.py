#!/usr/bin/env python3
"""The twin's speed figures (issue 17, item 3), each beside the same figure of a base commit.

Three measurements, each run on this tree and on ``--base`` (exported with ``git archive``
into a temporary directory), one after the other in the same invocation, so the ratio
compares two runs on the same machine at the same load:

1. ``simulate``: the whole process ``slipstream simulate --trace TRACE --policy
   ceiling:4096 --json`` (start-up, trace load and rate fit included): simulated span
   (the trace's span at the fitted rate scale) over the process's wall time, and over its
   CPU time (a busy machine inflates wall time, not CPU time); ``--rounds`` processes per
   tree, alternating between the trees, and the median by CPU time is shown;
2. ``recommend``: one recommendation over the full candidate set (no step limit) from
   off, on the snapshot ``slipstream recommend --workload builtin:multi-tenant --at 600
   --window 120`` uses: CPU seconds, median of ``--repeats``;
3. ``bench auto`` (``--auto``; minutes on each tree): ``slipstream bench --trace TRACE
   --trace AzureLLMInferenceTrace_code.csv --tenant chat --tenant code --policies auto
   --speed --json``: auto's simulated span over its run's wall time.

A fourth run checks equality alone: every built-in scenario under six policies, with the
profile's KV pool and with one small enough to make decodes retract.

Every measurement also prints a digest of its outputs (the per-request table, the
candidates' predictions, the bench summary); "same outputs: yes" means the two trees
computed identical results, which is the check that a speed change changed nothing else.

    python scripts/bench-twin-speed.py [--base ee3507c] [--auto] [--repeats 5]

Run it under ``flock /tmp/slipstream-heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
AUTO_SECOND_TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
"""``--auto`` runs on TRACE merged with this one (tenants chat and code): on TRACE alone at
its fitted rate a window holds too few first tokens for the tuner, and the twin never runs."""
DEFAULT_BASE = "ee3507c"
"""The commit before the speed work (issue 17 item 3)."""

RECOMMEND_CHILD = r"""
import hashlib, json, statistics, sys, time
from dataclasses import replace
from slipstream.sim import engine, policies, profiles, spec
from slipstream.tune import auto, observed, recommend
from slipstream.tune.candidates import TuningSpec

repeats = int(sys.argv[1])
loaded = spec.load_builtin("multi-tenant")
workload, config = loaded.workload, loaded.engine
profile = profiles.load(loaded.profile)
seen = []
under = policies.parse("stock", config, controller=lambda v: seen.extend(v.first_tokens), interval_s=1.0)
engine.simulate(workload, under, profile, config)
snap = observed.snapshot_of(workload.name, seen, 600.0, 120.0)
tuning = TuningSpec(config.chunked_prefill_size, config.page_size)
settings = replace(recommend.RecommenderSettings(), max_step_factor=0.0)
current = auto.start_setting(policies.parse("stock", config))
cpus, digest = [], None
for _ in range(repeats):
    start = time.process_time()
    rec = recommend.recommend(snap, current, tuning, profile, config, settings)
    cpus.append(time.process_time() - start)
    rows = sorted((recommend.policy_name(p.setting), p.worst_tenant_slowdown_p99,
                   p.long_prompt_slowdown_p99) for p in (*rec.predictions, *rec.confirmed))
    d = hashlib.sha256(json.dumps([recommend.policy_name(rec.best.setting), rows]).encode()).hexdigest()
    assert digest in (None, d), "the recommendation differs between repeats"
    digest = d
print(json.dumps({"cpu_s": cpus, "candidates": len(rec.predictions), "digest": digest}))
"""

SCENARIOS_CHILD = r"""
import hashlib, json
from dataclasses import replace
from slipstream.sim import engine, policies, profiles, spec

rows = []
for name in spec.builtin_names():
    loaded = spec.load_builtin(name)
    profile = profiles.load(loaded.profile)
    for pool in (None, 60_000):  # the profile's pool, and one small enough to retract
        config = loaded.engine if pool is None else replace(loaded.engine, kv_pool_tokens=pool)
        for pol in ("stock", "ceiling:2048/srpt", "floor:4096/lpm", "sarathi:8192", "hrrn", "sglang-spf"):
            r = engine.simulate(loaded.workload, policies.parse(pol, config), profile, config)
            rows.append([name, pool, pol, r.makespan_s, r.busy_s, r.passes, r.peak_kv_tokens,
                         r.retractions, r.rejected, sum(r.step_gaps), sum(r.entry_gaps),
                         [(j.rid, j.first_token_s, j.finished_s, j.max_itl_s) for j in r.jobs]])
print(json.dumps({"runs": len(rows), "retractions": sum(r[7] for r in rows),
                  "digest": hashlib.sha256(json.dumps(rows).encode()).hexdigest()}))
"""


def export_base(ref: str, into: Path) -> Path:
    """``git archive`` of ``ref``'s operator/ into ``into``; returns the package root."""
    archive = into / "base.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref, "operator"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "operator"


def run_child(package_root: Path, args: list[str]) -> tuple[str, float, float]:
    """Run ``python ARGS`` with ``package_root`` first on the path: (stdout, wall s, CPU s)."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"child {args[:4]} under {package_root} failed:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.stdout, wall, cpu


def digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def trace_span_s(trace: Path) -> float:
    sys.path.insert(0, str(ROOT / "operator"))
    from slipstream.sim import traces

    return traces.load(trace).span_s


def measure_simulate(root: Path, trace: Path, policy: str, span: float) -> dict[str, object]:
    out, wall, cpu = run_child(root, ["-m", "slipstream.cli", "simulate", "--trace", str(trace),
                                      "--policy", policy, "--json"])
    data = json.loads(out)
    simulated = span / data["rate_scale"]
    return {"wall_s": wall, "cpu_s": cpu, "x_wall": simulated / wall, "x_cpu": simulated / cpu,
            "simulated_s": simulated, "digest": digest([data["rate_scale"], data["requests"]])}


def measure_recommend(root: Path, repeats: int) -> dict[str, object]:
    out, _, _ = run_child(root, ["-c", RECOMMEND_CHILD, str(repeats)])
    data = json.loads(out)
    return {"median_cpu_s": statistics.median(data["cpu_s"]), "cpu_s": data["cpu_s"],
            "candidates": data["candidates"], "digest": data["digest"][:16]}


def measure_scenarios(root: Path) -> dict[str, object]:
    out, _, _ = run_child(root, ["-c", SCENARIOS_CHILD])
    data = json.loads(out)
    return {"runs": data["runs"], "retractions": data["retractions"], "digest": data["digest"][:16]}


def measure_auto(root: Path, trace: Path) -> dict[str, object]:
    out, _, _ = run_child(root, ["-m", "slipstream.cli", "bench", "--trace", str(trace),
                                 "--trace", str(AUTO_SECOND_TRACE), "--tenant", "chat", "--tenant", "code",
                                 "--policies", "auto", "--speed", "--json"])  # fmt: skip
    data = json.loads(out)
    row = data["speed"]["auto"]
    return {"wall_s": row["wall_s"], "cpu_s": row["cpu_s"], "x_wall": row["x_real_time_simulated"],
            "x_cpu": row["x_real_time_simulated"] * row["wall_s"] / row["cpu_s"],
            "digest": digest(data["policies"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"git ref to compare with (default {DEFAULT_BASE})")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--policy", default="ceiling:4096")
    parser.add_argument("--repeats", type=int, default=5, help="recommendations per tree (median)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="simulate processes per tree, alternating trees (the median by CPU)")
    parser.add_argument("--auto", action="store_true", help="also bench auto (minutes on the base)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args()
    span = trace_span_s(args.trace)
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="twin-speed-") as tmp:
        trees = {"new": ROOT / "operator", "base": export_base(args.base, Path(tmp))}
        runs: dict[str, list[dict[str, object]]] = {label: [] for label in trees}
        for _ in range(args.rounds):  # alternated, so a change in the machine's load hits both
            for label, root in trees.items():
                runs[label].append(measure_simulate(root, args.trace, args.policy, span))
        for label, done in runs.items():  # the median run by CPU time
            results[f"simulate/{label}"] = sorted(done, key=lambda r: float(r["cpu_s"]))[len(done) // 2]
            assert len({r["digest"] for r in done}) == 1, "simulate's outputs differ between runs"
        for label, root in trees.items():
            results[f"recommend/{label}"] = measure_recommend(root, args.repeats)
            results[f"scenarios/{label}"] = measure_scenarios(root)
            if args.auto:
                results[f"auto/{label}"] = measure_auto(root, args.trace)

    def pair(name: str) -> tuple[dict[str, object], dict[str, object], str]:
        new, base = results[f"{name}/new"], results[f"{name}/base"]
        return new, base, "yes" if new["digest"] == base["digest"] else "NO"

    print(f"twin speed, this tree vs {args.base} ({time.strftime('%Y-%m-%d')}, one core each)")
    new, base, same = pair("simulate")
    print(f"simulate {args.trace.name} --policy {args.policy} (whole process, rate fit included, "
          f"median of {args.rounds}): "
          f"{new['x_wall']:.0f}x real time by wall ({new['wall_s']:.2f} s), {new['x_cpu']:.0f}x by CPU; "
          f"base {base['x_wall']:.0f}x ({base['wall_s']:.2f} s), {base['x_cpu']:.0f}x by CPU; "
          f"ratio {float(base['wall_s']) / float(new['wall_s']):.2f}x wall, "
          f"{float(base['cpu_s']) / float(new['cpu_s']):.2f}x CPU; same outputs: {same}")
    new, base, same = pair("recommend")
    print(f"recommend, full candidate set ({new['candidates']} candidates), median of {args.repeats}: "
          f"{new['median_cpu_s']:.3f} s CPU; base {base['median_cpu_s']:.3f} s; "
          f"ratio {float(base['median_cpu_s']) / float(new['median_cpu_s']):.2f}x; same outputs: {same}")
    new, base, same = pair("scenarios")
    print(f"built-in scenarios x 6 policies x 2 pools ({new['runs']} runs, {new['retractions']} "
          f"retractions): same per-request outputs: {same}")
    if args.auto:
        new, base, same = pair("auto")
        print(f"bench --policies auto: {new['x_wall']:.0f}x real time by wall ({new['wall_s']:.1f} s), "
              f"{new['x_cpu']:.0f}x by CPU; base {base['x_wall']:.0f}x ({base['wall_s']:.1f} s); "
              f"ratio {float(base['cpu_s']) / float(new['cpu_s']):.2f}x CPU; same outputs: {same}")
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
