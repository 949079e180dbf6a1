"""A real Kubernetes control plane on loopback ports, for tests and the demo.

``Cluster.start(workdir)`` brings up etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (in that order, each polled
healthy before the next starts), registers simulated GPU nodes and waits until
kwok reports them Ready, writes an admin kubeconfig, and returns a handle with
kubectl/helm helpers. ``stop()`` (or leaving the ``with`` block) shuts them
down in reverse order and leaves no process behind.

Objects are stored, validated, authorized and garbage-collected exactly as on
a real cluster, and workloads go through the real path: the deployment and
replicaset controllers create pods, the scheduler binds them to nodes by their
requests (GPUs included), and kwok, acting as every node's kubelet, marks them
Running and Ready without running a container. Rollouts and Deployment
availability are therefore real; anything that needs a process in the pod
(probes, logs, exec, traffic) is not.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from slipstream.localkube import (
    apiread,
    binaries,
    components,
    health,
    kubeconfig,
    nodes,
    pki,
    podcidr,
    ports,
    processes,
)

log = logging.getLogger(__name__)

ETCD_READY_S = 30.0
"""Deadline for etcd's /health; it is usually up in well under a second."""

APISERVER_READY_S = 90.0
"""Deadline for the apiserver's /readyz: bootstrapping RBAC roles, priority
levels and CRD informers takes ~5-15 s on a loaded two-core CI machine."""

CONTROLLER_MANAGER_READY_S = 60.0
"""Deadline for the controller manager's /healthz."""

SCHEDULER_READY_S = 60.0
"""Deadline for the scheduler's /readyz (informer caches synced)."""

KWOK_READY_S = 60.0
"""Deadline for kwok's /healthz; it first waits for the apiserver itself."""

NODES_READY_S = 60.0
"""Deadline for every registered node to be Ready (kwok) and untainted (node
lifecycle controller); ~1-2 s when idle."""

NODE_POLL_S = 0.2
"""Seconds between reads of the node list while waiting for Ready."""

START_ATTEMPTS = 3
"""Start-ups retried when a component lost the race for its port (see ports)."""

COMMAND_TIMEOUT_S = 120.0
"""Upper bound on one kubectl/helm call, so a hung call fails the test instead
of hanging the whole run."""

TOKEN_DURATION = "24h"
"""Lifetime of tokens from token_kubeconfig(): longer than any test session."""

ADMIN_USER = "localkube-admin"
ADMIN_GROUP = "system:masters"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"
KWOK_USER = "kwok-controller"
"""kwok stands in for every node's kubelet and more (it writes node and pod status,
leases, pod deletions): like kwokctl's set-up it gets cluster-admin rights."""


@dataclass(frozen=True)
class Probe:
    """How to tell that a component is up: its health URL and what it must answer."""

    url: str
    deadline_s: float
    context: ssl.SSLContext | None = None
    expect: str | None = None

    def wait(self, component: processes.Component) -> None:
        health.wait_healthy(
            component, self.url, deadline_s=self.deadline_s, context=self.context, expect=self.expect
        )


