"""The ``slipstream`` command: ``simulate`` and ``bench`` (the digital twin), ``recommend`` (the
tuner), ``run`` (the operator), ``engine-sim`` (a simulated engine pod), ``load`` (trace
replay against engines), ``cluster`` (a local control plane) and ``demo`` (the operator
tuning live simulated traffic).

Every error is one line on stderr naming what is wrong (file:line and field for traces
and specs) and exit status 2; nothing is written when a run fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from slipstream import canarycheck
from slipstream.api import models
from slipstream.api.snapshot import WorkloadSnapshot
from slipstream.controller.settings import ControllerSettings
from slipstream.demo import driver, loopbench, soak
from slipstream.enginesim import flags as enginesim_flags
from slipstream.localkube import supervisor
from slipstream.rollout import sequential
from slipstream.sim import (
    engine,
    fleet,
    metrics,
    policies,
    profiles,
    rate,
    report,
    spec,
    traces,
)
from slipstream.sim.admission import MODES
from slipstream.sim.workload import ALIGN_MODES, Workload, align, merge
from slipstream.tune import auto, codec, modelcheck, observed, recommend
from slipstream.tune import deployment as tune_deployment
from slipstream.tune.candidates import TuningSpec, modes_for
from slipstream.tune.guardrails import GuardrailSettings
from slipstream.tune.tuner import TunerSettings

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
    target: float | None = None
    """--target-utilization in effect (None: --rate-scale or the workload's own clock)."""
    stock_busy: float | None = None
    """Stock's busy fraction (decodes included) over the fit's slice samples, when fitted."""
    load: dict[str, object] | None = None
    """The fitted rate scale, how it was fitted and each slice's load (``rate.SliceFit``)."""


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
                   f"else {profiles.DEFAULT_PROFILE}); built-in: " + ", ".join(profiles.builtin_names()))
    p.add_argument("--chunked-prefill-size", type=int, metavar="C",
                   help="override the engine's token budget per pass")
    p.add_argument("--cache-tokens", type=int, help="override the prefix-cache capacity (tokens)")
    p.add_argument("--kv-pool-tokens", type=int,
                   help="override the profile's KV pool (tokens); 0 = no memory limit")
    p.add_argument("--srpt-aging", type=float, metavar="TOKENS_PER_S",
                   help="aging of the srpt order: a request needing R tokens is never overtaken "
                   "by one arriving more than R/TOKENS_PER_S seconds after it (default 1024)")
    p.add_argument("--align", choices=ALIGN_MODES, default="truncate",
                   help="traces of different spans: cut all to the shortest (default) or tile "
                   "the shorter ones to the longest; said on stderr")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--rate-scale", type=float, metavar="X",
                       help="make arrivals X times as dense")
    scale.add_argument("--target-utilization", type=float, metavar="U",
                       help="pick the rate scale at which stock's simulated busy fraction, decodes "
                       f"included, is U (default {DEFAULT_UTILIZATION} for traces) and its KV peak "
                       "stays below the pool, found by running stock on short slices")
    p.add_argument("--utilization-tolerance", type=float, default=rate.UTILIZATION_TOLERANCE,
                   metavar="D", help="how close --target-utilization must come (default %(default)s)")


def _add_tuner_args(p: argparse.ArgumentParser, loop: bool = True) -> None:
    g = p.add_argument_group("the tuner (policy auto, recommend)")
    if loop:
        tuning, rollout = models.Tuning.model_fields, models.Rollout.model_fields
        g.add_argument("--interval", type=float, default=float(tuning["interval_seconds"].default), metavar="S",
                       help="auto: simulated seconds between two tuner decisions (default %(default)g, the CRD's)")
        g.add_argument("--cooldown", type=float, default=float(tuning["cooldown_seconds"].default), metavar="S",
                       help="auto: least simulated seconds from a promotion to the next change "
                       "(default %(default)g, the CRD's)")  # fmt: skip
        g.add_argument("--analysis", type=float, default=float(rollout["analysis_window_seconds"].default),
                       metavar="S", help="auto: simulated seconds a rollout stays in flight before it "
                       "promotes, the tuner holding meanwhile (default %(default)g, the CRD's)")  # fmt: skip
        g.add_argument("--mix-poll", type=float, default=ControllerSettings().mix_poll_seconds, metavar="S",
                       help="auto: simulated seconds between queue-mix polls, a jump stepping before the "
                       "timer (default %(default)g, the operator's; 0: the timer only)")  # fmt: skip
        g.add_argument("--reuse", type=float, default=0.0, metavar="S",
                       help="auto: longest simulated seconds a twin run is reused while the workload "
                       "has not moved (the tuner memo, as the operator's tuner_reuse_seconds, "
                       f"{ControllerSettings().tuner_reuse_seconds:g} there; default %(default)g: the "
                       "twin runs every step)")  # fmt: skip
    g.add_argument("--window", type=float, metavar="S",
                   help="metrics window the tuner sees, simulated seconds (default: the interval, "
                   "as the operator reads; recommend: 300)")
    g.add_argument("--min-concurrency", type=int, default=1, metavar="K",
                   help="fewest concurrent prefills the tuner may choose (off counts as 1)")
    g.add_argument("--max-concurrency", type=int, default=8, metavar="K",
                   help="most concurrent prefills the tuner may choose (default 8)")
    g.add_argument("--ttft-target", type=float, default=2.0, metavar="S",
                   help="p99 TTFT target of every tenant, seconds (default 2)")
    g.add_argument("--orders", default=",".join(policies.ORDERS), metavar="LIST",
                   help="admission orders the tuner may choose, comma-separated (default "
                   "%(default)s, spec.tuning.orders' default; SGLang 0.5.23 adds spf and hrrn)")
    g.add_argument("--engine-mode", choices=MODES, default="ceiling",
                   help="spec.tuning.engineMode: reflex tunes T and the order with the reflex kept "
                   "(auto:T starts on reflex:T), ceiling or floor tune both of those modes "
                   "(default %(default)s)")


