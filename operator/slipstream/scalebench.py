"""The scale benchmark: N ServingDeployments on the local control plane, the operator measured.

What runs (all on loopback, all stopped at the end, even on Ctrl-C or an error):

- the control plane (``localkube.Cluster``: etcd, apiserver, controller manager, scheduler,
  kwok with N/8 + 1 simulated 8-GPU nodes): each ServingDeployment's engine Deployment gets
  a real ReplicaSet and one one-GPU kwok pod, Running and Ready, that runs nothing;
- a real Prometheus (``localkube.prometheus``) scraping one exporter, ``FleetExporter``, that
  serves SGLang's engine metrics for all N deployments at once (labels ``namespace``,
  ``servingdeployment``, ``pod`` kept with honor_labels, as ``scripts/bench-observe.py``
  does), so every tuning loop gets a valid snapshot and its tuner runs. N engine simulators
  (one Python process each) do not fit a two-core machine; the engine pods' admin ports
  answer nothing, so each step's engine read fails fast and no rollout starts (mode
  Recommend): what is measured is the operator's control-plane side;
- the chart installed with helm and the operator as a process with the chart
  ServiceAccount's token (``localkube.stack``), so its CPU and peak RSS are read from /proc.

Figures (``Figures``): seconds from ``kubectl create`` of N ServingDeployments to all having
``status.observedGeneration == metadata.generation``; then, over whole tuning intervals, the
Prometheus queries (Prometheus's own ``prometheus_http_requests_total``), the apiserver's
requests by verb (``apiserver_request_total`` deltas, the cluster's background included and
also measured alone before the apply), the operator's CPU seconds, its tuning steps, the
tuner's twin runs with their wall and CPU seconds and its reuses (the operator's
``slipstream_tuner_*`` metrics), and its peak RSS (``VmHWM``); and over the apply phase
(from the create to every loop stepped once), the apiserver's GETs by resource and the
drift watch's events judged and skipped (``slipstream_drift_events_*``).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils import parse_quantity
from prometheus_client.parser import text_string_to_metric_families

from slipstream.api import buckets
from slipstream.controller import settings as controller_settings
from slipstream.engine import metrics as names
from slipstream.localkube import cluster as cluster_mod
from slipstream.localkube import nodes, ports
from slipstream.localkube import prometheus as localprom
from slipstream.localkube import stack as stack_mod

API = "/apis/serving.slipstream.dev/v1alpha1/servingdeployments"
NAMESPACES = 10
"""Deployments are spread over this many namespaces (scale-0 ... scale-9)."""
TENANT_STREAMS = (("chat", 10.0, 0.35, 1500.0), ("batch", 5.0, 2.5, 24000.0))
"""(tenant, requests/s, mean TTFT s, mean uncached prompt tokens): a mixed fleet, so the
tuner has a heterogeneous mix to recommend for."""


@dataclass(frozen=True)
class Options:
    deployments: int = 500
    interval_s: int = 20
    """spec.tuning.intervalSeconds (the operator runs with time scale 1)."""
    intervals: int = 3
    """Whole tuning intervals measured once every deployment is reconciled and stepping."""
    scrape_s: float = 5.0
    background: bool = True
    """Measure the cluster's own apiserver requests for one interval before the apply."""
    warmup_intervals: int = 1
    """Intervals waited once every loop has valid metrics, before measuring."""
    reconcile_deadline_s: float = 900.0
    operator_env: dict[str, str] = field(default_factory=dict)
    progress: Callable[[str], None] = print


