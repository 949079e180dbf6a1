"""Engine-pod discovery for Prometheus, served over HTTP service discovery.

Debian's Prometheus 2.42 package is built without the Kubernetes discovery plugin (its
``+ds`` build keeps file, HTTP and DNS discovery; a ``kubernetes_sd_configs`` block is a
config error: "field kubernetes_sd_configs not found"). So the local stack does what
``kubernetes_sd`` with the pod role and our relabeling would do, in a few lines: Prometheus
polls ``http_sd_configs`` every scrape interval, and each poll lists the pods through the
apiserver (a kubeconfig's credentials) and answers the target groups:

- only pods carrying the label ``serving.slipstream.dev/name`` (the ServingDeployment),
- only in phase Running with a pod IP,
- one target per container port named ``http`` (the engine's), at ``podIP:port``,
- labels ``namespace``, ``pod`` and ``servingdeployment`` (INTERFACES.md section E).

``targets`` is pure (pods in, target groups out); ``DiscoveryServer`` is the HTTP edge. An
apiserver error answers 500, and Prometheus then keeps the targets it had.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client, config

from slipstream.localkube import ports

NAME_LABEL = "serving.slipstream.dev/name"
"""The pod label naming the ServingDeployment (controller/objects.NAME_LABEL)."""


def targets(
    pods: Iterable[Mapping[str, Any]], *, port_name: str = "http", metrics_path: str = "/metrics"
) -> list[dict[str, Any]]:
    """Prometheus HTTP-SD target groups for the engine pods among ``pods`` (raw API dicts)."""
    groups: list[dict[str, Any]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if NAME_LABEL not in labels or status.get("phase") != "Running" or not ip:
            continue
        for container in (pod.get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                if port.get("name") != port_name or not port.get("containerPort"):
                    continue
                groups.append({
                    "targets": [f"{ip}:{port['containerPort']}"],
                    "labels": {
                        "namespace": meta.get("namespace", ""),
                        "pod": meta.get("name", ""),
                        "servingdeployment": labels[NAME_LABEL],
                        "__metrics_path__": metrics_path,
                    },
                })
    return groups


class DiscoveryServer:
    """Answers Prometheus's HTTP-SD polls with the engine pods the apiserver lists now."""

    def __init__(
        self,
        kubeconfig: Path,
        *,
        namespaces: Sequence[str] = (),
        port_name: str = "http",
        metrics_path: str = "/metrics",
    ) -> None:
        api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self._api = client.CoreV1Api(api_client)
        self._namespaces = tuple(namespaces)
        self._port_name = port_name
        self._metrics_path = metrics_path
        discovery = self

        class DiscoveryHandler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                try:
                    body, status = json.dumps(discovery.groups()).encode(), 200
                except Exception as exc:  # noqa: BLE001 - any apiserver failure: keep old targets
                    body, status = f"listing pods failed: {exc}".encode(), 500
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    # Prometheus gave up on this poll (its SD timeout, while the apiserver or
                    # etcd is down) and asks again at its next refresh: nothing to answer, and
                    # no traceback for socketserver to print into the soak's or demo's output.
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((ports.LOOPBACK, 0), DiscoveryHandler)
        self._server.daemon_threads = True
        self.url = f"http://{ports.LOOPBACK}:{self._server.server_address[1]}/targets"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="slipstream-pod-discovery")
        self._thread.start()

    def _pods(self) -> list[dict[str, Any]]:
        selector = NAME_LABEL
        if not self._namespaces:
            # _preload_content=False: the raw JSON, in the API's own field names (podIP).
            resp: Any = self._api.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False)
            items: list[dict[str, Any]] = json.loads(resp.data)["items"]
            return items
        out: list[dict[str, Any]] = []
        for ns in self._namespaces:
            page: Any = self._api.list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
            out.extend(json.loads(page.data)["items"])
        return out

    def groups(self) -> list[dict[str, Any]]:
        return targets(self._pods(), port_name=self._port_name, metrics_path=self._metrics_path)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