def description() -> str:
    """The module docstring's first paragraph as one line, for ``--help``: its first line
    alone stopped mid-sentence."""
    first = (__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(first.split()).replace("``", "")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slipstream", description=description())
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="run one policy on a workload in the digital twin")
    _add_workload_args(sim)
    sim.add_argument("--policy", required=True,
                     help="stock | ceiling:T | floor:T | sarathi:B | vllm:T | sglang-spf | hrrn | auto, "
                     "optionally /fcfs, /lpm or /srpt")
    _add_tuner_args(sim)
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--plot", metavar="FILE.png",
                     help="scenarios: before (stock) / after timeline; traces: TTFT CDF")
    sim.set_defaults(func=cmd_simulate)

    bench = sub.add_parser("bench", help="every policy on the same workload, side by side")
    _add_workload_args(bench)
    bench.add_argument("--policies", default=",".join(policies.DEFAULT_BENCH),
                       help="comma-separated policy names (default: %(default)s)")
    _add_tuner_args(bench)
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--plot", metavar="FILE.png", help="write TTFT CDFs per policy")
    bench.add_argument("--speed", action="store_true",
                       help="print how many times faster than real time each policy simulates")
    _add_fleet_args(bench)
    bench.set_defaults(func=cmd_bench)

    cc = sub.add_parser("canary-check", help="false-rollback and detection rates of the canary rule "
                        "on twin A/A and slow pairs (offline)")
    cc.add_argument("--workload", required=True, metavar="SPEC", help="the fleet's traffic: a YAML "
                    "workload spec, or builtin:NAME")
    cc.add_argument("--policy", default="stock", help="the setting both sides run (default stock)")
    cc.add_argument("--pairs", type=int, default=40, help="pairs of each kind (default 40)")
    cc.add_argument("--pods", type=int, default=2, help="engine pods, one of them the canary (default 2)")
    cc.add_argument("--slow-factor", type=float, default=2.0, help="the slow canary engine's slowdown, every pass (default 2)")
    cc.add_argument("--candidate", default="", metavar="POLICY",
                    help="also run pairs whose canary runs this setting against --policy (how soon it is promoted)")
    cc.add_argument("--sub-window", type=float, default=canarycheck.Check.sub_window_s, metavar="S")
    cc.add_argument("--analysis-window", type=float, default=canarycheck.Check.analysis_window_s, metavar="S",
                    help="when the rule is first asked (default %(default)s)")
    cc.add_argument("--limit", type=float, default=canarycheck.Check.limit_s, metavar="S",
                    help="when the rule must decide (default %(default)s)")
    cc.add_argument("--max-regression-percent", type=float, default=sequential.SequentialRule.tolerance_percent)
    cc.add_argument("--json", action="store_true", help="print one JSON object")
    cc.set_defaults(func=cmd_canary_check)

    rec = sub.add_parser("recommend", help="the tuner's recommendation for one metrics window")
    rec.add_argument("--snapshot", metavar="FILE.json",
                     help="a WorkloadSnapshot as JSON (else: observe a workload in the twin)")
    _add_workload_args(rec)
    _add_tuner_args(rec, loop=False)
    _add_fleet_args(rec)
    rec.add_argument("--under", default="stock", metavar="POLICY",
                     help="workload mode: the policy the window is observed under (default stock)")
    rec.add_argument("--at", type=float, metavar="S",
                     help="workload mode: end of the window, simulated seconds (default: the end)")
    rec.add_argument("--current", default=None, metavar="POLICY",
                     help="the setting the engines run now (default: --under)")
    rec.add_argument("--dump-snapshot", metavar="FILE.json", help="write the snapshot used")
    rec.add_argument("--time", action="store_true", help="print how long the recommendation took")
    rec.add_argument("--json", action="store_true", help="print one JSON object")
    rec.set_defaults(func=cmd_recommend)

    run = sub.add_parser("run", help="run the operator (kopf) against the current kubeconfig")
    run.add_argument("--namespace", action="append", default=[], dest="namespaces",
                     help="watch only this namespace; repeat for several (default: all)")
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
    supervisor.add_parser(sub)
    driver.add_parser(sub)
    loopbench.add_parser(sub)
    soak.add_parser(sub)
    return parser