@dataclass
class Figures:
    deployments: int
    reconcile_s: float
    """From `kubectl create` to all reconciled (observedGeneration == generation)."""
    first_step_s: float | None
    """From `kubectl create` to every deployment's MetricsAvailable=True (every tuning loop
    has stepped once on valid metrics; its twin run may still be queued, `TwinQueued`);
    None: not within the deadline."""
    interval_s: float
    intervals: int
    measured_s: float
    prometheus_queries_per_interval: float
    apiserver_requests_per_interval: dict[str, float]
    """By verb, every client together (the operator and the cluster's own)."""
    apiserver_background_per_interval: dict[str, float]
    """By verb, before the apply: the cluster's own controllers and kwok, the operator idle."""
    apiserver_by_resource_per_interval: dict[str, float]
    operator_cpu_s_per_interval: float
    operator_peak_rss_mb: float
    """VmHWM in MB (10^6 bytes): the unit of the issue's target (< 200 MB)."""
    operator_peak_rss_mib: float
    """The same in MiB (2^20 bytes), as /proc reports it (VmHWM is in KiB)."""
    tuning_steps_per_interval: float
    longest_without_step_s: float
    """The longest any loop went without finishing a step over the measured intervals
    (`slipstream_tuning_last_step_timestamp_seconds`, read every `scrape_s`; a loop with
    no step yet counts from the measurement's start): at most two intervals means every
    loop kept stepping."""
    tuner_runs_per_interval: float
    """Twin runs (`slipstream_tuner_seconds`: reuses and holds are not counted)."""
    tuner_wall_s_per_interval: float
    tuner_cpu_s_per_interval: float
    tuner_cpu_s_per_run: float
    """CPU seconds of one twin run (a decision the memo could not answer): the tuner's CPU
    over its runs in the measured intervals; 0 when none ran."""
    metrics_available: int
    """Deployments whose MetricsAvailable condition is True at the end."""
    recommended: int
    """Deployments with status.recommendation at the end."""
    tuner_reuses_per_interval: float = 0.0
    """Recommendations reused without a twin run (`slipstream_tuner_reuses_total`)."""
    steps_total: float = 0.0
    """Tuning steps since the operator started, at the end of the measured intervals."""
    tuner_calls_total: float = 0.0
    """Twin runs and reuses since the operator started, at the same moment: a step makes
    at most one, but a run a step queued (`TwinQueued`) may finish in a later interval, so
    only the totals compare call for step."""
    apply_s: float = 0.0
    """The apply phase: from `kubectl create` to every loop stepped once (or its deadline)."""
    apply_apiserver_gets: dict[str, float] = field(default_factory=dict)
    """GETs during the apply phase by resource, every client together."""
    apply_drift_events: dict[str, float] = field(default_factory=dict)
    """Events of owned Deployments and Services during the apply phase the drift watch
    judged (each up to two GETs) and skipped (none: `controller/watch/judged.py`)."""
    drift_events_per_interval: dict[str, float] = field(default_factory=dict)
    """The same over the measured intervals."""
    tuner_threads: int = 0
    """The operator's tuner threads (`SLIPSTREAM_TUNER_THREADS`): as the chart's pod resolves
    them from its CPU limit (`chart_tuner_threads`) unless the run's environment sets them."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)


def chart_tuner_threads(values: Path = stack_mod.REPO_CHART / "values.yaml") -> int:
    """The tuner threads the operator resolves in the chart's pod: its CPU limit rounded up,
    at most 4 (`ControllerSettings.tuner_concurrency`, which reads the limit from the pod's
    cgroup). The benchmark's operator is a process of this machine with no such limit, and
    would resolve this machine's cores instead: more twin runs at once than in a cluster."""
    limits = ((yaml.safe_load(values.read_text()) or {}).get("resources") or {}).get("limits") or {}
    period = 100_000
    # No limit in the chart: the pod may use the node's cores (no quota, as cgroups write it).
    cpu_max = f"{round(parse_quantity(limits['cpu']) * period)} {period}" if limits.get("cpu") else None
    return min(4, controller_settings.usable_cpus(len(os.sched_getaffinity(0)), cpu_max))


# -- the engines' metrics, all deployments in one exporter ------------------------------


def deployment_names(n: int) -> list[tuple[str, str]]:
    return [(f"scale-{i % NAMESPACES}", f"sd-{i:04d}") for i in range(n)]


def _cumulative(bounds: tuple[float, ...], mean: float, count: int) -> list[int]:
    """Bucket counts of an exponential distribution of this mean (deterministic)."""
    return [int(count * (1 - math.exp(-b / mean))) for b in bounds]


