#!/usr/bin/env python3
"""The operator's memory at N deployments, in one process, without a cluster: where it goes.

Runs the operator's own stages for N ServingDeployments as `scripts/bench-scale.py` makes
them (mode Recommend, the same two-tenant traffic): one fleet read through
`stages.fleet_observer` (the real Prometheus client over loopback HTTP, from a child process
that answers the fleet queries with the ~73,000 series N = 500 gives), then every
deployment's tuner run through `loop.observe` and `stages.TwinRecommender` (the twin, 45
candidates each), concurrently as the loops do. Prints the process's RSS and peak RSS
(VmHWM, /proc/self/status) after the imports, the fleet read and the tuner runs.

    .venv/bin/python scripts/bench-memory.py 500                      # the tuner pool (auto)
    .venv/bin/python scripts/bench-memory.py 500 --tuner-threads 32   # 32 runs at once
    .venv/bin/python scripts/bench-memory.py 500 --worker-threads     # before: on the 32 I/O threads
    .venv/bin/python scripts/bench-memory.py 100 --steps 4 --moving 0.1   # reuse vs queued twin runs

The twin costs ~0.8 CPU s per deployment: N = 500 takes ~7 minutes of one core.

``--steps K`` runs K rounds of ``loop.observe`` for all N at once, one control interval
(20 s of the injected clock) apart: round 1 runs the twin for every deployment; in rounds
2..K the workload of every ``1 / --moving``-th deployment moves (its rates x1.5, then back,
beyond a window's noise, so its twin runs again and queues on the tuner pool) and the others'
stays (the memo's reuse). Per round it prints the wall seconds, the twin runs and reuses
(the memo's counters), and each kind of step's latency from the round's start (p50, max):
a reuse step's latency is what a loop waits for a recommendation that needs no twin run.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import re
import sys
import time


def memory() -> str:
    with open("/proc/self/status") as f:
        status = f.read()
    rss, peak = (int(re.search(rf"{k}:\s+(\d+)", status).group(1)) // 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[union-attr]
    return f"RSS {rss} MB, peak {peak} MB"


FIELDS = (("time_to_first", "ttft"), ("uncached_prompt", "uncached"), ("generation_tokens", "output"),
          ("cached_tokens", "tokens"), ("num_queue", "queue"), ("long_prefill", "settings"), ("up", "targets"),
          ("size_class", "mix"))  # fmt: skip
"""A fleet query -> its FleetQueries field, by a word only it contains (in this order)."""


def answers(n: int, window_s: float, at: float) -> dict[tuple[str, str], bytes]:
    """Each fleet query's answer for scalebench's N deployments (its exporter's counters'
    increase over the window, by deployment, tenant and bucket, as Prometheus sums them)."""
    from slipstream import scalebench as sb
    from slipstream.api import buckets

    out: dict[str, list[dict[str, object]]] = {f: [] for _, f in FIELDS}

    def add(field: str, labels: dict[str, str], value: float) -> None:
        out[field].append({"metric": labels, "value": [at, repr(float(value))]})

    for i, (ns, name) in enumerate(sb.deployment_names(n)):
        dep = {"namespace": ns, "servingdeployment": name}
        pod = {**dep, "pod": f"{name}-0"}
        for tenant, rate, ttft, tokens in sb.TENANTS:
            t = {**dep, "tenant": tenant}
            count = rate * (1 + 0.1 * (i % 5)) * window_s
            for field, bounds, mean in (("ttft", buckets.TTFT_BOUNDS_S, ttft), ("uncached", buckets.PROMPT_TOKENS, tokens)):
                for b in bounds:
                    add(field, {**t, "le": str(b), "part": "bucket"}, count * (1 - math.exp(-b / mean)))
                add(field, {**t, "le": "+Inf", "part": "bucket"}, count)
                add(field, {**t, "part": "sum"}, count * mean)
            add("tokens", {**t, "part": "prompt"}, count * tokens * 2)
            add("tokens", {**t, "part": "cached"}, count * tokens)
            add("mix", {**t, "part": "arrivals"}, count)
            for cls in ("le1k", "le8k"):  # the queue mix: two classes with traffic per tenant
                c = {**t, "size_class": cls}
                add("mix", {**c, "part": "first_tokens"}, count / 2)
                add("mix", {**c, "cache": "uncached", "part": "tokens"}, count * tokens / 2)
                add("mix", {**c, "cache": "cached", "part": "tokens"}, count * tokens / 2)
                add("mix", {**c, "part": "queued"}, i % 3)
                add("mix", {**c, "part": "queued_tokens"}, (i % 3) * tokens)
        add("queue", {**dep, "part": "depth"}, i % 4)
        add("queue", {**dep, "part": "newest"}, at)
        add("settings", {**pod, "part": "threshold"}, 4096)
        add("settings", {**pod, "mode": "ceiling", "part": "mode"}, 1)
        add("settings", {**pod, "policy": "fcfs", "part": "policy"}, 1)
        add("targets", {**pod, "part": "up"}, 1)
    from slipstream.observe import queries

    def body(rows: list[dict[str, object]]) -> bytes:
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": rows}}).encode()

    def ends(row: dict[str, object], last: str) -> bool:
        return re.fullmatch(f".*{last}", row["metric"]["servingdeployment"]) is not None  # type: ignore[index]

    # Keyed (field, shard): "" the whole field; a shard only the deployments its matcher
    # takes, as Prometheus answers a sharded query (queries.fleet_reads).
    return {(f, last): body([r for r in rows if not last or ends(r, last)])
            for f, rows in out.items() for last in ("", *queries.SHARDS)}  # fmt: skip


def serve(n: int, window_s: float, at: float, ready: multiprocessing.connection.Connection) -> None:
    """The child process: a Prometheus that answers the fleet queries (its memory is its own)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    bodies = answers(n, window_s, at)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            query = parse_qs(urlparse(self.path).query)["query"][0]
            shard = re.search(r'servingdeployment=~"\.\*(\[[^\]]+\])"', query)
            body = bodies[next(f for word, f in FIELDS if word in query), shard.group(1) if shard else ""]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    whole = [b for (_, shard), b in bodies.items() if not shard]
    ready.send((server.server_address[1], sum(len(json.loads(b)["data"]["result"]) for b in whole)))
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("deployments", type=int)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--tuner-threads", type=int, default=0, help="SLIPSTREAM_TUNER_THREADS (0: auto)")
    group.add_argument("--worker-threads", action="store_true",
                       help="run the tuner on the 32 I/O worker threads, as before the tuner pool")
    parser.add_argument("--reads", type=int, default=1, help="fleet reads, one after another (one per interval)")
    parser.add_argument("--no-tuner", action="store_true", help="stop after the fleet read(s)")
    parser.add_argument("--steps", type=int, default=1, help="rounds of loop.observe for all N (2..K: reuse rounds)")
    parser.add_argument("--moving", type=float, default=0.0,
                        help="share of deployments whose workload moves in each round after the first (0..1)")
    args = parser.parse_args()
    window_s, at = 20.0, time.time()

    context = multiprocessing.get_context("fork")  # before the operator's imports: the child is small
    here, there = context.Pipe()
    child = context.Process(target=serve, args=(args.deployments, window_s, at, there), daemon=True)
    child.start()
    try:
        port, series = here.recv()
        run(args, port, series, window_s, at)
    finally:
        child.terminate()
        child.join(5)