def load_workload(args: argparse.Namespace) -> Loaded:
    chosen = [bool(args.scenario), bool(args.trace), bool(args.workload)]
    if sum(chosen) != 1:
        raise CliError("give exactly one of --scenario NAME, --trace PATH (repeatable), --workload SPEC")
    profile_name = args.profile
    notes: list[str] = []
    config = policies.EngineConfig()
    is_scenario = False
    if args.trace:
        if args.tenant and len(args.tenant) != len(args.trace):
            raise CliError(f"--tenant given {len(args.tenant)} times for {len(args.trace)} --trace")
        parts = [traces.load(path, args.tenant[k] if args.tenant else None, tenant_index=k + 1)
                 for k, path in enumerate(args.trace)]
        names = [w.name for w in parts]
        if len(set(names)) != len(names):
            raise CliError(f"two traces share the tenant name {names}: name them with --tenant")
        aligned, align_note = align(parts, args.align)
        if align_note:
            notes.append(align_note)
        workload = merge("+".join(names), aligned) if len(parts) > 1 else parts[0]
        source_key, source = "traces", list(args.trace)
        origins = list(zip(args.trace, parts, strict=True))
    else:
        loaded = spec.load_builtin(args.scenario) if args.scenario else spec.load(args.workload)
        workload, config = loaded.workload, loaded.engine
        profile_name = profile_name or loaded.profile
        is_scenario = bool(args.scenario)
        source_key, source = ("scenario", args.scenario) if args.scenario else ("workload", args.workload)
        origins = [(f"builtin:{args.scenario}" if args.scenario else args.workload, workload)]
    config = _engine_flags(args, config, cache=True)
    if args.srpt_aging is not None:
        if args.srpt_aging <= 0:
            raise CliError("--srpt-aging must be > 0 tokens per second")
        config = replace(config, srpt_aging_tokens_per_s=args.srpt_aging)
    profile = profiles.load(profile_name or profiles.DEFAULT_PROFILE)
    for origin, part in origins:
        _check_fits_pool(part, config, profile, origin)
    target = args.target_utilization
    stock_busy = None
    load = None
    if args.rate_scale is not None:
        workload = workload.scaled(args.rate_scale)
        how = " (--rate-scale)"
    elif target is not None or args.trace:
        target = DEFAULT_UTILIZATION if target is None else target
        workload, stock_busy, how, load = _fit_rate(workload, profile, config, target,
                                                    args.utilization_tolerance)
    else:
        how = " (the workload's own clock)"
    notes.append(f"rate scale: {workload.rate_scale:.4g}{how}")
    return Loaded(workload, source_key, source, config, profile, is_scenario, "\n".join(notes),
                  target, stock_busy, load)


def _check_fits_pool(workload: Workload, config: policies.EngineConfig,
                     profile: profiles.Profile, origin: str) -> None:
    """Refuse a prompt longer than the KV pool in use, naming its id: SGLang refuses such a
    request when it arrives, and the twin would only count it ``rejected``."""
    pool = profile.kv_pool_tokens if config.kv_pool_tokens is None else config.kv_pool_tokens
    if not pool:
        return
    longest = max(workload.requests, key=lambda r: r.prompt_tokens)
    if longest.prompt_tokens > pool:
        where = ("the engine's kv_pool_tokens" if config.kv_pool_tokens is not None
                 else f"profile {profile.name}")
        raise CliError(f"{origin}: request {longest.rid!r}: prompt_tokens {longest.prompt_tokens:,} "
                       f"is longer than the KV pool of {pool:,} tokens ({where}), so the engine "
                       "would refuse it: shorten it, or give a larger --kv-pool-tokens "
                       "(0 = no memory limit)")