class FleetExporter:
    """SGLang's engine metrics of N deployments (one pod each) at one loopback address.

    Counters grow at fixed rates from the exporter's start, so every window's increase is
    the same traffic mix; each deployment's rates differ a little (i % 5) so no two
    snapshots are alike. Rendered as Prometheus text, at most once per second.
    """

    def __init__(self, deployments: list[tuple[str, str]]) -> None:
        self.deployments = deployments
        self.t0 = time.time()
        self._text = b""
        self._rendered_at = -math.inf
        self._lock = threading.Lock()
        exporter = self

        class FakeApiHandler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = exporter.text()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.port = ports.free_ports(1)[0]
        self.server = ThreadingHTTPServer((ports.LOOPBACK, self.port), FakeApiHandler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="fleet-exporter", daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"{ports.LOOPBACK}:{self.port}"

    def text(self) -> bytes:
        with self._lock:
            now = time.time()
            if now - self._rendered_at >= 1.0:
                self._text, self._rendered_at = self.render(now - self.t0), now
            return self._text

    def render(self, elapsed_s: float) -> bytes:
        out: list[str] = []
        histos = ((names.TTFT_SECONDS, buckets.TTFT_BOUNDS_S, 2), (names.UNCACHED_PROMPT_TOKENS, buckets.PROMPT_TOKENS, 3))
        for metric, kind in ((names.TTFT_SECONDS, "histogram"), (names.UNCACHED_PROMPT_TOKENS, "histogram"),
                             (names.PROMPT_TOKENS_TOTAL, "counter"), (names.CACHED_TOKENS_TOTAL, "counter"),
                             (names.NUM_QUEUE_REQS, "gauge"), (names.LONG_PREFILL_TOKEN_THRESHOLD, "gauge"),
                             (names.LONG_PREFILL_MODE, "gauge"), (names.SCHEDULE_POLICY, "gauge")):  # fmt: skip
            out.append(f"# TYPE {metric} {kind}")
        for i, (ns, sd) in enumerate(self.deployments):
            pod = f'namespace="{ns}",servingdeployment="{sd}",pod="{sd}-0"'
            for tenant, rate, ttft, tokens in TENANT_STREAMS:
                labels = f'{pod},tenant="{tenant}"'
                count = int(rate * (1 + 0.1 * (i % 5)) * elapsed_s)
                for metric, bounds, which in histos:
                    mean = ttft if which == 2 else tokens
                    for b, c in zip(bounds, _cumulative(bounds, mean, count), strict=True):
                        out.append(f'{metric}_bucket{{{labels},le="{b}"}} {c}')
                    out.append(f'{metric}_bucket{{{labels},le="+Inf"}} {count}')
                    out.append(f"{metric}_sum{{{labels}}} {count * mean:.3f}")
                    out.append(f"{metric}_count{{{labels}}} {count}")
                out.append(f"{names.PROMPT_TOKENS_TOTAL}{{{labels}}} {count * tokens * 2:.0f}")
                out.append(f"{names.CACHED_TOKENS_TOTAL}{{{labels}}} {count * tokens:.0f}")
            out.append(f"{names.NUM_QUEUE_REQS}{{{pod}}} {i % 4}")
            out.append(f"{names.LONG_PREFILL_TOKEN_THRESHOLD}{{{pod}}} 4096")
            out.append(f'{names.LONG_PREFILL_MODE}{{{pod},mode="ceiling"}} 1')
            out.append(f'{names.SCHEDULE_POLICY}{{{pod},policy="fcfs"}} 1')
        return ("\n".join(out) + "\n").encode()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


# -- reading the figures ------------------------------------------------------------------


def http_text(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read().decode()


def samples(text: str, metric: str) -> Iterator[tuple[dict[str, str], float]]:
    """(labels, value) of every sample named ``metric`` in Prometheus text."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric:
                yield s.labels, s.value


def apiserver_requests(cluster: cluster_mod.Cluster) -> dict[tuple[str, str], float]:
    """apiserver_request_total summed by (verb, resource); resource requests only."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    out: dict[tuple[str, str], float] = defaultdict(float)
    for labels, value in samples(text, "apiserver_request_total"):
        if labels.get("resource"):
            sub = labels.get("subresource")
            out[(labels["verb"], labels["resource"] + (f"/{sub}" if sub else ""))] += value
    return out


def prometheus_queries(url: str) -> float:
    text = http_text(f"{url}/metrics")
    return sum(v for labels, v in samples(text, "prometheus_http_requests_total")
               if labels.get("handler") in ("/api/v1/query", "/api/v1/query_range"))  # fmt: skip


def operator_metrics(url: str) -> dict[str, float]:
    text = http_text(url)
    wanted = ("slipstream_tuning_step_seconds_count", "slipstream_tuner_seconds_count",
              "slipstream_tuner_seconds_sum", "slipstream_tuner_cpu_seconds_total",
              "slipstream_tuner_reuses_total", "slipstream_drift_events_judged_total",
              "slipstream_drift_events_skipped_total")  # fmt: skip
    out = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


def longest_without_step(url: str, deployments: int) -> float:
    """The most seconds since any loop last finished a step, now (the operator's
    `slipstream_tuning_last_step_timestamp_seconds`); inf while fewer than ``deployments``
    loops have stepped at all."""
    now = time.time()
    stamps = [s.value for family in text_string_to_metric_families(http_text(url)) for s in family.samples
              if s.name == "slipstream_tuning_last_step_timestamp_seconds"]  # fmt: skip
    if len(stamps) < deployments:
        return math.inf
    return max((now - t for t in stamps), default=0.0)


def drift_events(before: dict[str, float], after: dict[str, float], per: float) -> dict[str, float]:
    """The drift watch's judged and skipped events between two reads of the operator's metrics."""
    return {k: round((after[f"slipstream_drift_events_{k}_total"] - before[f"slipstream_drift_events_{k}_total"]) / per, 1)
            for k in ("judged", "skipped")}  # fmt: skip


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KiB as /proc gives it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def peak_rss(pid: int) -> str:
    """VmHWM in both units: "201.3 MiB = 211.1 MB"."""
    kib = peak_rss_kib(pid)
    return f"{kib / 1024:.1f} MiB = {kib * 1024 / 1e6:.1f} MB"


def by_verb(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], per: float) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for key, value in after.items():
        out[key[0]] += value - before.get(key, 0.0)
    return {k: round(v / per, 1) for k, v in sorted(out.items()) if v}


def by_resource(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], per: float) -> dict[str, float]:
    deltas = {f"{v} {r}": after[(v, r)] - before.get((v, r), 0.0) for v, r in after}
    top = sorted(((k, d) for k, d in deltas.items() if d), key=lambda kv: -kv[1])[:12]
    return {k: round(d / per, 1) for k, d in top}


