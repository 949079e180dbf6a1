"""A real Prometheus server on a free loopback port, for the tests and the local cluster.

The binary is Debian's ``prometheus`` 2.42.0 (``scripts/install-prometheus.sh``). The server
gets a rendered config, a data directory and a log file under its workdir, and runs in its
own process group (``localkube.processes.Component``), so ``stop()`` leaves nothing behind.

Two kinds of scrape job can be rendered:

- ``StaticTarget``: a fixed ``host:port`` with the labels an engine pod would carry
  (tests that run an exporter or an engine simulator without Kubernetes);
- ``PodDiscovery``: the engine pods the apiserver lists (a kubeconfig's credentials), the
  way a real cluster's Prometheus with ``kubernetes_sd`` (pod role) or the PodMonitor the
  operator creates finds them. Debian's build has no Kubernetes discovery, so
  ``localkube.poddiscovery`` does the pod role and its relabeling in Python and Prometheus
  polls it through ``http_sd_configs`` every scrape interval. Only pods carrying the label
  ``serving.slipstream.dev/name`` are kept, only their Running phase and the container port
  named ``http`` (the engine's, see ``controller/objects.py``); the target is the pod IP and
  that port.

Every engine target carries the labels ``namespace``, ``pod`` and ``servingdeployment``
(INTERFACES.md section E): ``observe`` aggregates ``by (namespace, servingdeployment, ...)``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slipstream.localkube import health, poddiscovery, ports, processes

BINARY_ENV = "SLIPSTREAM_PROMETHEUS"
"""Environment variable naming another prometheus binary (default: the Debian package's)."""

DEFAULT_BINARY = "/usr/bin/prometheus"
"""Where Debian's package installs the server."""

INSTALL_HINT = "run `bash scripts/install-prometheus.sh` (or `make prometheus`) from the repo root"

READY_DEADLINE_S = 30.0
"""Seconds for /-/ready: an empty TSDB opens in well under a second; the margin is for a
loaded CI machine."""

START_ATTEMPTS = 3
"""Start-ups tried when another process took the picked port first."""

NAME_LABEL = poddiscovery.NAME_LABEL

ENGINE_PORT_NAME = "http"
"""The engine container's port name in the rendered pod template."""

TARGET_LABELS = ("namespace", "pod", "servingdeployment")
"""Labels every engine target carries (INTERFACES.md, section E)."""


class PrometheusMissingError(RuntimeError):
    """The prometheus binary is not installed."""


@dataclass(frozen=True, slots=True)
class StaticTarget:
    """One scrape target at a fixed address, labelled as an engine pod would be."""

    address: str
    """``host:port`` (a loopback address)."""
    namespace: str = "default"
    pod: str = "engine-0"
    servingdeployment: str = "engine"
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"
    honor_labels: bool = False
    """Keep the exporter's own namespace/pod/servingdeployment labels over these (one
    exporter standing in for many pods, as the scale benchmark's does)."""


@dataclass(frozen=True, slots=True)
class PodDiscovery:
    """Find engine pods through the apiserver (kubernetes_sd, pod role)."""

    kubeconfig: Path
    """A kubeconfig allowed to list and watch pods (the admin one in tests)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means all."""
    port_name: str = ENGINE_PORT_NAME
    metrics_path: str = "/metrics"


def binary() -> Path:
    """The prometheus binary, or PrometheusMissingError saying how to install it."""
    path = Path(os.environ.get(BINARY_ENV, DEFAULT_BINARY))
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise PrometheusMissingError(f"prometheus not found at {path}: {INSTALL_HINT}")
    return path


def _duration(seconds: float) -> str:
    """A Prometheus duration (milliseconds precision)."""
    return f"{round(seconds * 1000)}ms"


SGLANG_NAME_RELABEL: dict[str, Any] = {
    "source_labels": ["__name__"],
    "regex": "sglang_(.+)",
    "target_label": "__name__",
    "replacement": "sglang:$1",
}
"""Stores ``sglang_x`` samples as ``sglang:x``, the names SGLang declares and documents.

prometheus_client 0.26 writes the colon as an underscore in OpenMetrics sample lines
(prometheus/client_python#1177), and Prometheus 2.42 asks for OpenMetrics first; the
observer's queries accept both spellings, this keeps what a person types in the UI working.
"""


def _static_job(index: int, target: StaticTarget, relabel: list[dict[str, Any]]) -> dict[str, Any]:
    labels = {
        "namespace": target.namespace,
        "pod": target.pod,
        "servingdeployment": target.servingdeployment,
        **target.extra_labels,
    }
    return {
        "job_name": f"static-{index}",
        "metrics_path": target.metrics_path,
        "static_configs": [{"targets": [target.address], "labels": labels}],
        "metric_relabel_configs": relabel,
        "honor_labels": target.honor_labels,
    }


def _pod_job(sd_url: str, refresh: str, relabel: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "job_name": "slipstream-engines",
        "http_sd_configs": [{"url": sd_url, "refresh_interval": refresh}],
        "metric_relabel_configs": relabel,
    }


def render_config(
    *,
    scrape_interval_s: float,
    static: Sequence[StaticTarget] = (),
    discovery_url: str | None = None,
    normalize_sglang_names: bool = True,
) -> dict[str, Any]:
    """The server's config as a dict (pure: tests read it, start() writes it as YAML).

    ``discovery_url`` is a ``poddiscovery.DiscoveryServer``'s URL, polled every scrape
    interval for the engine pods (labels and ``__metrics_path__`` come with the targets).

    ``normalize_sglang_names=False`` stores names as scraped (``sglang_x`` from
    prometheus_client over OpenMetrics), as a Prometheus without our relabeling would.
    """
    if scrape_interval_s <= 0:
        raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s}")
    interval = _duration(scrape_interval_s)
    relabel = [SGLANG_NAME_RELABEL] if normalize_sglang_names else []
    jobs = [_static_job(i, t, relabel) for i, t in enumerate(static)]
    if discovery_url is not None:
        jobs.append(_pod_job(discovery_url, interval, relabel))
    return {
        "global": {
            "scrape_interval": interval,
            # A scrape may not outlast its interval (Prometheus refuses the config).
            "scrape_timeout": _duration(min(scrape_interval_s, 10.0)),
            "evaluation_interval": interval,
        },
        "scrape_configs": jobs,
    }


