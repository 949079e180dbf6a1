"""The engine-pod runner: one engine simulator process per engine pod, on the pod's own IP.

kwok reports pods Running and Ready without running anything. For the closed
loop the engine pods must answer requests, serve /metrics and take setting
changes, so this runner plays the kubelet's container runtime for them: it
polls the apiserver for pods of ServingDeployments (label
``serving.slipstream.dev/name``) and, for each Running pod with an IP, starts
``slipstream engine-sim`` with the pod's container arguments, translated the
way a kubelet would hand them to the container:

1. the container's ``env`` is resolved: literal ``value``s, and
   ``configMapKeyRef`` / ``secretKeyRef`` read through the apiserver (a
   missing object or key leaves the pod without a simulator, as the kubelet
   leaves such a container in CreateContainerConfigError, and is retried);
2. ``$(VAR)`` in the arguments is expanded from that env with Kubernetes'
   rules (``$$`` is a literal ``$``; an undefined reference stays as written);
3. ``--host`` becomes the pod's IP (the engine binds 0.0.0.0 in its pod's own
   network namespace; here every pod shares the host's, so each binds its own
   address), ``--port`` stays the container port, and ``--time-scale S``
   and ``--pod-name NS/NAME`` are added. The simulator accepts the engine's
   launch flags (it ignores, with one line, those it has no use for). The
   resolved env is the process's env, so the admin key reaches it as
   ``SLIPSTREAM_ADMIN_API_KEY``, never on a command line: a stray
   ``--admin-api-key VALUE`` is dropped from the arguments.

Only loopback pod IPs are ever used: a pod whose IP is outside 127.0.0.0/8
gets no simulator (and one warning), so nothing here can listen on, or send
traffic to, a routable address. The cluster's pod CIDR is a loopback range of
its own (see localkube.podcidr).

As a kubelet resolves a container's env once, when it starts the container, the
runner resolves a pod's env only to start its simulator: a running simulator is
kept while its pod exists and runs, whatever happens to the ConfigMaps and
Secrets its env came from (``keeps``). Deleting the owned ConfigMap once stopped
and restarted every simulator of the deployment, though no pod changed (issue 40).

A simulator that exits while its pod still runs is started again, after the
kubelet-like backoff of localkube.restarts, and the restart counted (``restarts()``): the closed-loop test asserts the count stays
zero, as it asserts the pods' UIDs and restart counts do. When the pod is
deleted (or stops Running) its simulator is stopped. A pod is ready when its
simulator answers ``/health``; ``ready_urls()`` lists the ready pods of a
selector: the load generator's stand-in for kube-proxy, because the apiserver
refuses loopback addresses in EndpointSlices, so an engine Service has no
endpoints here.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slipstream.localkube import processes, restarts

log = logging.getLogger(__name__)

ENGINE_LABEL = "serving.slipstream.dev/name"
"""Label the operator puts on every engine pod (the ServingDeployment's name)."""

SIMULATOR_COMMAND = (sys.executable, "-m", "slipstream.cli", "engine-sim")
"""The engine simulator (``slipstream engine-sim``), run by this interpreter."""

POLL_S = 0.5
"""Seconds between passes over the pod list: a new pod serves within ~1 s."""

HEALTH_TIMEOUT_S = 1.0
"""Timeout of one /health probe; the simulator answers in milliseconds."""

RESTART_BACKOFF = restarts.RestartBackoff()
"""Delay before a simulator that exited is started again, as the supervisor's for its
components and the kubelet's for a container: 1 s, doubling within a crash loop up to
60 s (a crash loop must not eat the CPU the rest of the loop needs)."""

DROPPED_FLAGS = {"--admin-api-key": 1}
"""Flags removed from the arguments (with their value count): the admin key
goes through the environment only (INTERFACES C)."""

_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


class PodConfigError(RuntimeError):
    """A pod's env refers to a ConfigMap, Secret or key that does not exist (yet)."""


# -- pure translation ------------------------------------------------------------------


def expand(value: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` as the kubelet does: ``$$`` -> ``$``, unknown references kept."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REF.sub(one, value)


Lookup = Callable[[str, str, str], Mapping[str, str] | None]
"""(kind "configmaps" | "secrets", namespace, name) -> the object's data (Secret values
decoded), or None when it does not exist."""


def container_env(container: Mapping[str, Any], namespace: str, lookup: Lookup) -> dict[str, str]:
    """The container's environment, references resolved and ``$(VAR)`` expanded in order."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = expand(str(var["value"]), env)
            continue
        source = var.get("valueFrom", {})
        for ref_key, kind in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            ref = source.get(ref_key)
            if ref is None:
                continue
            data = lookup(kind, namespace, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    break
                what = "key " + ref["key"] + " of " if data is not None else ""
                raise PodConfigError(
                    f"env {name}: {what}{kind[:-1]} {namespace}/{ref['name']} not found"
                )
            env[name] = data[ref["key"]]
            break
        else:
            if source:  # fieldRef, resourceFieldRef: nothing an engine here reads
                log.debug("podrunner: env %s: unsupported source %s, left unset", name, source)
    return env


def engine_port(container: Mapping[str, Any]) -> int:
    """The container's first port (the engine's HTTP port)."""
    ports = container.get("ports") or []
    if not ports:
        raise PodConfigError(f"container {container.get('name')} declares no port")
    return int(ports[0]["containerPort"])


def simulator_args(
    args: Sequence[str], env: Mapping[str, str], ip: str, port: int
) -> list[str]:
    """The engine's launch arguments, expanded and bound to the pod's ``ip:port``."""
    out: list[str] = []
    expanded = [expand(a, env) for a in args]
    skip = 0
    for arg in expanded:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in DROPPED_FLAGS:
            skip = 0 if "=" in arg else DROPPED_FLAGS[name]
            continue
        if name in ("--host", "--port"):
            skip = 0 if "=" in arg else 1
            continue
        out.append(arg)
    return ["--host", ip, "--port", str(port), *out]


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SimSpec:
    """What to run for one pod: the simulator's argv and env, and where it listens."""

    namespace: str
    name: str
    uid: str
    ip: str
    port: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"


def plan(
    pod: Mapping[str, Any],
    lookup: Lookup,
    *,
    time_scale: float,
    command: Sequence[str] = SIMULATOR_COMMAND,
    extra_args: Sequence[str] = (),
) -> SimSpec | None:
    """The simulator a pod should have, or None (not Running, no IP yet, being deleted).

    Raises PodConfigError when the pod's env cannot be resolved, and ValueError
    for a non-loopback IP (never bound).
    """
    meta, status = pod["metadata"], pod.get("status", {})
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return None
    ip = status.get("podIP")
    if not ip:
        return None
    if not is_loopback(ip):
        raise ValueError(
            f"pod {meta['namespace']}/{meta['name']} has IP {ip}, outside 127.0.0.0/8:"
            " only loopback addresses are bound (start kwok with a loopback --cidr)"
        )
    container = pod["spec"]["containers"][0]
    env = container_env(container, meta["namespace"], lookup)
    port = engine_port(container)
    args = simulator_args(container.get("args", []), env, ip, port)
    args += ["--time-scale", f"{time_scale:g}", "--pod-name", f"{meta['namespace']}/{meta['name']}"]
    return SimSpec(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta["uid"],
        ip=ip,
        port=port,
        argv=(*command, *args, *extra_args),
        env=env,
    )


def keeps(pod: Mapping[str, Any], spec: SimSpec) -> bool:
    """Whether the simulator started as ``spec`` goes on running for ``pod``: the same pod
    (UID), still Running on the same IP and not being deleted. Its env is not read again:
    a kubelet reads env only when a container starts."""
    meta, status = pod["metadata"], pod.get("status", {})
    return (
        meta.get("uid") == spec.uid
        and not meta.get("deletionTimestamp")
        and status.get("phase") == "Running"
        and status.get("podIP") == spec.ip
    )


# -- the runner ------------------------------------------------------------------------


@dataclass
class _Running:
    spec: SimSpec
    component: processes.Component
    ready: bool = False
    restarts: int = 0
    exited_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)
    delay_s: float | None = None


class PodRunner:
    """Keeps one engine simulator per running engine pod, until stop().

    ``get_json(path)`` reads the apiserver (Cluster.get_json). ``namespace``
    limits the runner to one namespace (None: every namespace). The simulators'
    logs go to ``log_dir/<namespace>.<pod>.log``; ``state_path`` (optional)
    gets a JSON summary after every pass, for ``slipstream cluster status``.
    """

    def __init__(
        self,
        get_json: Callable[[str], Any],
        log_dir: Path,
        *,
        time_scale: float = 1.0,
        namespace: str | None = None,
        command: Sequence[str] = SIMULATOR_COMMAND,
        extra_args: Sequence[str] = (),
        base_env: Mapping[str, str] | None = None,
        state_path: Path | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self._get_json = get_json
        self.log_dir = log_dir
        self.time_scale = time_scale
        self.namespace = namespace
        self.command = tuple(command)
        self.extra_args = tuple(extra_args)
        self.base_env = dict(base_env) if base_env is not None else _base_env()
        self.state_path = state_path
        self.poll_s = poll_s
        self._running: dict[str, _Running] = {}  # by pod UID
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self.errors = 0

    # life cycle

    def start(self) -> PodRunner:
        """Run passes in a background thread until stop(); again after the thread died."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="podrunner", daemon=True)
        self._thread.start()
        return self

    def running(self) -> bool:
        """Whether the thread that keeps the simulators runs (a supervisor restarts it if not)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the thread and every simulator; return once they are gone."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            running, self._running = self._running, {}
        for entry in running.values():
            entry.component.stop()
        self._write_state()

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # noqa: BLE001 - one bad pass must not end the runner
                self.errors += 1
                log.warning("podrunner: pass failed: %s", exc)
            self._stopping.wait(self.poll_s)

    # one pass

    def sync_once(self) -> None:
        """Bring the simulators in line with the pods, once."""
        pods = self._list_pods()
        wanted: dict[str, SimSpec] = {}
        with self._lock:
            started = {uid: entry.spec for uid, entry in self._running.items()}
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if uid in started and keeps(pod, started[uid]):
                wanted[uid] = started[uid]  # running: its env was read when it started
                continue
            try:
                spec = plan(
                    pod,
                    self._lookup,
                    time_scale=self.time_scale,
                    command=self.command,
                    extra_args=self.extra_args,
                )
            except (PodConfigError, ValueError) as exc:
                self._warn_once(uid, str(exc))
                continue
            if spec is not None:
                wanted[uid] = spec
        with self._lock:
            for uid in [u for u in self._running if u not in wanted]:
                entry = self._running.pop(uid)
                log.info("podrunner: %s gone, stopping its simulator", entry.spec.key)
                entry.component.stop()
            for uid, spec in wanted.items():
                entry = self._running.get(uid)
                if entry is None:
                    self._running[uid] = _Running(spec, self._launch(spec))
                    log.info("podrunner: %s: simulator on %s", spec.key, spec.url)
                else:
                    self._keep_alive(entry)
            entries = list(self._running.values())
        for entry in entries:
            if not entry.ready and entry.component.running():
                entry.ready = _healthy(entry.spec.url)
        self._write_state()

    def _keep_alive(self, entry: _Running) -> None:
        if entry.component.running():
            return
        now = time.monotonic()
        if entry.exited_at is None:
            entry.exited_at = now
            entry.ready = False
            entry.delay_s = RESTART_BACKOFF.next_delay(entry.delay_s, now - entry.started_at)
            log.warning(
                "podrunner: %s: simulator exited; restarting it in %.0f s; last lines:\n%s",
                entry.spec.key,
                entry.delay_s,
                entry.component.log_tail(10),
            )
            return
        if now - entry.exited_at >= (entry.delay_s or 0.0):
            entry.component.stop()  # reap it and anything left in its group
            entry.component = self._launch(entry.spec)
            entry.restarts += 1
            entry.exited_at = None
            entry.started_at = now

    def _launch(self, spec: SimSpec) -> processes.Component:
        env = {**self.base_env, **spec.env}
        path = self.log_dir / f"{spec.namespace}.{spec.name}.log"
        return processes.Component(f"engine-sim {spec.key}", spec.argv, path, env=env)

    def _list_pods(self) -> list[dict[str, Any]]:
        selector = urllib.parse.quote(ENGINE_LABEL)
        where = f"/namespaces/{self.namespace}" if self.namespace else ""
        return list(self._get_json(f"/api/v1{where}/pods?labelSelector={selector}")["items"])

    def _lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            obj = self._get_json(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        data = dict(obj.get("data") or {})
        if kind == "secrets":
            return {k: base64.b64decode(v).decode() for k, v in data.items()}
        return data

    def _warn_once(self, uid: str, message: str) -> None:
        key = f"{uid}:{message}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning("podrunner: %s", message)

    # what others read

    def restarts(self) -> dict[str, int]:
        """Restarts of each running pod's simulator, by ``namespace/name``."""
        with self._lock:
            return {e.spec.key: e.restarts for e in self._running.values()}

    def simulators(self) -> list[dict[str, Any]]:
        """One plain record per simulator (pod, uid, url, pid, ready, restarts)."""
        with self._lock:
            return [
                {
                    "pod": e.spec.key,
                    "uid": e.spec.uid,
                    "url": e.spec.url,
                    "pid": e.component.pid,
                    "ready": e.ready,
                    "restarts": e.restarts,
                }
                for e in self._running.values()
            ]

    def _write_state(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"simulators": self.simulators()}, indent=1))
        tmp.replace(self.state_path)


class ServiceTargets:
    """The ready engine pods behind a Service, as base URLs: the test's kube-proxy.

    The apiserver refuses loopback addresses in EndpointSlices, so an engine
    Service here has no endpoints. A call lists the pods matching the Service's
    selector through the apiserver and keeps those that are Running with a
    loopback IP and answer ``/health`` on their container port; the answer is
    reused for ``refresh_s`` seconds, so the load generator may call it per
    request. Works from any process (it needs no PodRunner).
    """

    def __init__(
        self,
        get_json: Callable[[str], Any],
        namespace: str,
        selector: Mapping[str, str],
        *,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get_json = get_json
        self.namespace = namespace
        self.selector = dict(selector)
        self.refresh_s = refresh_s
        self._clock = clock
        self._urls: list[str] = []
        self._at: float | None = None

    def __call__(self) -> list[str]:
        now = self._clock()
        if self._at is None or now - self._at >= self.refresh_s:
            try:
                self._urls = self.refresh()
            except OSError as exc:  # apiserver away for a moment: keep the last answer
                log.debug("podrunner: listing %s/%s: %s", self.namespace, self.selector, exc)
            self._at = now
        return list(self._urls)

    def refresh(self) -> list[str]:
        query = urllib.parse.quote(",".join(f"{k}={v}" for k, v in sorted(self.selector.items())))
        pods = self._get_json(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={query}")
        urls = []
        for pod in pods["items"]:
            status = pod.get("status", {})
            ip = status.get("podIP", "")
            if pod["metadata"].get("deletionTimestamp") or status.get("phase") != "Running":
                continue
            if not is_loopback(ip):
                continue
            url = f"http://{ip}:{engine_port(pod['spec']['containers'][0])}"
            if _healthy(url):
                urls.append(url)
        return sorted(urls)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=HEALTH_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _base_env() -> dict[str, str]:
    """The host environment the simulators start from, minus what must not leak in.

    A user's KUBECONFIG or admin key has no business in a simulated engine; the
    pod's own env (applied on top) is what the engine would see.
    """
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "SLIPSTREAM_ADMIN_API_KEY")
    }
