"""Driving and watching the closed loop on a running stack: the demo's and the test's parts.

- ``Target``: where the loop runs (kubeconfig, kubectl, an apiserver reader, the
  simulators' time scale), from an in-process localkube.Stack or a running
  ``slipstream cluster up``;
- ``serving_deployment()``: the example ServingDeployment (engine pods simulated);
- ``Watcher``: polls the ServingDeployment's status and Events once a second and
  keeps a timeline (setting, heterogeneity, per-tenant p99 TTFT) keyed by twin time,
  and, given the engines' URLs, their prefill-pass counters (``PassCount``; the share of
  passes they capped over a window: ``capped_share``);
- ``LoadRun``: the phases' requests replayed in a thread by the engine simulator's
  load generator (slipstream.enginesim.load) against the ready pods of the engine
  Service, picked by its selector (localkube.podrunner.ServiceTargets: the
  stand-in for kube-proxy, since the apiserver refuses loopback addresses in
  EndpointSlices).
"""

from __future__ import annotations

import base64
import json
import math
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slipstream.engine import metrics as engine_metrics
from slipstream.localkube import apiread, podrunner
from slipstream.sim.metrics import nearest_rank
from slipstream.sim.workload import Request

ENGINE_IMAGE = "ghcr.io/slipstream-dev/engine-sim:local"
"""Never pulled: kwok runs no containers; the engine-pod runner runs the simulator."""

KIND_PLURAL = "servingdeployments"
GROUP_VERSION = "serving.slipstream.dev/v1alpha1"


@dataclass
class Target:
    """A running stack the loop talks to."""

    kubeconfig: Path
    kubectl_bin: Path
    reader: apiread.ApiReader
    time_scale: float
    prometheus_url: str
    """The Prometheus that scrapes the engines (the ServingDeployment's spec.prometheus.url)."""

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def admin_key(self, namespace: str, name: str) -> str:
        """The engines' admin key the operator generated for ServingDeployment ``name``
        (Secret ``<name>-admin-key``, key ``api-key``; INTERFACES C)."""
        secret = self.reader.get_json(f"/api/v1/namespaces/{namespace}/secrets/{name}-admin-key")
        return base64.b64decode(secret["data"]["api-key"]).decode()

    def get_sd(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            sd: dict[str, Any] = self.reader.get_json(
                f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{KIND_PLURAL}/{name}"
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return sd

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The ServingDeployment's Events, oldest first."""
        query = f"fieldSelector=involvedObject.kind%3DServingDeployment%2CinvolvedObject.name%3D{name}"
        items = self.reader.get_json(f"/api/v1/namespaces/{namespace}/events?{query}")["items"]
        return sorted(items, key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "", e["metadata"]["name"]))

    def pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        query = f"labelSelector={podrunner.ENGINE_LABEL}%3D{name}"
        return list(self.reader.get_json(f"/api/v1/namespaces/{namespace}/pods?{query}")["items"])

    def targets(self, namespace: str, name: str) -> podrunner.ServiceTargets:
        """The engine Service's ready pods, as the load's target list."""
        service = self.reader.get_json(f"/api/v1/namespaces/{namespace}/services/{name}")
        return podrunner.ServiceTargets(self.reader.get_json, namespace, service["spec"]["selector"])


def serving_deployment(
    name: str,
    prometheus_url: str,
    admin_secret: str | None = None,
    *,
    mode: str = "Auto",
    replicas: int = 2,
    threshold: int = 4096,
    engine_mode: str = "reflex",
    schedule_policy: str = "srpt",
    interval_s: int = 60,
    cooldown_s: int = 180,
    analysis_s: int = 120,
    max_concurrency: int = 2,
    max_regression: float = 100.0,
) -> dict[str, Any]:
    """The example ServingDeployment: Kimi-K3-class engines (C = 8192), simulated.

    It starts on a reflex at T 4096 with srpt (``engine_mode``, ``threshold``,
    ``schedule_policy``): stock on uniform traffic, ceiling:4096 from the pass after a short
    request waits, so a phase's first giant is capped by the engine, not a tuning interval
    later; Auto then tunes the order (and T, within ``max_concurrency``) with the reflex
    kept (tune.candidates.modes_for). ``engine_mode="ceiling"`` gives the ceiling and floor
    tuner, from ``threshold`` (0: stock).

    ``max_concurrency`` 2 (T >= 4096): on the demo's heterogeneous phase the twin's best
    setting is then one step from off, so the operator moves once per phase change. With
    a wider bound the twin ranks concurrency 3-4 some 20-25% better than 2, and since one
    step at most doubles the concurrency, it gets there a cooldown later in a second step.

    Durations are what production would use; a stack at time scale S runs them
    S times faster (the operator's SLIPSTREAM_TUNING_TIME_SCALE is 1/S).
    ``max_regression`` (percent) is wide because canary figures are p99s read from
    SGLang's TTFT buckets, whose neighbours at tens of seconds are 40-70% apart (a run
    rolled back a good canary on "55.00 s vs 32.00 s": two bucket bounds); a real
    regression (the test injects 20x) is far beyond it.
    """
    tuning: dict[str, Any] = {
        "mode": mode,
        "engineMode": engine_mode,
        "schedulePolicy": schedule_policy,
        "minConcurrency": 1,
        "maxConcurrency": max_concurrency,
        "intervalSeconds": interval_s,
        "cooldownSeconds": cooldown_s,
        "objective": {"tenantLabel": "tenant", "ttftP99Seconds": 2.0},
        "rollout": {"canaryReplicas": 1, "analysisWindowSeconds": analysis_s, "maxRegressionPercent": max_regression},
    }
    if mode == "Fixed" or threshold:
        tuning["threshold"] = threshold
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ServingDeployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "engine": {
                "image": ENGINE_IMAGE,
                "model": "moonshotai/Kimi-K3-Instruct",
                "chunkedPrefillSize": 8192,
                "pageSize": 1,
                "tensorParallelSize": 8,
                "port": 30000,
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                # None: the operator generates the engines' admin key (Secret <name>-admin-key)
                **({"adminApiKeySecretRef": {"name": admin_secret, "key": "api-key"}} if admin_secret else {}),
            },
            "tuning": tuning,
            "prometheus": {"url": prometheus_url},
        },
    }