# -- the run ------------------------------------------------------------------------------


def sd_doc(ns: str, name: str, prometheus_url: str, interval_s: int) -> dict[str, Any]:
    return {
        "apiVersion": "serving.slipstream.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "engine": {"image": "engine:1", "model": "org/model", "chunkedPrefillSize": 8192, "pageSize": 64},
            "tuning": {"mode": "Recommend", "threshold": 4096, "intervalSeconds": interval_s,
                       "cooldownSeconds": 0},
            "prometheus": {"url": prometheus_url},
        },
    }  # fmt: skip


def valid_read(condition: dict[str, Any]) -> bool:
    """A MetricsAvailable condition whose loop read valid metrics: True, or False only because
    the twin does not explain them (``ModelMismatch``): the exporter's TTFTs are synthetic
    figures no engine produced, so the tuner rightly holds, having read and judged them."""
    return condition.get("status") == "True" or condition.get("reason") == "ModelMismatch"


def reconciled_count(cluster: cluster_mod.Cluster) -> tuple[int, int, int]:
    """(reconciled, metrics read valid, with a recommendation) over every ServingDeployment."""
    items = cluster.reader.get_json(API, timeout_s=60.0).get("items", [])
    done = avail = rec = 0
    for sd in items:
        st = sd.get("status") or {}
        done += st.get("observedGeneration") == sd["metadata"].get("generation")
        avail += any(c.get("type") == "MetricsAvailable" and valid_read(c) for c in st.get("conditions") or [])
        rec += "recommendation" in st
    return done, avail, rec