def _fit_rate(workload: Workload, profile: profiles.Profile, config: policies.EngineConfig,
              target: float, tolerance: float) -> tuple[Workload, float, str, dict[str, object]]:
    """The workload at the scale where stock's busy fraction (decodes included) meets the
    target on slice samples, with the fit's report."""
    start = time.perf_counter()
    try:
        fit = rate.fit_by_slices(workload, profile, config, target, tolerance)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    wall = time.perf_counter() - start
    runs = len(fit.fit.runs)
    how = (f" (target utilization {target:.2f} +- {tolerance:g}: stock's simulated busy fraction "
           f"with decodes {fit.fit.busy:.3f} over slice samples; {fit.method}; {wall:.1f} s)")
    if not fit.fit.converged:
        how += f"; NOT within the tolerance after {runs} sample sets: the closest is used"
    if fit.kv_limited:
        how += "; lowered below the target to keep stock's KV peak below the pool"
    if fit.overload:
        how += "; OVERLOAD: some slices' own offered work exceeds capacity (see load.slices)"
    load = {"rate_scale": fit.scale, "target_utilization": target, "tolerance": tolerance,
            "method": fit.method, "sampled_busy_fraction": fit.fit.busy,
            "fit_steps": [{"rate_scale": x, "sampled_busy_fraction": b} for x, b in fit.fit.runs],
            "converged": fit.fit.converged, "kv_limited": fit.kv_limited,
            "overload": fit.overload, "fit_wall_s": wall,
            "slices": [dataclasses.asdict(s) for s in fit.slices]}
    return workload.scaled(fit.scale), fit.fit.busy, how, load


def tuner_settings_of(args: argparse.Namespace, config: policies.EngineConfig,
                   interval_s: float | None = None, cooldown_s: float | None = None) -> TunerSettings:
    """The tuner's settings from the command line (the spec's fields, as flags)."""
    try:
        orders = tuple(dict.fromkeys(policies.Setting(0, order=o.strip()).order
                                     for o in args.orders.split(",") if o.strip()))
        spec = TuningSpec(config.chunked_prefill_size, config.page_size, args.min_concurrency,
                          args.max_concurrency, args.ttft_target, orders=orders,
                          modes=modes_for(getattr(args, "engine_mode", "ceiling")))
        timing = {k: v for k, v in (("interval_s", interval_s), ("cooldown_s", cooldown_s)) if v is not None}
        guard = GuardrailSettings(**timing)
    except ValueError as exc:
        raise CliError(f"tuner settings: {exc}") from None
    return TunerSettings(spec, guard)


def make_policy(name: str, loaded: Loaded, args: argparse.Namespace
                ) -> tuple[policies.Policy, auto.TwinAuto | None]:
    """A fresh policy; ``auto`` gets a fresh tuner in the loop (its controller)."""
    if name.strip().partition("/")[0].partition(":")[0] != "auto":
        return policies.parse(name, loaded.config), None
    if args.interval <= 0:
        raise CliError("--interval must be > 0 simulated seconds")
    # The operator's loop: its window (one interval), timer, mix polls and analysis window.
    window = args.window if args.window is not None else args.interval
    settings = tuner_settings_of(args, loaded.config, args.interval, args.cooldown)
    try:
        tuner = auto.TwinAuto(settings, loaded.profile, loaded.config, policies.Setting(0, "ceiling", "fcfs"),
                              window, deployment=loaded.workload.name, interval_s=args.interval,
                              analysis_s=args.analysis, mix_poll_s=args.mix_poll,
                              reuse_s=args.reuse)  # fmt: skip
    except ValueError as exc:
        raise CliError(f"tuner settings: {exc}") from None
    # The tuner starts from the setting the name gives (auto:T/ORDER; a reflex with
    # --engine-mode reflex).
    policy = policies.parse(name, loaded.config, controller=tuner, interval_s=tuner.call_s)
    if args.engine_mode == "reflex":
        if not policy.rule.threshold:
            raise CliError(f"{name}: --engine-mode reflex needs a starting T (auto:T), as a reflex spec does")
        policy.apply(replace(auto.start_setting(policy), mode="reflex"))
    tuner.state = replace(tuner.state, current=auto.start_setting(policy))
    policy.controller = tuner
    return policy, tuner


def _run(loaded: Loaded, policy_name: str, args: argparse.Namespace, record: bool = False,
         bar: tqdm | None = None) -> tuple[engine.SimResult, auto.TwinAuto | None]:
    policy, tuner = make_policy(policy_name, loaded, args)
    progress = None
    if bar is not None:
        start = bar.n

        def progress(n: int) -> None:
            bar.update(start + n - bar.n)
    result = engine.simulate(loaded.workload, policy, loaded.profile, loaded.config,
                             record_rounds=record, progress=progress)
    return result, tuner


