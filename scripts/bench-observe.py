"""Measure one observation of N ServingDeployments against a real Prometheus.

Usage: .venv/bin/python scripts/bench-observe.py [N ...]     (default: 10 100 500)

For each N: one exporter on 127.0.0.1 serves the engine metrics of N deployments (one pod
each, two tenants, SGLang's names and buckets; the deployment labels come from the exporter,
scraped with honor_labels), a Prometheus 2.42 scrapes it every 10 s, and after two scrapes
with traffic the observer reads every deployment five times. Prints one JSON line per N:
queries per read (must not grow with N), wall seconds per read (median), the CPU seconds
of this process per read (parsing and assembly), each query's wall time once, and how many
snapshots came out valid.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from slipstream.engine import metrics
from slipstream.localkube import ports
from slipstream.localkube import prometheus as localprom
from slipstream.observe import Observer, ObserveSettings
from slipstream.observe import queries as queries_mod
from slipstream.observe.client import PromClient

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000,
                 10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000,
                 60000, 80000, 100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000)
TENANTS = ("chat", "batch")
SCRAPE_S = 10.0
"""Python's exposition of 500 deployments (~67,000 series) takes seconds per scrape."""
READS = 5


def fleet_exporter(n: int) -> tuple[object, dict]:
    registry = CollectorRegistry()
    dep = ["namespace", "servingdeployment", "pod"]
    fam = {
        "ttft": Histogram(metrics.TTFT_SECONDS, "TTFT", [*dep, "tenant"], buckets=TTFT_BUCKETS, registry=registry),
        "uncached": Histogram(metrics.UNCACHED_PROMPT_TOKENS, "uncached", [*dep, "tenant"],
                              buckets=TOKEN_BUCKETS, registry=registry),
        "prompt": Counter(metrics.PROMPT_TOKENS_TOTAL, "prompt", [*dep, "tenant"], registry=registry),
        "cached": Counter(metrics.CACHED_TOKENS_TOTAL, "cached", [*dep, "tenant"], registry=registry),
        "queue": Gauge(metrics.NUM_QUEUE_REQS, "queue", dep, registry=registry),
        "threshold": Gauge(metrics.LONG_PREFILL_TOKEN_THRESHOLD, "T", dep, registry=registry),
        "mode": Gauge(metrics.LONG_PREFILL_MODE, "mode", [*dep, "mode"], registry=registry),
        "policy": Gauge(metrics.SCHEDULE_POLICY, "policy", [*dep, "policy"], registry=registry),
    }
    for d in range(n):
        labels = {"namespace": f"ns-{d % 10}", "servingdeployment": f"sd-{d}", "pod": f"sd-{d}-0"}
        fam["queue"].labels(**labels).set(d % 5)
        fam["threshold"].labels(**labels).set(2048)
        fam["mode"].labels(**labels, mode="ceiling").set(1)
        fam["policy"].labels(**labels, policy="fcfs").set(1)
        for t in TENANTS:
            for name in ("ttft", "uncached", "prompt", "cached"):
                fam[name].labels(**labels, tenant=t)
    port = ports.free_ports(1)[0]
    server, _ = start_http_server(port, addr=ports.LOOPBACK, registry=registry)
    return server, {"fam": fam, "port": port}


def traffic(n: int, fam: dict, rounds: int) -> None:
    for d in range(n):
        labels = {"namespace": f"ns-{d % 10}", "servingdeployment": f"sd-{d}", "pod": f"sd-{d}-0"}
        for t in TENANTS:
            for i in range(rounds):
                fam["ttft"].labels(**labels, tenant=t).observe(0.3 + i * 0.05)
                fam["uncached"].labels(**labels, tenant=t).observe(2000 + 100 * i)
                fam["prompt"].labels(**labels, tenant=t).inc(4000)
                fam["cached"].labels(**labels, tenant=t).inc(2000)


def bench(n: int) -> dict:
    server, ex = fleet_exporter(n)
    with tempfile.TemporaryDirectory() as tmp:
        target = localprom.StaticTarget(f"{ports.LOOPBACK}:{ex['port']}", honor_labels=True)
        prom = localprom.PrometheusServer.start(Path(tmp), static=[target], scrape_interval_s=SCRAPE_S)
        try:
            prom.wait_for_targets(1, deadline_s=120)
            client = PromClient(prom.url)
            count = 'count({__name__=~"sglang.time_to_first_token_seconds_count"})'
            deadline = time.monotonic() + 120
            while [s.value for s in client.query(count, time.time())] != [2.0 * n]:
                assert time.monotonic() < deadline, "series not scraped"
                time.sleep(0.5)
            traffic(n, ex["fam"], rounds=10)
            time.sleep(2 * SCRAPE_S + 0.5)  # two scrapes with the traffic (a benchmark, not a test)
            traffic(n, ex["fam"], rounds=10)
            time.sleep(2 * SCRAPE_S + 0.5)
            observer = Observer(prom.url, ObserveSettings(window_s=120, min_samples=20, max_staleness_s=30))
            names = [f"ns-{d % 10}/sd-{d}" for d in range(n)]
            walls, cpus, queries, valid = [], [], [], 0
            for _ in range(READS):
                q0, r0, t0 = observer.queries_made, resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
                got = observer.read(names)
                walls.append(time.monotonic() - t0)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                cpus.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
                queries.append(observer.queries_made - q0)
                valid = sum(s.valid for s in got.values())
            per_query = {}
            for name, promql in queries_mod.fleet_reads(120):  # a sharded field: its parts summed
                t0 = time.monotonic()
                client.query(promql, time.time())
                per_query[name] = round(per_query.get(name, 0.0) + time.monotonic() - t0, 3)
            return {"deployments": n, "queries_per_read": sorted(set(queries)),
                    "query_wall_s": per_query,
                    "read_wall_s_median": round(statistics.median(walls), 3),
                    "read_cpu_s_median": round(statistics.median(cpus), 3),
                    "valid": valid,
                    "series": int(client.query('count({__name__=~".+"})', time.time())[0].value)}
        finally:
            prom.stop()
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [10, 100, 500]:
        print(json.dumps(bench(n)), flush=True)
