"""The ``slipstream`` command: ``simulate`` and ``bench`` (the digital twin), ``run`` (the operator),
``engine-sim`` (a simulated engine pod) and ``load`` (trace replay against engines).

Every error is one line on stderr naming what is wrong (file:line and field for traces
and specs) and exit status 2; nothing is written when a run fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from slipstream.enginesim import flags as enginesim_flags
from slipstream.sim import engine, metrics, policies, profiles, rate, report, spec, traces
from slipstream.sim.workload import Workload

DEFAULT_PROFILE = "kimi-k3-8xh200"
DEFAULT_UTILIZATION = 0.7


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


@dataclass(frozen=True)
class Loaded:
    """A workload ready to run, with where it came from and the settings it implies."""

    workload: Workload
    source_key: str
    source: object
    config: policies.EngineConfig
    profile: profiles.Profile
    is_scenario: bool
    scale_note: str
    """How the rate scale was chosen; printed (stderr) once the run is known to be valid."""


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("workload (one of)")
    src.add_argument("--scenario", help="a built-in scenario: " + ", ".join(spec.builtin_names()))
    src.add_argument("--trace", action="append", default=[], metavar="PATH",
                     help="a Mooncake .jsonl or Azure .csv trace; repeat to merge (one tenant each)")
    src.add_argument("--workload", metavar="SPEC",
                     help="a YAML workload spec, or builtin:NAME")
    p.add_argument("--tenant", action="append", default=[], metavar="NAME",
                   help="tenant name of the matching --trace (default: the file stem)")
    p.add_argument("--profile", help="cost profile name or JSON file (default: the scenario's, "
                   f"else {DEFAULT_PROFILE}); built-in: " + ", ".join(profiles.builtin_names()))
    p.add_argument("--chunked-prefill-size", type=int, metavar="C",
                   help="override the engine's token budget per pass")
    p.add_argument("--cache-tokens", type=int, help="override the prefix-cache capacity (tokens)")
    p.add_argument("--srpt-aging", type=float, metavar="TOKENS_PER_S",
                   help="aging of the srpt order: a request needing R tokens is never overtaken "
                   "by one arriving more than R/TOKENS_PER_S seconds after it (default 1024)")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--rate-scale", type=float, metavar="X",
                       help="make arrivals X times as dense")
    scale.add_argument("--target-utilization", type=float, metavar="U",
                       help="pick the rate scale at which stock keeps the prefill budget U busy "
                       f"(default {DEFAULT_UTILIZATION} for traces)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slipstream", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="run one policy on a workload in the digital twin")
    _add_workload_args(sim)
    sim.add_argument("--policy", required=True,
                     help="stock | ceiling:T | floor:T | sarathi:B | vllm:T | auto, "
                     "optionally /fcfs, /lpm or /srpt")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--plot", metavar="FILE.png",
                     help="scenarios: before (stock) / after timeline; traces: TTFT CDF")
    sim.set_defaults(func=cmd_simulate)

    bench = sub.add_parser("bench", help="every policy on the same workload, side by side")
    _add_workload_args(bench)
    bench.add_argument("--policies", default=",".join(policies.DEFAULT_BENCH),
                       help="comma-separated policy names (default: %(default)s)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--plot", metavar="FILE.png", help="write TTFT CDFs per policy")
    bench.add_argument("--speed", action="store_true",
                       help="print how many times faster than real time each policy simulates")
    bench.set_defaults(func=cmd_bench)

    run = sub.add_parser("run", help="run the operator (kopf) against the current kubeconfig")
    run.add_argument("--namespace", help="watch only this namespace (default: all)")
    run.add_argument("--peering", help="kopf peering object name (default: standalone)")
    run.add_argument("--liveness", help="health endpoint URL, e.g. http://0.0.0.0:8080/healthz")
    run.set_defaults(func=cmd_run)

    esim = sub.add_parser("engine-sim", allow_abbrev=False,
                          help="an HTTP server that behaves like the patched engine, driven by the twin",
                          description="Takes an engine pod's launch_server flags; other "
                          "launch_server flags are accepted and ignored (one stderr line).")
    enginesim_flags.add_arguments(esim)
    esim.set_defaults(func=cmd_engine_sim, takes_unknown=True)

    load = sub.add_parser("load", help="replay traces against OpenAI-compatible servers, "
                          "printing per-tenant TTFT as it goes")
    load.add_argument("--trace", action="append", required=True, metavar="PATH",
                      help="a Mooncake .jsonl or Azure .csv trace; repeat for more tenants")
    load.add_argument("--tenant", action="append", default=[], metavar="NAME",
                      help="tenant of the matching --trace (default: the file stem)")
    load.add_argument("--target", action="append", required=True, metavar="URL",
                      help="base URL of a server, e.g. http://127.0.0.1:30000; repeat to spread")
    load.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                      help="trace seconds per wall second (match the engines' --time-scale)")
    load.add_argument("--rate-scale", type=float, default=1.0, metavar="X",
                      help="make arrivals X times as dense")
    load.add_argument("--duration", type=float, metavar="S",
                      help="stop sending after S wall seconds")
    load.add_argument("--max-requests", type=int, metavar="N", help="send at most N requests")
    load.add_argument("--header", action="append", default=[], metavar="K:V",
                      help="extra HTTP header on every request (repeatable)")
    load.add_argument("--model", default="default", help="model field of the requests")
    load.add_argument("--prompt", choices=("words", "field"), default="words",
                      help="words: a prompt of as many words as the trace's tokens (for real "
                      "servers); field: a one-word prompt, sizes only in the slipstream field")
    load.add_argument("--report-every", type=float, default=5.0, metavar="S",
                      help="wall seconds between per-tenant TTFT lines")
    load.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    load.set_defaults(func=cmd_load)
    return parser


def load_workload(args: argparse.Namespace) -> Loaded:
    chosen = [bool(args.scenario), bool(args.trace), bool(args.workload)]
    if sum(chosen) != 1:
        raise CliError("give exactly one of --scenario NAME, --trace PATH (repeatable), --workload SPEC")
    profile_name = args.profile
    config = policies.EngineConfig()
    is_scenario = False
    if args.trace:
        workload = traces.load_many(args.trace, args.tenant)
        source_key, source = "traces", list(args.trace)
    else:
        loaded = spec.load_builtin(args.scenario) if args.scenario else spec.load(args.workload)
        workload, config = loaded.workload, loaded.engine
        profile_name = profile_name or loaded.profile
        is_scenario = bool(args.scenario)
        source_key, source = ("scenario", args.scenario) if args.scenario else ("workload", args.workload)
    if args.chunked_prefill_size is not None:
        config = replace(config, chunked_prefill_size=args.chunked_prefill_size)
    if args.cache_tokens is not None:
        config = replace(config, cache_tokens=args.cache_tokens)
    if args.srpt_aging is not None:
        if args.srpt_aging <= 0:
            raise CliError("--srpt-aging must be > 0 tokens per second")
        config = replace(config, srpt_aging_tokens_per_s=args.srpt_aging)
    profile = profiles.load(profile_name or DEFAULT_PROFILE)
    target = args.target_utilization
    if args.rate_scale is not None:
        workload = workload.scaled(args.rate_scale)
    elif target is not None or args.trace:
        target = DEFAULT_UTILIZATION if target is None else target
        workload = workload.scaled(rate.scale_for_utilization(workload, profile, config, target))
    if target is not None:
        how = f" (target prefill utilization {target:.2f})"
    elif args.rate_scale is not None:
        how = " (--rate-scale)"
    else:
        how = " (the workload's own clock)"
    note = f"rate scale: {workload.rate_scale:.4g}{how}"
    return Loaded(workload, source_key, source, config, profile, is_scenario, note)


def _run(loaded: Loaded, policy_name: str, record: bool = False, bar: tqdm | None = None
         ) -> engine.SimResult:
    policy = policies.parse(policy_name, loaded.config)
    progress = None
    if bar is not None:
        start = bar.n

        def progress(n: int) -> None:
            bar.update(start + n - bar.n)
    return engine.simulate(loaded.workload, policy, loaded.profile, loaded.config,
                           record_rounds=record, progress=progress)


def _bar(total: int, desc: str) -> tqdm | None:
    if total < 2000:
        return None
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=False,
                disable=not sys.stderr.isatty())


def cmd_simulate(args: argparse.Namespace) -> int:
    loaded = load_workload(args)
    policies.parse(args.policy, loaded.config)  # fail on a bad name before running
    print(loaded.scale_note, file=sys.stderr)
    n = len(loaded.workload.requests)
    bar = _bar(n, args.policy)
    result = _run(loaded, args.policy, record=bool(args.plot and loaded.is_scenario), bar=bar)
    if bar is not None:
        bar.close()
    if args.plot:
        from slipstream.sim import plots

        if loaded.is_scenario:
            before = _run(loaded, "stock", record=True)
            plots.timelines([before, result] if args.policy != "stock" else [before],
                            Path(args.plot), f"{loaded.workload.name}: before / after")
        else:
            plots.ttft_cdfs({args.policy: result}, Path(args.plot), loaded.workload.name)
    if args.json:
        print(json.dumps(report.simulate_json(result, loaded.source_key, loaded.source), indent=1))
    else:
        print(f"{loaded.workload.name} under {result.policy} ({loaded.profile.name}, "
              f"C = {loaded.config.chunked_prefill_size})")
        if n <= 60:
            print(report.requests_table(result))
        print(report.policy_table(result.policy, metrics.summarize(result)))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not names:
        raise CliError("--policies is empty")
    loaded = load_workload(args)
    for name in names:
        policies.parse(name, loaded.config)
    print(loaded.scale_note, file=sys.stderr)
    n = len(loaded.workload.requests)
    bar = _bar(n * len(names), "bench")
    results: dict[str, engine.SimResult] = {}
    walls: dict[str, float] = {}
    for name in names:
        start = time.perf_counter()
        results[name] = _run(loaded, name, bar=bar)
        walls[name] = time.perf_counter() - start
    if bar is not None:
        bar.close()
    summaries = {name: metrics.summarize(r) for name, r in results.items()}
    if args.plot:
        from slipstream.sim import plots

        plots.ttft_cdfs(results, Path(args.plot), f"{loaded.workload.name}: TTFT per policy")
    if args.json:
        out = report.bench_json(loaded.workload.name, loaded.workload.rate_scale, summaries)
        if args.speed:
            out["speed"] = _speed_rows(loaded.workload, walls)
        print(json.dumps(out, indent=1))
        return 0
    print(f"workload {loaded.workload.name}: {n} requests, {len(loaded.workload.tenants)} tenant(s), "
          f"rate scale {loaded.workload.rate_scale:.4g}, profile {loaded.profile.name}, "
          f"C = {loaded.config.chunked_prefill_size}")
    print(report.comparison_table(summaries))
    print(report.column_legend())
    for name, summary in summaries.items():
        print()
        print(report.policy_table(name, summary))
    if args.speed:
        print()
        print("speed (one core): trace span / wall time")
        for name, row in _speed_rows(loaded.workload, walls).items():
            print(f"  {name:24s} wall {row['wall_s']:.2f} s  "
                  f"{row['x_real_time_trace']:.0f}x trace time  "
                  f"{row['x_real_time_simulated']:.0f}x simulated time")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    # Imported here: the twin's commands must not pay for (or need) kopf and kubernetes.
    from slipstream.controller import main as controller

    controller.run(args.namespace, args.peering, args.liveness)
    return 0


def cmd_engine_sim(args: argparse.Namespace) -> int:
    from slipstream.enginesim import server

    return server.main(args, args.unknown)


def cmd_load(args: argparse.Namespace) -> int:
    from slipstream.enginesim import load

    return load.main(args)


def _speed_rows(workload: Workload, walls: dict[str, float]) -> dict[str, dict[str, float]]:
    trace_span = workload.span_s * workload.rate_scale
    return {name: {"wall_s": wall, "x_real_time_trace": trace_span / wall,
                   "x_real_time_simulated": workload.span_s / wall}
            for name, wall in walls.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["engine-sim"]:  # an engine pod's args, with the kubelet's $(VAR) expansion
        argv = enginesim_flags.expand_env(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_unknown", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.unknown = unknown
    try:
        return int(args.func(args))
    except (CliError, ValueError, OSError) as exc:
        print(f"slipstream: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