class PrometheusServer:
    """A running Prometheus: ``url``, ``workdir``, ``stop()``; a context manager too."""

    def __init__(
        self,
        component: processes.Component,
        url: str,
        workdir: Path,
        config: Path,
        discovery: poddiscovery.DiscoveryServer | None = None,
    ) -> None:
        self._component = component
        self._discovery = discovery
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.workdir = workdir
        self.config_path = config

    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        scrape_interval_s: float = 1.0,
        static: Sequence[StaticTarget] = (),
        discovery: PodDiscovery | None = None,
        retention: str = "2h",
        ready_deadline_s: float = READY_DEADLINE_S,
        port: int | None = None,
        keep_data: bool = False,
        normalize_sglang_names: bool = True,
    ) -> PrometheusServer:
        """Start a server whose files live in ``workdir``; return once /-/ready answers 200.

        ``port`` pins the listen port (a restart at the same URL; default: a free one) and
        ``keep_data`` keeps the TSDB of an earlier run in ``workdir/data`` (default: fresh).
        Raises PrometheusMissingError when the binary is not installed, and ComponentError
        (with the log tail, ``workdir/prometheus.log``) when it exits or is not ready in time.
        """
        exe = binary()
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        sd = None
        if discovery is not None:
            sd = poddiscovery.DiscoveryServer(
                discovery.kubeconfig,
                namespaces=discovery.namespaces,
                port_name=discovery.port_name,
                metrics_path=discovery.metrics_path,
            )
        try:
            config = workdir / "prometheus.yml"
            config.write_text(
                yaml.safe_dump(
                    render_config(
                        scrape_interval_s=scrape_interval_s,
                        static=static,
                        discovery_url=sd.url if sd is not None else None,
                        normalize_sglang_names=normalize_sglang_names,
                    ),
                    sort_keys=False,
                )
            )
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    component, url = cls._start_once(
                        exe, workdir, config, retention, ready_deadline_s, port, keep_data
                    )
                    return cls(component, url, workdir, config, sd)
                except processes.ComponentError as exc:
                    retry = port is None and ports.ADDRESS_IN_USE in str(exc)
                    if not retry or attempt == START_ATTEMPTS:
                        raise
            raise AssertionError("unreachable")
        except BaseException:
            if sd is not None:
                sd.stop()
            raise

    @classmethod
    def _start_once(
        cls,
        exe: Path,
        workdir: Path,
        config: Path,
        retention: str,
        ready_deadline_s: float,
        port: int | None,
        keep_data: bool,
    ) -> tuple[processes.Component, str]:
        if port is None:
            (port,) = ports.free_ports(1)
        data = workdir / "data"
        if not keep_data:
            shutil.rmtree(data, ignore_errors=True)
        argv = [
            str(exe),
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address={ports.LOOPBACK}:{port}",
            "--web.enable-lifecycle",
            "--log.level=info",
        ]
        component = processes.Component("prometheus", argv, workdir / "prometheus.log")
        url = f"http://{ports.LOOPBACK}:{port}"
        try:
            health.wait_healthy(component, f"{url}/-/ready", deadline_s=ready_deadline_s)
        except BaseException:
            component.stop()
            raise
        return component, url

    @property
    def pid(self) -> int:
        return self._component.pid

    def running(self) -> bool:
        return self._component.running()

    def log_tail(self, lines: int = processes.LOG_TAIL_LINES) -> str:
        return self._component.log_tail(lines)

    def reload(self, config: Mapping[str, Any]) -> None:
        """Write a new config and ask the server to load it (``/-/reload``)."""
        self.config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=health.REQUEST_TIMEOUT_S) as resp:
            if resp.status != 200:
                raise processes.ComponentError(f"prometheus reload answered HTTP {resp.status}")

    def wait_for_targets(self, count: int, *, deadline_s: float = 30.0) -> None:
        """Poll /api/v1/targets until ``count`` active targets report health "up"."""
        deadline = time.monotonic() + deadline_s
        last = "no answer yet"
        while True:
            self._component.check_alive()
            try:
                with urllib.request.urlopen(
                    f"{self.url}/api/v1/targets?state=active", timeout=health.REQUEST_TIMEOUT_S
                ) as resp:
                    active = json.loads(resp.read())["data"]["activeTargets"]
                up = [t for t in active if t.get("health") == "up"]
                if len(up) >= count:
                    return
                last = f"{len(up)} of {len(active)} targets up: " + "; ".join(
                    f"{t.get('scrapeUrl')} {t.get('health')} {t.get('lastError')}" for t in active
                )
            except (OSError, ValueError, KeyError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise self._component.failure(
                    f"has not {count} targets up within {deadline_s:.0f}s (last: {last})"
                )
            time.sleep(health.POLL_INTERVAL_S)

    def restart(self, ready_deadline_s: float = READY_DEADLINE_S) -> None:
        """Stop the server and start it again on the same port and data (the pod discovery
        keeps running); return once /-/ready answers. For a supervisor: what it scraped stays."""
        old = self._component
        old.stop()
        self._component = processes.Component(old.name, old.argv, old.log_path, env=old.env)
        health.wait_healthy(self._component, f"{self.url}/-/ready", deadline_s=ready_deadline_s)

    def stop_server(self) -> None:
        """Stop the server's process alone (an outage): the pod discovery keeps running, and
        ``restart`` starts it again on the same port and data."""
        self._component.stop()

    def stop(self) -> None:
        """Stop the process group (SIGTERM, then SIGKILL) and the discovery; return once gone."""
        try:
            self._component.stop()
        finally:
            if self._discovery is not None:
                self._discovery.stop()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
