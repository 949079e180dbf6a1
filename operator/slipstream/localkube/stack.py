"""Everything a local closed loop needs, started and stopped as one: the stack.

1. the control plane (localkube.Cluster: etcd, apiserver, controller manager,
   scheduler, kwok with a loopback pod CIDR of its own);
2. Prometheus, discovering the engine pods through the apiserver
   (localkube.prometheus: kubernetes_sd, pod role, 1 s scrape);
3. the chart, installed with ``helm install``, and the operator running as a
   local process with a token of the chart's ServiceAccount, so the chart's
   RBAC is what it gets (the chart's own operator Deployment has kwok pods
   that run nothing: kwok runs no containers);
4. the engine-pod runner (localkube.podrunner): an engine simulator per engine pod.

Used by ``slipstream cluster up`` (through localkube.supervisor), the demo and
the closed-loop test. ``stop()`` stops them in reverse order and leaves no
process behind; every process leads a process group of its own, and
``pids()`` lists them for a supervisor's state file.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from slipstream.localkube import cluster as cluster_mod
from slipstream.localkube import health, podrunner, ports, processes, restarts
from slipstream.localkube import prometheus as prom_mod

log = logging.getLogger(__name__)

REPO_CHART = Path(__file__).resolve().parents[3] / "charts" / "slipstream"
"""The chart in this checkout (the package is installed editable from it)."""

RELEASE = "slipstream"
RELEASE_NAMESPACE = "slipstream-system"
SERVICE_ACCOUNT = "slipstream"
"""The chart's ServiceAccount for release ``slipstream`` (its full name)."""

PEERING = "slipstream"
"""The ClusterKopfPeering the chart creates; the operator process joins it."""

OPERATOR_READY_S = 90.0
"""Deadline for the operator's health endpoint: kopf imports and the first
list of every watched resource take ~5-20 s on a loaded two-core machine."""

CRD_ESTABLISHED_S = "60s"

OPERATOR_ENV_FILE = "operator.env"
"""The operator's own environment (beyond the inherited one), written in the cluster's
workdir when it starts, with its command line: how to run it by hand (docs/operator.md)."""

SCRAPE_INTERVAL_S = 1.0
"""Prometheus scrapes every engine each second: the loop's intervals are seconds."""


class PrometheusHandle(Protocol):
    """What the stack needs of localkube.prometheus's server handle."""

    url: str

    def stop(self) -> None: ...


@dataclass(frozen=True)
class StackOptions:
    """What to start, and how fast simulated time runs."""

    time_scale: float = 1.0
    """Twin seconds per wall second in every engine simulator."""

    chart: Path = REPO_CHART
    helm_values: Sequence[str] = ()
    """Extra ``--set`` values for ``helm install``."""

    operator: bool = True
    prometheus: bool = True
    engine_namespace: str | None = None
    """Run simulators only for engine pods of this namespace (None: every namespace)."""

    operator_env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment of the operator (intervals, cooldowns: its settings)."""

    simulator_args: Sequence[str] = ()
    """Extra ``slipstream engine-sim`` arguments for every simulator (e.g. --profile)."""

    prometheus_port: int | None = None
    """Prometheus's port (None: a free one). ``cluster up`` asks for 9090 when it is free,
    so a ServingDeployment written by hand can name http://127.0.0.1:9090."""


class OperatorPorts(NamedTuple):
    """The operator's listeners (loopback): kopf's health, its metrics, its /readyz."""

    health: int
    metrics: int
    ready: int


OPERATOR_COMPONENT = "slipstream-operator"
"""Label `component` of the operator's scrape target: the dashboard's operator panels read its series."""