def wait(check: Callable[[], tuple[bool, str]], deadline_s: float, progress: Callable[[str], None], every_s: float,
         what: str, poll_s: float = 1.0) -> float:  # fmt: skip
    """Poll ``check`` (done?, progress line) until done; seconds taken. TimeoutError at the deadline."""
    t0 = time.monotonic()
    last_print = -math.inf
    while True:
        try:
            done, line = check()
        except OSError as error:  # a loaded apiserver answering slowly: poll again
            done, line = False, f"reading status failed: {error}"
        now = time.monotonic()
        if done or now - last_print >= every_s:
            progress(f"  [{now - t0:6.1f}s] {line}")
            last_print = now
        if done:
            return now - t0
        if now - t0 > deadline_s:
            raise TimeoutError(f"{what}: not reached within {deadline_s:.0f} s ({line})")
        time.sleep(poll_s)


def run(workdir: Path, options: Options) -> Figures:
    """One measurement at options.deployments; everything started is stopped on return."""
    say = options.progress
    n = options.deployments
    deployments = deployment_names(n)
    with ExitStack() as stack:
        t_start = time.monotonic()
        say(f"[scale N={n}] starting the control plane")
        # One GPU per engine pod, as many 8-GPU nodes as that takes (kwok keeps them Ready).
        pool = nodes.NodePool("kwok-scale-", math.ceil(n / nodes.GPUS_PER_NODE) + 1, "NVIDIA-H200", "224", "2Ti")
        cluster = stack.enter_context(cluster_mod.Cluster.start(workdir / "cluster", node_pools=(pool,)))
        exporter = FleetExporter(deployments)
        stack.callback(exporter.stop)
        target = localprom.StaticTarget(exporter.address, honor_labels=True)
        prom = localprom.PrometheusServer.start(workdir / "prometheus", static=[target],
                                                scrape_interval_s=options.scrape_s)  # fmt: skip
        stack.callback(prom.stop)
        say(f"[scale N={n}] prometheus {prom.url} scraping {len(deployments)} deployments' engine metrics "
            f"every {options.scrape_s:g} s; installing the chart")  # fmt: skip
        op_metrics_port = ports.free_ports(1)[0]
        env = {
            "SLIPSTREAM_TUNING_TIME_SCALE": "1",
            "SLIPSTREAM_STATUS_INTERVAL_SECONDS": "30",
            "SLIPSTREAM_PROMETHEUS_URL": prom.url,
            "SLIPSTREAM_METRICS_PORT": str(op_metrics_port),
            "SLIPSTREAM_TUNER_THREADS": str(chart_tuner_threads()),
            **options.operator_env,
        }
        st = stack_mod.Stack(cluster, stack_mod.StackOptions(operator_env=env, prometheus=False),
                             owns_cluster=False)  # fmt: skip
        st.install_chart()
        stack.callback(st.stop_operator)
        st.start_operator()
        assert st.operator is not None
        pid = st.operator.pid
        op_url = f"http://{ports.LOOPBACK}:{op_metrics_port}/metrics"
        say(f"[scale N={n}] operator pid {pid} healthy after {time.monotonic() - t_start:.0f} s, "
            f"{env['SLIPSTREAM_TUNER_THREADS']} tuner thread(s)")  # fmt: skip
        for i in range(NAMESPACES):
            cluster.kubectl("create", "namespace", f"scale-{i}")
        background: dict[str, float] = {}
        if options.background:
            say(f"[scale N={n}] the cluster's own apiserver requests for one interval ({options.interval_s} s)")
            a0 = apiserver_requests(cluster)
            time.sleep(options.interval_s)
            background = by_verb(a0, apiserver_requests(cluster), 1.0)

        poll = 1.0 if n <= 100 else 5.0  # a LIST of 500 ServingDeployments is a few MB
        docs = [sd_doc(ns, name, prom.url, options.interval_s) for ns, name in deployments]
        say(f"[scale N={n}] kubectl create {n} ServingDeployments (mode Recommend, interval {options.interval_s} s)")
        a_apply, m_apply, t0 = apiserver_requests(cluster), operator_metrics(op_url), time.monotonic()
        for chunk in range(0, n, 100):
            cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(docs[chunk:chunk + 100]))

        def all_reconciled() -> tuple[bool, str]:
            done, avail, rec = reconciled_count(cluster)
            return done == n, (f"{done}/{n} reconciled, {avail} MetricsAvailable, {rec} recommended; "
                               f"operator RSS peak {peak_rss(pid)}")  # fmt: skip

        wait(all_reconciled, options.reconcile_deadline_s, say, 5.0, "all reconciled", poll)
        reconcile_s = time.monotonic() - t0

        def all_stepping() -> tuple[bool, str]:
            done, avail, rec = reconciled_count(cluster)
            return avail == n, f"{avail}/{n} MetricsAvailable, {rec} recommended"

        say(f"[scale N={n}] all reconciled after {reconcile_s:.1f} s; waiting for every tuning loop's first step")
        try:
            wait(all_stepping, options.reconcile_deadline_s, say, 5.0, "every loop's metrics valid", poll)
            first_step_s: float | None = round(time.monotonic() - t0, 1)
        except TimeoutError as error:  # the loops are falling behind: measure them as they are
            say(f"[scale N={n}] {error}; measuring anyway")
            first_step_s = None
        a_stepped, m_stepped, t_stepped = apiserver_requests(cluster), operator_metrics(op_url), time.monotonic()
        # Every loop in its steady rhythm, then whole intervals.
        time.sleep(options.warmup_intervals * options.interval_s)
        say(f"[scale N={n}] measuring {options.intervals} intervals of {options.interval_s} s")
        a0, q0, c0, m0, w0 = (apiserver_requests(cluster), prometheus_queries(prom.url), cpu_seconds(pid),
                              operator_metrics(op_url), time.monotonic())  # fmt: skip
        longest = 0.0
        for k in range(options.intervals):
            end = time.monotonic() + options.interval_s
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(options.scrape_s, left))
                longest = max(longest, longest_without_step(op_url, n))
            say(f"  interval {k + 1}/{options.intervals}: operator CPU {cpu_seconds(pid) - c0:.1f} s so far, "
                f"RSS peak {peak_rss(pid)}")  # fmt: skip
        a1, q1, c1, m1, w1 = (apiserver_requests(cluster), prometheus_queries(prom.url), cpu_seconds(pid),
                              operator_metrics(op_url), time.monotonic())  # fmt: skip
        per = (w1 - w0) / options.interval_s
        peak_kib = peak_rss_kib(pid)  # once, for both units
        _, avail, rec = reconciled_count(cluster)

        def d(key: str) -> float:
            return (m1[key] - m0[key]) / per

        figures = Figures(
            deployments=n,
            reconcile_s=round(reconcile_s, 1),
            first_step_s=first_step_s,
            interval_s=options.interval_s,
            intervals=options.intervals,
            measured_s=round(w1 - w0, 1),
            prometheus_queries_per_interval=round((q1 - q0) / per, 1),
            apiserver_requests_per_interval=by_verb(a0, a1, per),
            apiserver_background_per_interval=background,
            apiserver_by_resource_per_interval=by_resource(a0, a1, per),
            operator_cpu_s_per_interval=round((c1 - c0) / per, 2),
            operator_peak_rss_mb=round(peak_kib * 1024 / 1e6, 1),
            operator_peak_rss_mib=round(peak_kib / 1024, 1),
            tuning_steps_per_interval=round(d("slipstream_tuning_step_seconds_count"), 1),
            longest_without_step_s=round(longest, 1),
            tuner_runs_per_interval=round(d("slipstream_tuner_seconds_count"), 1),
            tuner_wall_s_per_interval=round(d("slipstream_tuner_seconds_sum"), 2),
            tuner_cpu_s_per_interval=round(d("slipstream_tuner_cpu_seconds_total"), 2),
            tuner_cpu_s_per_run=round(d("slipstream_tuner_cpu_seconds_total") / d("slipstream_tuner_seconds_count"), 3)
            if d("slipstream_tuner_seconds_count") > 0 else 0.0,
            metrics_available=avail,
            recommended=rec,
            tuner_threads=int(env["SLIPSTREAM_TUNER_THREADS"]),
            tuner_reuses_per_interval=round(d("slipstream_tuner_reuses_total"), 1),
            steps_total=m1["slipstream_tuning_step_seconds_count"],
            tuner_calls_total=m1["slipstream_tuner_seconds_count"] + m1["slipstream_tuner_reuses_total"],
            apply_s=round(t_stepped - t0, 1),
            apply_apiserver_gets={r: round(a_stepped[(v, r)] - a_apply.get((v, r), 0.0))
                                  for v, r in sorted(a_stepped) if v == "GET" and a_stepped[(v, r)] > a_apply.get((v, r), 0.0)},
            apply_drift_events=drift_events(m_apply, m_stepped, 1.0),
            drift_events_per_interval=drift_events(m0, m1, per),
        )
        say(f"[scale N={n}] stopping everything")
    return figures