def _add_fleet_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engines", type=int, default=1, metavar="N",
                   help="a fleet of N engines, each with its own prefix cache, sent N times the "
                   "traffic (each engine at the fitted load); default 1")
    p.add_argument("--routing", default=fleet.DEFAULT_ROUTER, choices=tuple(fleet.ROUTERS),
                   help="how the fleet's router spreads requests (with --engines > 1; default %(default)s)")


def _fleet_parts(loaded: Loaded, args: argparse.Namespace) -> list[Workload] | None:
    """``--engines N``: the workload at N times its rate, split by ``--routing``; None for one engine."""
    n = args.engines
    if n < 1:
        raise CliError(f"--engines must be at least 1, got {n}")
    if n == 1:
        return None
    return fleet.route(loaded.workload.scaled(n), n, args.routing, loaded.profile, loaded.config)


def _run_fleet(loaded: Loaded, parts: list[Workload], policy_name: str, args: argparse.Namespace
               ) -> tuple[engine.SimResult, list[float], auto.TwinAuto | None]:  # fmt: skip
    """One policy on every engine of the fleet (a fresh policy, and tuner, per engine): the
    pooled result, each engine's cache-hit ratio, and engine 0's tuner (whose moves print)."""
    made = [make_policy(policy_name, loaded, args) for _ in parts]
    runs = fleet.simulate_fleet(parts, lambda k: made[k][0], loaded.profile, loaded.config)
    whole = loaded.workload.scaled(len(parts))
    return fleet.merged(whole, runs), fleet.hit_ratios(runs), made[0][1]


def _tuner_json(tuner: auto.TwinAuto) -> dict[str, object]:
    """auto's changes for ``--json``: when, from, to and why (policy names)."""
    memo = tuner.memo
    return {"decisions": len(tuner.decisions), "held": tuner.held(),
            "twin_runs": memo.runs if memo is not None else None,
            "twin_reused": memo.reused if memo is not None else None,
            "changes": [{"at_s": round(at, 3), "from": recommend.policy_name(m.from_),
                         "to": recommend.policy_name(m.to), "reason": m.reason}
                        for at, m in tuner.moves()]}


def _print_moves(name: str, tuner: auto.TwinAuto | None) -> None:
    if tuner is None:
        return
    c = tuner.settings.spec.chunked_prefill_size
    moves = tuner.moves()
    held = ", ".join(f"{reason} {n}" for reason, n in tuner.held().items())
    print(f"{name}: {len(moves)} change(s) in {len(tuner.decisions)} decisions (held: {held or 'none'})")
    for at, move in moves:
        print(f"  t={at:8.1f} s  {recommend.describe(move.from_, c)} -> "
              f"{recommend.describe(move.to, c)}: {move.reason}")


def _bar(total: int, desc: str) -> tqdm | None:
    if total < 2000:
        return None
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=False,
                disable=not sys.stderr.isatty())