def run(args: argparse.Namespace, port: int, series: int, window_s: float, at: float) -> None:
    import asyncio
    import concurrent.futures
    import dataclasses

    print(f"bare interpreter: {memory()}", flush=True)
    from slipstream import scalebench as sb
    from slipstream.api import models
    from slipstream.controller import handlers, loop, stages  # noqa: F401 - the operator's imports
    from slipstream.controller import settings as settings_

    print(f"operator imported: {memory()}", flush=True)
    from slipstream.controller.runtime import malloc

    config = settings_.ControllerSettings(prometheus_timeout_seconds=120, tuner_threads=args.tuner_threads)
    malloc.configure(config.malloc_arenas, config.malloc_mmap_threshold_bytes)  # as the operator's main does
    url = f"http://127.0.0.1:{port}"
    sds = []
    for ns, name in sb.deployment_names(args.deployments):
        doc = sb.sd_doc(ns, name, url, int(window_s))
        doc["metadata"].update(uid=name, generation=1)
        doc["status"] = {"observedGeneration": 1}
        sds.append(models.ServingDeployment.model_validate(doc))
    fleet = stages.fleet_observer(config)
    tuner = None if args.worker_threads else concurrent.futures.ThreadPoolExecutor(config.tuner_concurrency())

    async def every_loop() -> None:
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(config.worker_threads))
        snaps = await asyncio.gather(*(fleet.snapshot(sd, window_s, at) for sd in sds))
        bad = [s for s in snaps if not s.valid]
        assert not bad, f"{len(bad)} invalid snapshots, e.g. {bad[0].invalid}: {bad[0].detail}"
        print(f"fleet read ({series} series, {fleet.queries_made} queries): {memory()}", flush=True)
        for k in range(1, args.reads):  # later intervals' reads, each on whichever worker thread is free
            await fleet.snapshot(sds[0], window_s, at + k * (fleet.reuse_s + 1))
        if args.reads > 1:
            print(f"{args.reads} fleet reads: {memory()}", flush=True)
        if args.no_tuner:
            return
        deps = loop.Deps(kube=None, config=config, keys=None, observer=fleet,  # type: ignore[arg-type]
                         recommender=stages.TwinRecommender(config), tuner=tuner)  # fmt: skip
        t0 = time.monotonic()
        setting = models.EngineSetting(threshold=4096)
        out = await asyncio.gather(*(loop.observe(deps, sd, setting, at) for sd in sds))
        assert all(rec is not None for _, rec in out)
        how = f"{config.worker_threads} worker threads" if tuner is None else f"a pool of {tuner._max_workers}"
        print(f"{len(out)} tuner runs on {how} ({time.monotonic() - t0:.0f} s): {memory()}", flush=True)
        if args.steps > 1:
            stride = max(1, round(1 / args.moving)) if args.moving > 0 else 0
            moving = {f"{sd.metadata.namespace}/{sd.metadata.name}" for i, sd in enumerate(sds)
                      if stride and i % stride == 0}  # fmt: skip
            rounds = Rounds({s.deployment: s for s, _ in out if s is not None}, moving)
            await steps(dataclasses.replace(deps, observer=rounds), rounds, sds, setting, at, args.steps, window_s)

    asyncio.run(every_loop())
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"numpy", "pandas", "matplotlib", "scipy", "torch"})
    print(f"heavy libraries loaded: {', '.join(heavy) or 'none'}")