def table(results: list[Figures]) -> str:
    """The figures side by side, one row per figure, one column per N (markdown)."""
    rows = [
        ("ServingDeployments", lambda f: f.deployments),
        ("apply -> all reconciled (s)", lambda f: f.reconcile_s),
        ("apply -> every loop stepped on valid metrics (s)", lambda f: f.first_step_s),
        ("Prometheus queries / interval", lambda f: f.prometheus_queries_per_interval),
        ("apiserver requests / interval (all clients)", lambda f: sum(f.apiserver_requests_per_interval.values())),
        ("  by verb", lambda f: ", ".join(f"{k} {v:g}" for k, v in f.apiserver_requests_per_interval.items())),
        ("  background before the apply", lambda f: sum(f.apiserver_background_per_interval.values())),
        ("operator CPU s / interval", lambda f: f.operator_cpu_s_per_interval),
        ("operator peak RSS (MB)", lambda f: f.operator_peak_rss_mb),
        ("operator peak RSS (MiB)", lambda f: f.operator_peak_rss_mib),
        ("tuning steps / interval", lambda f: f.tuning_steps_per_interval),
        ("longest any loop went without a step (s)", lambda f: f.longest_without_step_s),
        ("tuner runs (twin) / interval", lambda f: f.tuner_runs_per_interval),
        ("tuner reuses (no twin run) / interval", lambda f: f.tuner_reuses_per_interval),
        ("tuner wall s / interval (sum)", lambda f: f.tuner_wall_s_per_interval),
        ("tuner CPU s / interval", lambda f: f.tuner_cpu_s_per_interval),
        ("tuner CPU s / twin run (one decision)", lambda f: f.tuner_cpu_s_per_run),
        ("MetricsAvailable / recommended at the end", lambda f: f"{f.metrics_available} / {f.recommended}"),
        ("drift watch events judged / skipped per interval",
         lambda f: f"{f.drift_events_per_interval.get('judged')} / {f.drift_events_per_interval.get('skipped')}"),
        ("apply phase (s): create -> every loop stepped", lambda f: f.apply_s),
        ("  drift watch events judged / skipped",
         lambda f: f"{f.apply_drift_events.get('judged')} / {f.apply_drift_events.get('skipped')}"),
        ("  GETs by resource", lambda f: ", ".join(f"{k} {v:g}" for k, v in f.apply_apiserver_gets.items())),
    ]
    head = f"| figure (interval {results[0].interval_s:g} s) | " + " | ".join(f"N={f.deployments}" for f in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    for label, get in rows:
        lines.append(f"| {label} | " + " | ".join(str(get(f)) for f in results) + " |")
    return "\n".join(lines)