def cmd_simulate(args: argparse.Namespace) -> int:
    loaded = load_workload(args)
    make_policy(args.policy, loaded, args)  # fail on a bad name before running
    print(loaded.scale_note, file=sys.stderr)
    n = len(loaded.workload.requests)
    bar = _bar(n, args.policy)
    result, tuner = _run(loaded, args.policy, args, record=bool(args.plot and loaded.is_scenario), bar=bar)
    if bar is not None:
        bar.close()
    if args.plot:
        from slipstream.sim import plots

        if loaded.is_scenario:
            before, _ = _run(loaded, "stock", args, record=True)
            plots.timelines([before, result] if args.policy != "stock" else [before],
                            Path(args.plot), f"{loaded.workload.name}: before / after")
        else:
            plots.ttft_cdfs({args.policy: result}, Path(args.plot), loaded.workload.name)
    if args.json:
        out = report.simulate_json(result, loaded.source_key, loaded.source)
        if tuner is not None:
            out["tuner"] = _tuner_json(tuner)
        if loaded.load is not None:
            out["load"] = loaded.load
        print(json.dumps(out, indent=1))
    else:
        print(f"{loaded.workload.name} under {result.policy} ({loaded.profile.name}, "
              f"C = {loaded.config.chunked_prefill_size})")
        if n <= 60:
            print(report.requests_table(result))
        print(report.policy_table(result.policy, metrics.summarize(result)))
        _print_moves(result.policy, tuner)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not names:
        raise CliError("--policies is empty")
    loaded = load_workload(args)
    for name in names:
        make_policy(name, loaded, args)
    print(loaded.scale_note, file=sys.stderr)
    n = len(loaded.workload.requests)
    bar = _bar(n * len(names), "bench")
    results: dict[str, engine.SimResult] = {}
    walls: dict[str, tuple[float, float]] = {}
    tuners: dict[str, auto.TwinAuto] = {}
    hits: dict[str, list[float]] = {}
    parts = _fleet_parts(loaded, args)
    for name in names:
        start, cpu_start = time.perf_counter(), time.process_time()
        if parts is None:
            results[name], tuner = _run(loaded, name, args, bar=bar)
            hits[name] = fleet.hit_ratios([results[name]])
        else:
            results[name], hits[name], tuner = _run_fleet(loaded, parts, name, args)
        walls[name] = (time.perf_counter() - start, time.process_time() - cpu_start)
        if tuner is not None:
            tuners[name] = tuner
    if bar is not None:
        bar.close()
    summaries = {name: metrics.summarize(r) for name, r in results.items()}
    if args.plot:
        from slipstream.sim import plots

        plots.ttft_cdfs(results, Path(args.plot), f"{loaded.workload.name}: TTFT per policy")
    if args.json:
        out = report.bench_json(loaded.workload.name, loaded.workload.rate_scale, summaries)
        if tuners:
            out["tuner"] = {name: _tuner_json(t) for name, t in tuners.items()}
        out["target_utilization"] = loaded.target
        out["stock_busy_fraction"] = loaded.stock_busy
        if loaded.load is not None:
            out["load"] = loaded.load
        if args.speed:
            out["speed"] = _speed_rows(loaded.workload, walls)
        sizes = [n] if parts is None else [len(p.requests) for p in parts]
        out["fleet"] = {"engines": len(sizes), "routing": args.routing if parts is not None else None,
                        "requests": sizes, "cache_hit_ratio": hits}
        print(json.dumps(out, indent=1))
        return 0
    print(f"workload {loaded.workload.name}: {n} requests, {len(loaded.workload.tenants)} tenant(s), "
          f"rate scale {loaded.workload.rate_scale:.4g}{_load_words(loaded)}, "
          f"profile {loaded.profile.name}, C = {loaded.config.chunked_prefill_size}")
    print(report.comparison_table(summaries))
    print(report.column_legend())
    if parts is None:
        print("\ncache-hit ratio (prompt tokens served from the prefix cache), one engine:")
    else:
        print(f"\nfleet: {len(parts)} engines, routing {args.routing}, {len(parts)}x the traffic "
              f"(requests per engine {', '.join(str(len(p.requests)) for p in parts)}); cache-hit ratio by engine:")
    for name, ratios in hits.items():
        print(f"  {name:24s} " + "  ".join(f"engine-{k} {r:6.1%}" for k, r in enumerate(ratios)))
    for name, summary in summaries.items():
        print()
        print(report.policy_table(name, summary))
        _print_moves(name, tuners.get(name))
    if args.speed:
        print()
        print("speed (one core): trace span / wall time (and / CPU time, which a busy machine "
              "does not inflate)")
        for name, row in _speed_rows(loaded.workload, walls).items():
            print(f"  {name:24s} wall {row['wall_s']:.2f} s  "
                  f"{row['x_real_time_trace']:.0f}x trace time  "
                  f"{row['x_real_time_simulated']:.0f}x simulated time  "
                  f"cpu {row['cpu_s']:.2f} s  {row['x_real_time_trace_cpu']:.0f}x trace time")
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    routed: dict[str, object] | None = None
    if args.snapshot and args.engines != 1:
        raise CliError("--engines routes a workload over a fleet in the twin; a --snapshot is already "
                       "the fleet's window (its pods listed): drop --engines, or give a workload instead")
    if args.snapshot:
        snap, config, profile, current = _snapshot_file(args)
    else:
        loaded = load_workload(args)
        print(loaded.scale_note, file=sys.stderr)
        config, profile = loaded.config, loaded.profile
        parts = _fleet_parts(loaded, args)
        if parts is None:
            snap = observed.simulated(loaded.workload, args.under, profile, config, args.at, args.window or 300.0)
        else:
            snap, hits = observed.simulated_fleet(parts, args.under, profile, config, args.at, args.window or 300.0)
            print(f"fleet: {len(parts)} engines, routing {args.routing}, {len(parts)}x the traffic; cache-hit "
                  f"ratio by engine under {args.under}: "
                  + ", ".join(f"engine-{k} {r:.1%}" for k, r in enumerate(hits)), file=sys.stderr)  # fmt: skip
            routed = {"engines": len(parts), "routing": args.routing, "cache_hit_ratio": hits}
        current = policies.parse(args.current or args.under, config)
    if args.dump_snapshot:
        Path(args.dump_snapshot).write_text(json.dumps(codec.to_dict(snap), indent=1) + "\n")
    if not snap.valid:
        raise CliError(f"snapshot of {snap.deployment} is not usable: {snap.invalid} ({snap.detail})")
    settings = tuner_settings_of(args, config)
    start, cpu_start = time.perf_counter(), time.process_time()
    rec = recommend.recommend(snap, auto.start_setting(current), settings.spec, profile, config,
                              settings.recommender)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if args.json:
        out = _ranking_json(rec)
        if routed is not None:
            out["fleet"] = routed
        if args.time:
            out["elapsed_s"] = elapsed
            out["cpu_s"] = cpu
        print(json.dumps(out, indent=1))
        return 0
    _print_ranking(snap, rec, settings.spec.chunked_prefill_size)
    if args.time:
        print(f"time: {elapsed:.3f} s wall, {cpu:.3f} s CPU for {len(rec.predictions)} candidates "
              "(one core)")
    return 0