# -- the timeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusSample:
    """The ServingDeployment's status at one moment (twin seconds since the load began)."""

    twin_s: float
    threshold: int | None
    concurrency: int | None
    mode: str | None
    schedule_policy: str | None
    heterogeneity: float | None
    rollout_phase: str | None
    tenants_p99: dict[str, float]
    recommendation: tuple[int, str, str] | None = None
    """What the tuner would run (the twin's best candidate): (threshold, mode, order)."""


def sample_of(sd: dict[str, Any], twin_s: float) -> StatusSample:
    status = sd.get("status") or {}
    tenants = {
        t["name"]: float(t["ttftP99Seconds"])
        for t in status.get("tenants") or []
        if t.get("ttftP99Seconds") is not None
    }
    rec = status.get("recommendation")
    return StatusSample(
        recommendation=(rec["threshold"], rec.get("mode", "ceiling"), rec.get("schedulePolicy", "fcfs"))
        if rec
        else None,
        twin_s=twin_s,
        threshold=status.get("threshold"),
        concurrency=status.get("concurrency"),
        mode=status.get("mode"),
        schedule_policy=status.get("schedulePolicy"),
        heterogeneity=status.get("heterogeneity"),
        rollout_phase=(status.get("rollout") or {}).get("phase"),
        tenants_p99=tenants,
    )


def setting_text(s: StatusSample) -> str:
    if s.threshold is None:
        return "setting ?"
    if s.threshold == 0:
        return "off (stock)" if s.schedule_policy in (None, "fcfs") else f"off, order {s.schedule_policy}"
    return f"T={s.threshold} (x{s.concurrency}) {s.mode}/{s.schedule_policy}"


def status_line(s: StatusSample, capped: float | None = None) -> str:
    """The setting, heterogeneity and per-tenant p99 TTFT; with ``capped`` (a share, 0-1),
    the share of prefill passes the engines capped too."""
    het = "?" if s.heterogeneity is None else f"{s.heterogeneity:.2f}"
    p99 = " ".join(f"{t} {v:.1f}s" for t, v in sorted(s.tenants_p99.items())) or "-"
    rollout = f" [{s.rollout_phase}]" if s.rollout_phase and s.rollout_phase != "Idle" else ""
    passes = "" if capped is None else f" | capping {capped:.0%} of passes"
    return f"{setting_text(s)}{rollout}{passes} | heterogeneity {het} | p99 TTFT {p99}"


# -- the engines' prefill passes --------------------------------------------------------------


@dataclass(frozen=True)
class PassCount:
    """The engines' ``sglang:long_prefill_rounds_total`` at one moment: per engine URL,
    (capped passes, all passes) of the long-prefill path since that engine started."""

    twin_s: float
    counts: dict[str, tuple[float, float]]