class Rounds:
    """The round-1 snapshots again each round, the ``moving`` deployments' rates x1.5 in
    even rounds (then back: each is a move from the snapshot their twin last ran on)."""

    def __init__(self, snaps: dict, moving: set[str]) -> None:  # type: ignore[type-arg]
        self.snaps, self.moving, self.round = snaps, moving, 1

    async def snapshot(self, sd, window_s: float, now: float):  # type: ignore[no-untyped-def]
        import dataclasses

        name = f"{sd.metadata.namespace}/{sd.metadata.name}"
        snap = self.snaps[name]
        if name not in self.moving or self.round % 2:
            return snap
        return dataclasses.replace(snap, tenants=tuple(dataclasses.replace(t, requests_per_s=t.requests_per_s * 1.5)
                                                       for t in snap.tenants))  # fmt: skip


async def timed(deps, sd, setting, now: float, t0: float) -> tuple[str, float]:  # type: ignore[no-untyped-def]
    """One deployment's loop.observe: its name and when it finished (seconds after t0)."""
    from slipstream.controller import loop

    _, rec = await loop.observe(deps, sd, setting, now)
    assert rec is not None
    return f"{sd.metadata.namespace}/{sd.metadata.name}", time.monotonic() - t0


async def steps(deps, rounds: Rounds, sds: list, setting, at: float, k: int, interval_s: float) -> None:  # type: ignore[no-untyped-def, type-arg]
    """Rounds 2..k of loop.observe for every deployment at once, one interval apart; per
    round the wall time, twin runs vs reuses, and each kind of step's latency."""
    import asyncio
    import statistics

    memo = deps.recommender.memo
    assert memo is not None, "--steps needs the memo (SLIPSTREAM_TUNER_REUSE_SECONDS > 0)"

    def spread(xs: list[float]) -> str:
        return f"p50 {statistics.median(xs):.3f} s, max {max(xs):.3f} s" if xs else "none"

    for r in range(2, k + 1):
        rounds.round = r
        now, runs0, reused0 = at + (r - 1) * interval_s, memo.runs, memo.reused
        t0 = time.monotonic()
        done = await asyncio.gather(*(timed(deps, sd, setting, now, t0) for sd in sds))
        wall = time.monotonic() - t0
        reuse = [s for name, s in done if name not in rounds.moving]
        twin = [s for name, s in done if name in rounds.moving]
        print(f"round {r}: {wall:.2f} s wall, {memo.runs - runs0} twin runs, {memo.reused - reused0} reuses; "
              f"reuse steps {spread(reuse)}; moved steps {spread(twin)}", flush=True)


if __name__ == "__main__":
    main()
