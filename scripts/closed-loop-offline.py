"""The closed-loop test's phases on two twin engines with the operator's tuner, in seconds.

Retunes the demo's phases (slipstream.demo.phases) or the test's constants cheaply
before any cluster run: the phases' requests go round robin to two twin engines (as the
load generator spreads them over the ready pods), and every interval the operator's own
tuner (tune.tuner.tune_once with the operator's guardrails: min samples 50, no dwell)
judges the fleet's last window as Prometheus would show it (tune.observed). A Move starts
on one canary engine at once and on the other one analysis window later (a promotion;
the canary's analysis itself is not modelled), and the engines are re-run with the new
schedule (deterministic, so the past does not change).

    .venv/bin/python scripts/closed-loop-offline.py --offsets 0,14,30
    .venv/bin/python scripts/closed-loop-offline.py --rate-factor 8   # wall-clock rates, before 24201ab
    .venv/bin/python scripts/closed-loop-offline.py --off             # tuning Off: the baseline

``--offset`` is when the operator's interval timer fires relative to the load's start
(it is not aligned with the phases in a cluster). ``--mix-poll S`` polls the queue mix every
S twin seconds between steps, as the operator does (``tune.mixjump``: the uncached tokens of
the window's first tokens and of the requests waiting then, by size class), and steps at
once when it jumped; 0 steps on the timer only. Prints every interval's decision, each
phase's per-tenant p99 TTFT, over the whole phase and after the test's settling time, and
the time from each phase's start to every engine running the setting it ends the phase on.

    .venv/bin/python scripts/closed-loop-offline.py --offsets 0,20,40 --mix-poll 10 --quiet
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from slipstream.api import buckets
from slipstream.api.snapshot import PodSetting, WorkloadSnapshot
from slipstream.demo import loop, phases
from slipstream.sim import engine, policies, profiles
from slipstream.sim.workload import Request, build
from slipstream.tune import candidates, guardrails, mixjump, observed, tuner
from slipstream.tune.recommend import policy_name

STOCK = policies.Setting(0, "ceiling", "fcfs")
Schedule = list[tuple[float, policies.Setting]]


def run_engines(per_engine: Sequence[Sequence[Request]], schedules: Sequence[Schedule],
                profile: profiles.Profile, cfg: policies.EngineConfig) -> list[list[engine.Job]]:
    """Each engine's jobs, its setting changed at the scheduled times."""
    out = []
    for k, requests in enumerate(per_engine):
        pending = sorted(schedules[k], key=lambda x: x[0])

        def control(view: policies.RoundView, pending: Schedule = pending) -> policies.Setting | None:
            got = None
            while pending and pending[0][0] <= view.now_s:
                got = pending.pop(0)[1]
            return got

        policy = policies.parse("stock", cfg, controller=control, interval_s=1.0)
        out.append(list(engine.simulate(build(f"engine-{k}", list(requests)), policy, profile, cfg).jobs))
    return out


def first_tokens(jobs: Sequence[Sequence[engine.Job]]) -> list[policies.FirstToken]:
    return sorted((policies.FirstToken(j.req.tenant, j.arrival_s, j.first_token_s, j.req.prompt_tokens, j.uncached,
                                       j.req.output_tokens)
                   for js in jobs for j in js if j.first_token_s >= 0), key=lambda f: f.first_token_s)  # fmt: skip


def mix_at(jobs: Sequence[Sequence[engine.Job]], now: float, window_s: float) -> mixjump.Mix | None:
    """The queue mix the engines' size-class series would show at ``now``: the uncached
    tokens of the window's first tokens plus those of the requests waiting at ``now``."""
    work: dict[str, float] = {}
    requests = 0
    for js in jobs:
        for j in js:
            done = now - window_s < j.first_token_s <= now
            waiting = j.arrival_s <= now and not 0 <= j.first_token_s <= now
            if done or waiting:
                tokens = float(j.uncached if j.uncached > 0 else j.req.prompt_tokens)
                name = buckets.size_class(tokens)
                work[name] = work.get(name, 0.0) + tokens
                requests += 1
    return mixjump.shares(work, requests)


def settled_after(schedules: Sequence[Schedule], start: float, end: float) -> float:
    """Seconds from ``start`` to the last change of any engine's setting before ``end``
    (0: none changed in the span): when every engine runs the setting it ends the span on."""
    changes = [t for schedule in schedules for t, _ in schedule if start <= t < end]
    return max(changes, default=start) - start