class Stack:
    """A running stack; make one with Stack.start()."""

    def __init__(self, cluster: cluster_mod.Cluster, options: StackOptions, *, owns_cluster: bool) -> None:
        self.cluster = cluster
        self.options = options
        self.owns_cluster = owns_cluster
        self._installed = False
        self.prometheus: PrometheusHandle | None = None
        self.operator: processes.Component | None = None
        self.operator_kubeconfig: Path | None = None
        self._operator_health: str | None = None
        self.operator_ready_url: str | None = None
        """The operator's /readyz (`controller.runtime.readiness`): `cluster status` asks it."""
        self.operator_metrics_url: str | None = None
        self.operator_ports: OperatorPorts | None = None
        self.runner: podrunner.PodRunner | None = None

    @classmethod
    def start(cls, workdir: Path, options: StackOptions | None = None) -> Stack:
        """Start every part in order; on any failure stop what started and re-raise."""
        cluster = cluster_mod.Cluster.start(workdir)
        try:
            return cls.attach(cluster, options, owns_cluster=True)
        except BaseException:
            cluster.stop()
            raise

    @classmethod
    def attach(
        cls, cluster: cluster_mod.Cluster, options: StackOptions | None = None, *, owns_cluster: bool = False
    ) -> Stack:
        """Start the rest of the stack on a running cluster (the cluster tests' fixture).

        ``stop()`` then leaves the cluster running unless ``owns_cluster``.
        """
        options = options or StackOptions()
        t0 = time.monotonic()
        stack = cls(cluster, options, owns_cluster=owns_cluster)
        try:
            if options.operator:
                # Chosen before Prometheus starts: it scrapes the operator's metrics there.
                stack.operator_ports = OperatorPorts(*ports.free_ports(3))
            if options.prometheus:
                stack.prometheus = start_prometheus(cluster, options, stack.operator_ports)
                log.info("stack: prometheus at %s", stack.prometheus.url)
            stack.runner = podrunner.PodRunner(
                cluster.get_json,
                cluster.log_dir / "engines",
                time_scale=options.time_scale,
                namespace=options.engine_namespace,
                extra_args=options.simulator_args,
                state_path=cluster.workdir / "podrunner.json",
            ).start()
            if options.operator:
                stack.install_chart()
                stack.start_operator()
        except BaseException:
            stack.stop()
            raise
        log.info("stack: up after %.1fs", time.monotonic() - t0)
        return stack

    # parts

    def install_chart(self) -> None:
        """``helm install`` the chart and wait for its CRDs to be served."""
        self._installed = True
        sets = [f"--set={value}" for value in self.options.helm_values]
        self.cluster.helm(
            "install", RELEASE, str(self.options.chart),
            f"--namespace={RELEASE_NAMESPACE}", "--create-namespace", *sets,
        )  # fmt: skip
        self.cluster.kubectl(
            "wait", "--for=condition=Established", f"--timeout={CRD_ESTABLISHED_S}",
            "crd/servingdeployments.serving.slipstream.dev",
        )  # fmt: skip

    def uninstall_chart(self) -> None:
        """``helm uninstall`` (a shared cluster's next user installs its own)."""
        self._installed = False
        self.cluster.helm("uninstall", RELEASE, f"--namespace={RELEASE_NAMESPACE}", "--wait", check=False)

    def start_operator(self) -> None:
        """The operator as a process with the chart ServiceAccount's token; waits until healthy."""
        self.operator_kubeconfig = self.cluster.token_kubeconfig(RELEASE_NAMESPACE, SERVICE_ACCOUNT)
        if self.operator_ports is None:
            self.operator_ports = OperatorPorts(*ports.free_ports(3))
        health_port, metrics_port, ready_port = self.operator_ports
        env = {
            **os.environ,
            "KUBECONFIG": str(self.operator_kubeconfig),
            "SLIPSTREAM_METRICS_PORT": str(metrics_port),
            "SLIPSTREAM_READY_PORT": str(ready_port),
            **self.operator_env(),
        }
        self.operator_ready_url = f"http://{ports.LOOPBACK}:{ready_port}/readyz"
        self.operator_metrics_url = f"http://{ports.LOOPBACK}:{metrics_port}/metrics"
        url = f"http://{ports.LOOPBACK}:{health_port}/healthz"
        # As the image runs it: without the tooling and the packages the image lacks.
        argv = [sys.executable, "-m", "slipstream.runtime_only", f"--peering={PEERING}", f"--liveness={url}"]
        own = {key: value for key, value in env.items() if os.environ.get(key) != value}
        write_env_file(self.cluster.workdir / OPERATOR_ENV_FILE, own, argv)
        self._operator_health = url
        self.operator = processes.Component("operator", argv, self.cluster.log_dir / "operator.log", env=env)
        health.wait_healthy(self.operator, url, deadline_s=OPERATOR_READY_S)

    def restart_operator(self) -> None:
        """Stop the operator (what is left of its process group) and start it again with the
        same command line and environment; return once it is healthy."""
        old = self.operator
        if old is None or self._operator_health is None:
            raise RuntimeError("the operator was never started in this stack")
        old.stop()
        self.operator = processes.Component(old.name, old.argv, old.log_path, env=old.env)
        health.wait_healthy(self.operator, self._operator_health, deadline_s=OPERATOR_READY_S)

    def restart_runner(self) -> None:
        """Start the engine-pod runner's thread again (its simulators are left as they run)."""
        if self.runner is None:
            raise RuntimeError("the engine-pod runner was never started in this stack")
        self.runner.start()

    def parts(self) -> list[restarts.Part]:
        """Every part a supervisor keeps running: the control plane's components, Prometheus,
        the operator and the engine-pod runner (the runner restarts its own simulators)."""
        out = [_component_part(self.cluster, name) for name in self.cluster.pids]
        prometheus = self.prometheus
        if isinstance(prometheus, prom_mod.PrometheusServer):
            out.append(restarts.Part("prometheus", lambda: prometheus.pid, prometheus.running, prometheus.restart))
        if self.operator is not None:
            out.append(restarts.Part(
                "operator", lambda: self.operator.pid if self.operator is not None else None,
                lambda: self.operator is not None and self.operator.running(), self.restart_operator,
            ))  # fmt: skip
        runner = self.runner
        if runner is not None:
            out.append(restarts.Part("engine-pod-runner", lambda: None, runner.running, self.restart_runner))
        return out

    def operator_env(self) -> dict[str, str]:
        """The operator's settings for this stack (controller.settings), then the options'.

        The whole stack runs on the simulators' clock: with time scale S every
        duration of a ServingDeployment's spec.tuning (interval, cooldown, analysis
        window) is divided by S, so a spec written for production (a 60 s interval)
        runs here as it would there, only S times faster, and the tuner reads the
        engines' rates in twin time. The operator may reach
        engine pods only in this cluster's loopback pod CIDR, and its metrics and /readyz
        listen on loopback only (docs/localkube.md), not on every address as in a pod.
        """
        env = {
            "SLIPSTREAM_LISTEN_ADDRESS": ports.LOOPBACK,
            "SLIPSTREAM_TUNING_TIME_SCALE": f"{1.0 / self.options.time_scale:.6g}",
            "SLIPSTREAM_ENGINE_TIME_SCALE": f"{self.options.time_scale:.6g}",
            "SLIPSTREAM_STATUS_INTERVAL_SECONDS": "3",
            "SLIPSTREAM_RETRY_DELAY_SECONDS": "5",
            "SLIPSTREAM_ROLLOUT_POLL_SECONDS": "1",
            "SLIPSTREAM_ENGINE_SCRAPE_INTERVAL_SECONDS": f"{SCRAPE_INTERVAL_S:g}",
        }
        if self.cluster.pod_cidr:
            env["SLIPSTREAM_ENGINE_NETWORKS"] = self.cluster.pod_cidr
        env.update(self.options.operator_env)
        return env

    def stop_operator(self) -> None:
        operator, self.operator = self.operator, None
        if operator is not None:
            operator.stop()

    def stop(self) -> None:
        """Stop every part, newest first; safe to call more than once."""
        errors: list[BaseException] = []
        steps = [self.stop_operator, self._stop_runner, self._stop_prometheus]
        if self.owns_cluster:
            steps.append(self.cluster.stop)
        elif self._installed:
            steps.append(self.uninstall_chart)
        for stop in steps:
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest, then report
                errors.append(exc)
        if errors:
            raise errors[0]

    def _stop_runner(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.stop()

    def _stop_prometheus(self) -> None:
        prometheus, self.prometheus = self.prometheus, None
        if prometheus is not None:
            prometheus.stop()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # what others read

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def pids(self) -> dict[str, int]:
        """Every process of the stack by name (each also its process group's id)."""
        pids = dict(self.cluster.pids)
        pid = getattr(self.prometheus, "pid", None)
        if pid is not None:
            pids["prometheus"] = int(pid)
        if self.operator is not None:
            pids["operator"] = self.operator.pid
        if self.runner is not None:
            for sim in self.runner.simulators():
                pids[f"engine-sim {sim['pod']}"] = sim["pid"]
        return pids

    def describe(self) -> dict[str, Any]:
        """Plain facts for a state file and `cluster status`."""
        return {
            "server": self.cluster.server,
            "kubeconfig": str(self.cluster.kubeconfig),
            "bin_dir": str(self.cluster.bin_dir),
            "pod_cidr": self.cluster.pod_cidr,
            "prometheus_url": self.prometheus.url if self.prometheus is not None else None,
            "operator_log": str(self.operator.log_path) if self.operator is not None else None,
            "operator_ready_url": self.operator_ready_url,
            "operator_metrics_url": self.operator_metrics_url,
            "logs": str(self.cluster.log_dir),
            "time_scale": self.options.time_scale,
        }


def _component_part(cluster: cluster_mod.Cluster, name: str) -> restarts.Part:
    """A control-plane component as a Part: Cluster.restart starts it with the same command
    line, ports and data (etcd's members, the apiserver's certificates) and waits for health."""

    def restart() -> None:
        cluster.restart(name)

    return restarts.Part(name, lambda: cluster.pids.get(name), lambda: cluster.running(name), restart)


def write_env_file(path: Path, env: Mapping[str, str], argv: Sequence[str]) -> None:
    """``KEY='value'`` lines a shell can source (``set -a; . FILE; set +a``), the command
    line in a comment above them. Only paths and settings: the token is in the kubeconfig
    file it names, whose mode is the owner's alone."""
    lines = [
        "# The operator of this local cluster: its environment beyond the inherited one.",
        "# To run it by hand (`slipstream cluster restart operator` restarts the supervised one):",
        "#   set -a; . " + shlex.quote(str(path)) + "; set +a",
        "#   " + shlex.join(argv),
        *(f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())),
    ]
    path.write_text("\n".join(lines) + "\n")