def _snapshot_file(args: argparse.Namespace,
                   ) -> tuple[WorkloadSnapshot, policies.EngineConfig, profiles.Profile, policies.Policy]:  # fmt: skip
    """``recommend --snapshot FILE``: the snapshot, the engine config the operator would
    give the twin (the smallest KV pool its pods report, else the profile's, unless
    ``--kv-pool-tokens`` says otherwise), the profile and the current setting."""
    if args.scenario or args.trace or args.workload:
        raise CliError("give --snapshot FILE.json or a workload, not both")
    try:
        snap = codec.from_dict(json.loads(Path(args.snapshot).read_text()))
    except json.JSONDecodeError as exc:
        raise CliError(f"{args.snapshot}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    pool = tune_deployment.twin_pool(snap.kv_pools)
    if snap.kv_pools and pool.note:
        print(pool.note, file=sys.stderr)
    config = _engine_flags(args, policies.EngineConfig(kv_pool_tokens=pool.tokens), cache=False)
    profile = profiles.load(args.profile or profiles.DEFAULT_PROFILE)
    return snap, config, profile, policies.parse(args.current or "stock", config)


def _engine_flags(args: argparse.Namespace, config: policies.EngineConfig, cache: bool) -> policies.EngineConfig:
    """``config`` with the engine flags given on the command line: ``--chunked-prefill-size``,
    ``--kv-pool-tokens`` and (``cache``: where the command has it) ``--cache-tokens``."""
    if args.chunked_prefill_size is not None:
        config = replace(config, chunked_prefill_size=args.chunked_prefill_size)
    if cache and args.cache_tokens is not None:
        config = replace(config, cache_tokens=args.cache_tokens)
    if args.kv_pool_tokens is not None:
        if args.kv_pool_tokens < 0:
            raise CliError("--kv-pool-tokens must be >= 0 (0 = no memory limit)")
        config = replace(config, kv_pool_tokens=args.kv_pool_tokens)
    return config


def _ranking_json(rec: recommend.Ranking) -> dict[str, object]:
    return {"best": recommend.policy_name(rec.best.setting), "feasible": rec.feasible,
            "heterogeneity": rec.heterogeneity, "reason": rec.reason,
            "synthetic_requests": rec.requests, "long_prompt_bound": rec.long_prompt_bound,
            "burst": rec.burst, "fit_error": rec.fit_error, "model": _model_json(rec.model),
            "candidates": {recommend.policy_name(p.setting): _prediction_json(p) for p in rec.predictions},
            "confirmed": {recommend.policy_name(p.setting): _prediction_json(p) for p in rec.confirmed}}


def _model_json(model: modelcheck.ModelCheck | None) -> dict[str, object] | None:
    """The model check (``tune.modelcheck``): whether the twin explains the window."""
    if model is None:
        return None
    return {"agrees": model.agrees, "band": model.band, "rate_factor": model.rate_factor, "runs": model.runs,
            "draws": model.draws, "waiting": model.waiting,
            "tenants": [{"name": t.name, "predicted_p99_ttft_s": t.predicted_s, "observed_p99_ttft_s": t.observed_s,
                         "observed_range_s": [t.observed_low_s, t.observed_high_s], "ratio": t.ratio}
                        for t in model.tenants]}


def _print_ranking(snap: WorkloadSnapshot, rec: recommend.Ranking, c: int) -> None:
    print(f"{snap.deployment}: {snap.requests:.0f} first tokens in {snap.window_s:.0f} s, "
          f"{len(snap.tenants)} tenant(s); {rec.requests} synthetic requests, "
          f"{len(rec.predictions)} candidates; arrivals fitted as bursts of {rec.burst} "
          f"(fit error {rec.fit_error:.2f})")
    if rec.model is not None:
        verdict = "agrees" if rec.model.agrees else f"disagrees: the operator holds ({modelcheck.MODEL_MISMATCH})"
        print(f"model check: {rec.model.describe()}: {verdict}")
    print(f"confirmed on a longer, independent sample ({len(rec.confirmed)} of the "
          f"{len(rec.predictions)} screened; these decide):")
    print(f"{'candidate':22s} {'K':>2s} {'worst p99 slowdown':>18s} {'worst p99 TTFT s':>16s} "
          f"{'longest p99 slowdown':>20s}  ok")
    for p in sorted(rec.confirmed or rec.predictions, key=lambda p: p.objective(rec.objective)):
        ok = "yes" if p.allowed and p.meets_targets and p.within_long_bound else "no"
        print(f"{recommend.policy_name(p.setting):22s} {p.concurrency:2d} {p.worst_tenant_slowdown_p99:18.2f} "
              f"{p.worst_tenant_ttft_p99_s:16.2f} {p.long_prompt_slowdown_p99:20.2f}  {ok}")
    print(f"recommendation: {recommend.describe(rec.best.setting, c)}"
          f"{'' if rec.feasible else ' (best effort: infeasible)'}")
    print(f"reason: {rec.reason}")


def _load_words(loaded: Loaded) -> str:
    if loaded.target is None or loaded.stock_busy is None:
        return ""
    return (f" (target utilization {loaded.target:.2f}, stock's simulated busy fraction with "
            f"decodes {loaded.stock_busy:.3f} over slice samples)")


def _prediction_json(p: recommend.Prediction) -> dict[str, object]:
    return {"concurrency": p.concurrency, "allowed": p.allowed,
            "worst_tenant_slowdown_p99": p.worst_tenant_slowdown_p99,
            "worst_tenant_ttft_p99_s": p.worst_tenant_ttft_p99_s,
            "long_prompt_slowdown_p99": p.long_prompt_slowdown_p99,
            "meets_targets": p.meets_targets, "within_long_bound": p.within_long_bound,
            "tenants": {t.name: {"ttft_p99_s": t.ttft_p99_s, "slowdown_p99": t.slowdown_p99,
                                 "target_s": t.target_s, "attainable": t.attainable} for t in p.tenants}}


def cmd_run(args: argparse.Namespace) -> int:
    # Imported here: the twin's commands must not pay for (or need) kopf and kubernetes.
    from slipstream.controller.runtime import main as controller

    controller.run(args.namespaces, args.peering, args.liveness)
    return 0


def cmd_engine_sim(args: argparse.Namespace) -> int:
    from slipstream.enginesim import server

    return server.main(args, args.unknown)


def cmd_canary_check(args: argparse.Namespace) -> int:
    if args.pairs < 1:
        raise CliError("--pairs must be >= 1")
    if args.slow_factor <= 1:
        raise CliError("--slow-factor must be > 1")
    if args.sub_window <= 0:
        raise CliError("--sub-window must be > 0 seconds")
    loaded = spec.load(args.workload)
    policies.parse(args.policy, loaded.engine)  # a bad name fails before any run
    if args.candidate:
        policies.parse(args.candidate, loaded.engine)
    check = canarycheck.Check(pairs=args.pairs, pods=args.pods, policy=args.policy, slow_factor=args.slow_factor,
                              sub_window_s=args.sub_window, analysis_window_s=args.analysis_window,
                              limit_s=args.limit, candidate=args.candidate)
    rule = sequential.SequentialRule(tolerance_percent=args.max_regression_percent)
    try:
        out = canarycheck.run(loaded.workload, profiles.load(loaded.profile), loaded.engine, check, rule)
    except ValueError as error:
        raise CliError(str(error)) from None
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['workload']} under {args.policy}, {args.pairs} pairs of each kind: "
              f"false_rollback_rate {out['false_rollback_rate']:.3f}, detection_rate {out['detection_rate']:.3f} "
              f"(canary {args.slow_factor:g}x slower); mean decision after {out['mean_decision_s']}"
              + (f"; {args.candidate} promoted in {out['candidate_promote_rate']:.3f}" if args.candidate else ""))
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    from slipstream.enginesim import load

    return load.main(args)


def _speed_rows(workload: Workload, walls: dict[str, tuple[float, float]]
                ) -> dict[str, dict[str, float]]:
    trace_span = workload.span_s * workload.rate_scale
    return {name: {"wall_s": wall, "x_real_time_trace": trace_span / wall,
                   "x_real_time_simulated": workload.span_s / wall,
                   "cpu_s": cpu, "x_real_time_trace_cpu": trace_span / cpu}
            for name, (wall, cpu) in walls.items()}


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
    except (CliError, supervisor.ClusterCommandError, ValueError, OSError) as exc:
        print(f"slipstream: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
