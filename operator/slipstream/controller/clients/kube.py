"""The Kubernetes client of the controller: blocking calls, run in threads by the handlers.

Only this module talks to the Kubernetes API (kopf's own watching aside). Objects are plain
dicts; writes are server-side apply with one field manager, so applying the same object
twice changes nothing and another actor's fields are left alone.
"""

from __future__ import annotations

import base64
import binascii
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
    ("v1", "Pod"): "pods",
    ("apps/v1", "Deployment"): "deployments",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
    ("serving.slipstream.dev/v1alpha1", "ServingDeployment"): "servingdeployments",
}


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.message = body[:1000]
        """The apiserver's own message (it names the field), else the body."""
        try:
            found = json.loads(body).get("message")
        except (ValueError, AttributeError):
            found = None
        if isinstance(found, str):
            self.message = found[:1000]


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
    def default(cls, pool: int | None = None) -> Kube:
        """A client of the loaded configuration; `pool`: connections it keeps for reuse
        (the client's default is 5 per CPU: with more threads sharing it, each call beyond
        the pool opened a TLS connection and threw it away)."""
        configuration = k8s.Configuration.get_default_copy()
        if pool is not None:
            configuration.connection_pool_maxsize = pool
        return cls(k8s.ApiClient(configuration))

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

    def merge_patch(self, obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of `obj` (lists in `patch` replace the stored ones whole)."""
        meta = obj["metadata"]
        return self.request(
            "PATCH", path_of(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]), body=patch,
            query=[("fieldManager", FIELD_MANAGER)], content_type="application/merge-patch+json",
        )  # fmt: skip

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

    def create_if_missing(self, obj: dict[str, Any]) -> Change:
        """Create an object unless it exists; never rewrites it (a generated key must stay
        what the running engines were started with)."""
        meta = obj["metadata"]
        try:  # no GET first: the operator may create Secrets where it may not read them
            self.request("POST", path_of(obj["apiVersion"], obj["kind"], meta["namespace"]), body=obj,
                         query=[("fieldManager", FIELD_MANAGER)])  # fmt: skip
        except ApiError as error:
            if error.status == 409:  # created meanwhile (another replica): theirs stands
                return None
            raise
        return "created"

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """One decoded value of a Secret; None when the Secret or key is missing or garbled."""
        secret = self.get("v1", "Secret", namespace, name)
        raw = ((secret or {}).get("data") or {}).get(key)
        if raw is None:
            return None
        try:
            return base64.b64decode(raw, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        """The pods matching a label selector (one LIST)."""
        query = [("labelSelector", ",".join(f"{k}={v}" for k, v in sorted(selector.items())))]
        return list(self.request("GET", path_of("v1", "Pod", namespace), query=query).get("items", []))

    def patch_status(
        self, api_version: str, plural: str, namespace: str, name: str, patch: dict[str, Any],
        resource_version: str | None = None,
    ) -> None:
        """Merge-patch the status subresource of a custom object. With `resource_version`,
        only if the object is still at that version (409 otherwise): a list such as
        `conditions` is replaced whole, so a writer must not write it from a stale read."""
        path = f"/apis/{api_version}/namespaces/{namespace}/{plural}/{name}/status"
        body: dict[str, Any] = {"status": patch}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        self.request("PATCH", path, body=body, content_type="application/merge-patch+json")
