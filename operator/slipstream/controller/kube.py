"""The Kubernetes client of the controller: blocking calls, run in threads by the handlers.

Only this module talks to the Kubernetes API (kopf's own watching aside). Objects are plain
dicts; writes are server-side apply with one field manager, so applying the same object
twice changes nothing and another actor's fields are left alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes import config as k8s_config

FIELD_MANAGER = "slipstream"

Change = Literal["created", "updated"] | None
SecretState = Literal["ok", "missing-secret", "missing-key"]

# (apiVersion, kind) -> plural, for the kinds the controller reads or writes.
PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("apps/v1", "Deployment"): "deployments",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
}


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


def load_config() -> None:
    """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    try:
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()  # type: ignore[no-untyped-call]


def path_of(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[(api_version, kind)]}"
    return f"{path}/{name}" if name else path


@dataclass
class Kube:
    api: k8s.ApiClient

    @classmethod
    def default(cls) -> Kube:
        return cls(k8s.ApiClient())

    def request(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        serialized = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [], header_params=headers,
            body=body, auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*serialized)
        data = response.read()  # type: ignore[no-untyped-call]
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, text)
        return json.loads(text) if text else {}

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path_of(api_version, kind, namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, Change]:
        """Server-side apply; returns (object now, object before or None, what changed)."""
        meta = obj["metadata"]
        before = self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        after = self.request(
            "PATCH",
            path_of(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
            body=obj,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )
        if before is None:
            return after, None, "created"
        changed = after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
        return after, before, "updated" if changed else None

    def secret_state(self, namespace: str, name: str, key: str) -> SecretState:
        secret = self.get("v1", "Secret", namespace, name)
        if secret is None:
            return "missing-secret"
        return "ok" if key in (secret.get("data") or {}) else "missing-key"

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the apiserver serves a resource (discovery; e.g. is there a PodMonitor CRD)."""
        try:
            found = self.request("GET", f"/apis/{api_version}")
        except ApiError as error:
            if error.status in (403, 404, 503):
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources", []))