def operator_target(metrics_port: int) -> prom_mod.StaticTarget:
    """The operator's metrics as a scrape target. Its own labels are kept (honor_labels):
    `slipstream_rollouts_total{namespace}` and the per-deployment gauges name the served
    namespace, which a target label would rename to exported_namespace."""
    return prom_mod.StaticTarget(
        address=f"{ports.LOOPBACK}:{metrics_port}", namespace=RELEASE_NAMESPACE, pod="operator",
        servingdeployment="", extra_labels={"component": OPERATOR_COMPONENT}, honor_labels=True,
    )  # fmt: skip


def start_prometheus(
    cluster: cluster_mod.Cluster, options: StackOptions, operator: OperatorPorts | None = None
) -> PrometheusHandle:
    """Prometheus scraping every engine pod each second, found through the apiserver
    (localkube.prometheus with its pod discovery: the pod role of kubernetes_sd), and the
    operator's own metrics when it runs (the dashboard's operator panels)."""
    namespaces = (options.engine_namespace,) if options.engine_namespace else ()
    return prom_mod.PrometheusServer.start(
        cluster.workdir / "prometheus",
        scrape_interval_s=SCRAPE_INTERVAL_S,
        static=[operator_target(operator.metrics)] if operator is not None else (),
        discovery=prom_mod.PodDiscovery(kubeconfig=cluster.kubeconfig, namespaces=namespaces),
        port=options.prometheus_port,
    )