def read_passes(url: str, timeout_s: float = 2.0) -> tuple[float, float]:
    """(capped, all) long-path prefill passes of the engine at ``url``, from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    by_label = {"true": 0.0, "false": 0.0}
    for family in text_string_to_metric_families(text):
        for smp in family.samples:
            if smp.name == engine_metrics.LONG_PREFILL_ROUNDS_TOTAL:
                label = smp.labels.get(engine_metrics.CAPPED_LABEL)
                if label in by_label:
                    by_label[label] += smp.value
    return by_label["true"], by_label["true"] + by_label["false"]


def capped_share(passes: Sequence[PassCount], start_s: float, end_s: float) -> float | None:
    """The share of the engines' long-path prefill passes that were capped, among those
    counted between samples taken in (start_s, end_s]: each engine's rise from its sample
    before to the one in the window (a counter that went down restarted: its new value is
    the rise). None when no pass was counted there."""
    capped = total = 0.0
    last: dict[str, tuple[float, float]] = {}
    for p in passes:
        for url, (c, n) in p.counts.items():
            before = last.get(url)
            last[url] = (c, n)
            if before is None or not start_s < p.twin_s <= end_s:
                continue
            if n < before[1] or c < before[0]:
                before = (0.0, 0.0)
            capped += c - before[0]
            total += n - before[1]
    return capped / total if total > 0 else None


@dataclass
class Watcher:
    """Polls one ServingDeployment; keeps samples and Events; calls back on news."""

    target: Target
    namespace: str
    name: str
    on_event: Callable[[dict[str, Any]], None] | None = None
    poll_s: float = 1.0
    samples: list[StatusSample] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    t0: float | None = None
    errors: int = 0
    engines: Callable[[], Sequence[str]] | None = None
    """The engines' base URLs (the load's targets); given, each poll reads their pass
    counters into ``passes``."""
    passes: list[PassCount] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def twin_now(self) -> float:
        return 0.0 if self.t0 is None else (time.monotonic() - self.t0) * self.target.time_scale

    def poll(self) -> None:
        sd = self.target.get_sd(self.namespace, self.name)
        if sd is not None:
            self.samples.append(sample_of(sd, self.twin_now()))
        for event in self.target.events(self.namespace, self.name):
            key = f"{event['metadata']['name']}/{event.get('count', 1)}"
            if key in self._seen:
                continue
            self._seen.add(key)
            event = {**event, "_twin_s": self.twin_now()}
            self.events.append(event)
            if self.on_event is not None:
                self.on_event(event)
        if self.engines is not None:
            self.poll_passes(self.engines())

    def poll_passes(self, urls: Sequence[str]) -> None:
        """One ``PassCount`` of the engines that answer (one that does not is left out)."""
        counts: dict[str, tuple[float, float]] = {}
        for url in urls:
            try:
                counts[url] = read_passes(url)
            except (OSError, ValueError):
                self.errors += 1
        if counts:
            self.passes.append(PassCount(self.twin_now(), counts))

    def capped_share(self, window_s: float = 60.0) -> float | None:
        """The share of passes the engines capped over the last ``window_s`` twin seconds."""
        now = self.twin_now()
        return capped_share(self.passes, now - window_s, now)

    def start(self) -> Watcher:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.poll()
                except (OSError, ValueError, KeyError):
                    self.errors += 1
                self._stop.wait(self.poll_s)

        self._thread = threading.Thread(target=loop, name="watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def latest(self) -> StatusSample | None:
        return self.samples[-1] if self.samples else None


# -- the load -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One request's outcome with its arrival (twin seconds from the load's start)."""

    tenant: str
    rid: str
    arrival_s: float
    ttft_s: float
    ok: bool
    late_s: float = 0.0
    """Twin seconds the load sent it after its arrival time (the machine fell behind)."""


class LoadRun:
    """The requests replayed in a background thread; results once it ends."""

    def __init__(self, requests: Sequence[Request], targets: Callable[[], Sequence[str]], time_scale: float) -> None:
        self.requests = list(requests)
        self.targets = targets
        self.time_scale = time_scale
        self.results: list[Result] = []
        self.error: BaseException | None = None
        self.t0: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> LoadRun:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        from slipstream.enginesim import load  # the simulator's load generator (aiohttp)

        try:
            outcomes = load.replay(
                self.requests, self.targets, self.time_scale, report_every_s=None, prompt="field",
                stop=self._stop.is_set,
            )
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc
            return
        arrival = {r.rid: r.arrival_s for r in self.requests}
        self.results = [
            Result(o.tenant, o.rid, arrival.get(o.rid, math.nan), o.ttft_s, o.ok, o.late_s) for o in outcomes
        ]

    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Send no more requests (a test that has seen what it waited for); those in flight
        get the load's drain time, and ``join`` returns what was sent."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> list[Result]:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError("the load is still running")
        if self.error is not None:
            raise RuntimeError(f"load failed: {self.error}") from self.error
        return self.results


def tenant_p99(results: Sequence[Result], start_s: float, end_s: float) -> dict[str, float]:
    """p99 TTFT per tenant of the requests arriving in [start_s, end_s) (failed ones excluded)."""
    by_tenant: dict[str, list[float]] = {}
    for r in results:
        if r.ok and start_s <= r.arrival_s < end_s:
            by_tenant.setdefault(r.tenant, []).append(r.ttft_s)
    return {t: nearest_rank(v, 99) for t, v in sorted(by_tenant.items())}


def wait_for(check: Callable[[], Any], deadline_s: float, what: str, poll_s: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(poll_s)
    raise TimeoutError(f"{what}: not within {deadline_s:.0f}s (last: {json.dumps(last, default=str)[:300]})")