def as_prometheus_reads(snap: WorkloadSnapshot, replicas: int, rate_factor: float) -> WorkloadSnapshot:
    """The fleet's snapshot with its pods listed (the twin divides rates by them), rates
    multiplied by ``rate_factor`` (8: what the operator saw of a x8 stack before it divided)."""
    snap = replace(snap, pods=tuple(PodSetting(f"pod-{k}", 0, "ceiling", "fcfs") for k in range(replicas)))
    if rate_factor == 1 or not snap.valid:
        return snap
    tenants = tuple(replace(t, requests_per_s=t.requests_per_s * rate_factor) for t in snap.tenants)
    return replace(snap, tenants=tenants, window_s=snap.window_s / rate_factor)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=720.0, help="twin seconds per phase (default %(default)s)")
    ap.add_argument("--offsets", default="17", help="interval timer offsets, twin s, comma-separated")
    ap.add_argument("--interval", type=float, default=60.0)
    ap.add_argument("--cooldown", type=float, default=180.0)
    ap.add_argument("--analysis", type=float, default=120.0)
    ap.add_argument("--max-concurrency", type=int, default=2)
    ap.add_argument("--rate-factor", type=float, default=1.0)
    ap.add_argument("--settle", type=float, default=332.0, help="twin s into a phase the test judges from")
    ap.add_argument("--mix-poll", type=float, default=0.0,
                    help="twin s between queue-mix polls (step early on a jump); 0: the timer only")
    ap.add_argument("--off", action="store_true", help="never move: tuning Off")
    ap.add_argument("--quiet", action="store_true", help="print only the moves and the figures")
    args = ap.parse_args()

    replicas = 2
    profile = profiles.load(phases.PROFILE)
    cfg = policies.EngineConfig(chunked_prefill_size=8192, page_size=1)
    spec = candidates.TuningSpec(8192, 1, 1, args.max_concurrency, 2.0)
    settings = tuner.TunerSettings(spec, guardrails.GuardrailSettings(
        min_samples=50, cooldown_s=args.cooldown, interval_s=args.interval * 0.9, dwell_cooldowns=0))
    workload, spans = phases.plan(args.phase_s, replicas=replicas)
    per_engine = [[r for i, r in enumerate(workload.requests) if i % replicas == k] for k in range(replicas)]
    arrivals = {r.rid: r.arrival_s for r in workload.requests}

    for offset in (float(o) for o in args.offsets.split(",")):
        print(f"== interval timer at {offset:g} s")
        schedules: list[Schedule] = [[] for _ in range(replicas)]
        state = guardrails.TunerState(STOCK)
        rollout_until, now = -1.0, offset
        watch = mixjump.MixWatch()
        jobs = run_engines(per_engine, schedules, profile, cfg)
        while now < spans[-1].end_s:
            snap = observed.snapshot_of("sd", first_tokens(jobs), now, args.interval)
            snap = as_prometheus_reads(snap, replicas, args.rate_factor)
            decision = tuner.tune_once(snap, replace(state, rollout_in_progress=now < rollout_until),
                                       settings, profile, cfg, now)  # fmt: skip
            phase = next((p.name for p in spans if p.holds(now)), "?")
            if isinstance(decision, guardrails.Move) and not args.off:
                print(f"{now:7.0f} [{phase}] Move {policy_name(decision.from_)} -> {policy_name(decision.to)}: "
                      f"{decision.reason}")  # fmt: skip
                schedules[0].append((now, decision.to))
                for k in range(1, replicas):
                    schedules[k].append((now + args.analysis, decision.to))
                rollout_until = now + args.analysis
                state = state.stepped(decision.to, now)
                jobs = run_engines(per_engine, schedules, profile, cfg)
            elif not args.quiet:
                print(f"{now:7.0f} [{phase}] {decision.reason}: {getattr(decision, 'message', '')[:160]}")
            watch = watch.stepped(mix_at(jobs, now, args.interval))
            step_at, poll = now + args.interval, now + args.mix_poll
            while args.mix_poll > 0 and poll < step_at:
                if poll < rollout_until:  # a rollout in flight: the operator steps every few s anyway
                    poll += args.mix_poll
                    continue
                watch, fired = watch.see(mix_at(jobs, poll, args.interval))
                if fired:
                    print(f"{poll:7.0f} queue mix jumped: stepping {step_at - poll:.0f} s before the timer")
                    step_at = poll
                poll += args.mix_poll
            now = step_at
        results = [loop.Result(j.req.tenant, j.rid, arrivals[j.rid], j.first_token_s - j.arrival_s, j.first_token_s >= 0)
                   for js in jobs for j in js]  # fmt: skip
        for p in spans:
            settled = loop.tenant_p99(results, p.start_s + args.settle, p.end_s)
            whole = loop.tenant_p99(results, p.start_s, p.end_s)
            print(f"{p.name:16s} p99 TTFT from {args.settle:.0f} s: "
                  + " ".join(f"{t} {v:.2f}" for t, v in settled.items())
                  + " | whole phase: " + " ".join(f"{t} {v:.2f}" for t, v in whole.items())
                  + f" | on its final setting {settled_after(schedules, p.start_s, p.end_s):.0f} s in")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