class Cluster:
    """Handle on a running local control plane.

    Attributes:
        kubeconfig: admin kubeconfig (client certificate in group system:masters).
        server: the apiserver's https URL on 127.0.0.1.
        bin_dir: directory of the binaries (etcd, kube-apiserver, kubectl, helm, ...).
        workdir: the cluster's files: certificates, etcd data, logs, kubeconfigs.
    """

    kubeconfig: Path
    server: str
    bin_dir: Path
    workdir: Path

    def __init__(
        self,
        *,
        workdir: Path,
        bin_dir: Path,
        server: str,
        kubeconfig_path: Path,
        ca_pem: bytes,
        running: list[processes.Component],
        node_names: list[str] | None = None,
        pod_cidr: podcidr.PodCidrLease | None = None,
        admin_context: ssl.SSLContext | None = None,
        probes: dict[str, Probe] | None = None,
    ) -> None:
        """Wrap already running components; use Cluster.start() to make one."""
        self._probes = dict(probes or {})
        self._node_names = list(node_names or [])
        self._pod_cidr = pod_cidr
        self._reader = (
            apiread.ApiReader(server, admin_context) if admin_context is not None else None
        )
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.server = server
        self.kubeconfig = kubeconfig_path
        self._ca_pem = ca_pem
        self._components = running
        # A script or demo that forgets stop() (or dies on an exception) must
        # not leave an apiserver running after the interpreter exits.
        atexit.register(self.stop)

    # -- life cycle ---------------------------------------------------------

    @classmethod
    def start(
        cls,
        workdir: Path,
        bin_dir: Path | None = None,
        *,
        node_pools: Sequence[nodes.NodePool] = nodes.DEFAULT_POOLS,
    ) -> Cluster:
        """Start a cluster whose files live in ``workdir`` (created if missing).

        ``bin_dir`` defaults to default_bin_dir(). The simulated 8-GPU
        nodes of ``node_pools`` (see localkube.nodes) are Ready when this
        returns; with none, pods stay Pending. Raises BinariesMissingError
        if the binaries are not built, and ComponentError (with the failing
        component's log tail) if a component exits or is not healthy in time.
        The result is also a context manager that stops the cluster on exit.
        """
        bin_dir = bin_dir if bin_dir is not None else binaries.default_bin_dir()
        binaries.require(bin_dir)
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        certs, ca = _make_certs(workdir / "pki")
        cidr = podcidr.lease()
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    return cls._start_once(workdir, bin_dir, certs, ca, tuple(node_pools), cidr)
                except processes.ComponentError as exc:
                    if ports.ADDRESS_IN_USE not in str(exc) or attempt == START_ATTEMPTS:
                        raise
                    log.warning("localkube: a port was taken, retrying start-up (%s)", attempt)
        except BaseException:
            cidr.release()
            raise
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(
        cls,
        workdir: Path,
        bin_dir: Path,
        certs: components.Certs,
        ca: pki.CertificateAuthority,
        node_pools: tuple[nodes.NodePool, ...],
        cidr: podcidr.PodCidrLease,
    ) -> Cluster:
        port_list = ports.free_ports(6)
        port = components.Ports(*port_list)
        server = f"https://{ports.LOOPBACK}:{port.apiserver}"
        logs = workdir / "logs"
        etcd_data = workdir / "etcd-data"
        # A retry after a lost port race must not find the last attempt's
        # member (with other peer URLs) in the data directory.
        shutil.rmtree(etcd_data, ignore_errors=True)
        running: list[processes.Component] = []
        probes: dict[str, Probe] = {}
        t0 = time.monotonic()

        def launch(
            name: str,
            argv: list[str],
            url: str,
            deadline_s: float,
            *,
            context: ssl.SSLContext | None = None,
            expect: str | None = None,
            env: dict[str, str] | None = None,
        ) -> processes.Component:
            """Start one component and wait until its health endpoint says ready."""
            component = processes.Component(name, argv, logs / f"{name}.log", env=env)
            running.append(component)
            probes[name] = Probe(url, deadline_s, context, expect)
            probes[name].wait(component)
            log.info("localkube: %s healthy after %.1fs", name, time.monotonic() - t0)
            return component

        def cert_kubeconfig(name: str, user: str, client: pki.KeyPair) -> Path:
            return kubeconfig.write(
                workdir / f"{name}.kubeconfig",
                server=server,
                ca_pem=ca.cert_pem,
                user=user,
                client_cert_pem=client.cert.read_bytes(),
                client_key_pem=client.key.read_bytes(),
            )

        admin = ca.issue("admin", ADMIN_USER, organization=ADMIN_GROUP, client=True)
        kcm_client = ca.issue("controller-manager-client", CONTROLLER_MANAGER_USER, client=True)
        scheduler_client = ca.issue("scheduler-client", SCHEDULER_USER, client=True)
        kwok_client = ca.issue("kwok-client", KWOK_USER, organization=ADMIN_GROUP, client=True)
        admin_context = _client_context(certs.ca, admin)
        try:
            launch(
                "etcd",
                components.etcd(bin_dir, etcd_data, port),
                f"http://{ports.LOOPBACK}:{port.etcd_client}/health",
                ETCD_READY_S,
                expect='"health":"true"',
            )
            launch(
                "kube-apiserver",
                components.apiserver(bin_dir, workdir / "apiserver", certs, port),
                f"{server}/readyz",
                APISERVER_READY_S,
                context=admin_context,
            )
            admin_kubeconfig = cert_kubeconfig("admin", ADMIN_USER, admin)
            kcm_kubeconfig = cert_kubeconfig(
                "controller-manager", CONTROLLER_MANAGER_USER, kcm_client
            )
            launch(
                "kube-controller-manager",
                components.controller_manager(bin_dir, kcm_kubeconfig, certs, port),
                f"https://{ports.LOOPBACK}:{port.controller_manager}/healthz",
                CONTROLLER_MANAGER_READY_S,
                context=_client_context(certs.ca, None),
            )
            scheduler_kubeconfig = cert_kubeconfig("scheduler", SCHEDULER_USER, scheduler_client)
            scheduler_config = workdir / "scheduler-config.json"
            scheduler_config.write_text(components.scheduler_config(scheduler_kubeconfig))
            launch(
                "kube-scheduler",
                components.scheduler(bin_dir, scheduler_config, scheduler_kubeconfig, certs, port),
                f"https://{ports.LOOPBACK}:{port.scheduler}/readyz",
                SCHEDULER_READY_S,
                context=_client_context(certs.ca, None),
            )
            kwok_home = workdir / "kwok-home"
            kwok_home.mkdir(exist_ok=True)
            kwok = launch(
                "kwok",
                components.kwok(
                    bin_dir, cert_kubeconfig("kwok", KWOK_USER, kwok_client), port, cidr.cidr
                ),
                f"http://{ports.LOOPBACK}:{port.kwok}/healthz",
                KWOK_READY_S,
                # kwok also reads ~/.kwok/kwok.yaml when it exists: a HOME of its
                # own keeps a developer's kwok configuration out of the tests.
                env={**os.environ, "HOME": str(kwok_home)},
            )
            cluster = cls(
                workdir=workdir,
                bin_dir=bin_dir,
                server=server,
                kubeconfig_path=admin_kubeconfig,
                ca_pem=ca.cert_pem,
                running=running,
                node_names=nodes.names(node_pools),
                pod_cidr=cidr,
                admin_context=admin_context,
                probes=probes,
            )
        except BaseException:
            _stop_all(running)
            raise
        try:
            cluster._register_nodes(node_pools, kwok, admin_context)
        except BaseException:
            cluster.stop()
            raise
        log.info(
            "localkube: %d node(s) Ready after %.1fs",
            len(cluster.node_names),
            time.monotonic() - t0,
        )
        return cluster

    def _register_nodes(
        self,
        pools: tuple[nodes.NodePool, ...],
        kwok: processes.Component,
        context: ssl.SSLContext,
    ) -> None:
        """Create the simulated nodes and wait until each one is Ready and untainted."""
        if not self._node_names:
            return
        self.kubectl("create", "-f", "-", input=json.dumps(nodes.list_manifest(pools)))
        url = f"{self.server}/api/v1/nodes"
        deadline = time.monotonic() + NODES_READY_S
        waiting = list(self._node_names)
        while True:
            kwok.check_alive()
            try:
                with urllib.request.urlopen(
                    url, timeout=health.REQUEST_TIMEOUT_S, context=context
                ) as response:
                    waiting = nodes.not_schedulable(json.load(response), self._node_names)
            except (OSError, ssl.SSLError) as exc:  # a slow answer: ask again
                log.debug("localkube: listing nodes: %s", exc)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise kwok.failure(
                    f"node(s) {', '.join(waiting)} not Ready and untainted"
                    f" within {NODES_READY_S:.0f}s"
                )
            time.sleep(NODE_POLL_S)

    def stop(self) -> None:
        """Stop every component, newest first; safe to call more than once."""
        atexit.unregister(self.stop)
        running, self._components = self._components, []
        try:
            _stop_all(running)
        finally:
            if self._pod_cidr is not None:
                self._pod_cidr.release()

    def restart(self, name: str) -> float:
        """Stop one component (``etcd``, ``kube-apiserver``, ``kube-controller-manager``,
        ``kube-scheduler``, ``kwok``) and start it again with the same command line, ports
        and data; return once it is healthy, with the seconds it was down.

        For fault tests: clients of a restarted apiserver or etcd must ride it out.
        """
        found = [i for i, c in enumerate(self._components) if c.name == name]
        if not found or name not in self._probes:
            known = ", ".join(c.name for c in self._components)
            raise ValueError(f"no component {name!r} to restart (running: {known})")
        old = self._components[found[0]]
        t0 = time.monotonic()
        old.stop()
        new = processes.Component(name, old.argv, old.log_path, env=old.env)
        self._components[found[0]] = new
        self._probes[name].wait(new)
        log.info("localkube: %s restarted, down %.1fs", name, time.monotonic() - t0)
        return time.monotonic() - t0

    def running(self, name: str) -> bool:
        """Whether component ``name`` runs now (asking reaps it if it has exited)."""
        return any(c.running() for c in self._components if c.name == name)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running components by name (empty once stopped)."""
        return {component.name: component.pid for component in self._components}

    @property
    def node_names(self) -> list[str]:
        """Names of the simulated nodes kwok manages (see localkube.nodes)."""
        return list(self._node_names)

    @property
    def pod_cidr(self) -> str | None:
        """The loopback range kwok gives pod IPs from (see localkube.podcidr)."""
        return self._pod_cidr.cidr if self._pod_cidr is not None else None

    @property
    def log_dir(self) -> Path:
        """Directory of the components' logs (one file each)."""
        return self.workdir / "logs"

    # -- clients ------------------------------------------------------------

    @property
    def reader(self) -> apiread.ApiReader:
        """The admin's apiserver reader (GET, parsed JSON)."""
        if self._reader is None:
            raise RuntimeError("this Cluster handle has no admin credentials")
        return self._reader

    def get_json(self, path: str) -> Any:
        """GET ``path`` (e.g. ``/api/v1/pods``) from the apiserver as the admin; parsed JSON.

        For the in-process helpers that poll often (see localkube.apiread).
        """
        return self.reader.get_json(path)

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (admin unless ``kubeconfig`` is given).

        Output is captured as text; with ``check`` a non-zero exit raises
        CommandError, whose message includes kubectl's stderr.
        """
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}"]
        return self._run([*argv, *args], check=check, input=input)

    def helm(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster, with its cache and config in the workdir."""
        argv = [str(self.bin_dir / "helm"), f"--kubeconfig={kubeconfig or self.kubeconfig}"]
        return self._run([*argv, *args], check=check, input=None)

    def token_kubeconfig(self, namespace: str, service_account: str) -> Path:
        """A kubeconfig that authenticates as ``namespace/service_account``.

        The token comes from ``kubectl create token`` (the TokenRequest API), so
        the kubeconfig sees exactly what RBAC grants that ServiceAccount.
        """
        token = self.kubectl(
            "create",
            "token",
            service_account,
            f"--namespace={namespace}",
            f"--duration={TOKEN_DURATION}",
        ).stdout.strip()
        user = f"system:serviceaccount:{namespace}:{service_account}"
        return kubeconfig.write(
            self.workdir / "kubeconfigs" / f"{namespace}.{service_account}.kubeconfig",
            server=self.server,
            ca_pem=self._ca_pem,
            user=user,
            token=token,
            namespace=namespace,
        )

    def _run(
        self, argv: list[str], *, check: bool, input: str | None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            env=self._client_env(),
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        if check and result.returncode != 0:
            raise CommandError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def _client_env(self) -> dict[str, str]:
        # Discovery caches and helm state go to the workdir, not the user's
        # home: parallel clusters must not share a stale discovery cache.
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        env["KUBECACHEDIR"] = str(self.workdir / "kube-cache")
        for kind in ("CACHE", "CONFIG", "DATA"):
            env[f"HELM_{kind}_HOME"] = str(self.workdir / "helm" / kind.lower())
        return env


class CommandError(subprocess.CalledProcessError):
    """A kubectl or helm call failed; unlike its base, str() shows stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr:\n{self.stderr}"


def _make_certs(directory: Path) -> tuple[components.Certs, pki.CertificateAuthority]:
    ca = pki.CertificateAuthority(directory)
    certs = components.Certs(
        ca=ca.pair,
        apiserver=ca.issue("apiserver", "kube-apiserver", server_hosts=components.APISERVER_HOSTS),
        front_proxy_client=ca.issue(
            "front-proxy-client", components.FRONT_PROXY_CLIENT, client=True
        ),
        controller_manager_serving=ca.issue(
            "controller-manager-serving",
            "kube-controller-manager",
            server_hosts=(ports.LOOPBACK, "localhost"),
        ),
        scheduler_serving=ca.issue(
            "scheduler-serving", "kube-scheduler", server_hosts=(ports.LOOPBACK, "localhost")
        ),
        service_account=pki.service_account_keys(directory),
    )
    return certs, ca


def _client_context(ca: pki.KeyPair, client: pki.KeyPair | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def _stop_all(running: list[processes.Component]) -> None:
    """Stop components newest first; stop every one even if one fails."""
    errors: list[processes.ComponentError] = []
    for component in reversed(running):
        try:
            component.stop()
        except processes.ComponentError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
