"""The Kubernetes client of the controller: blocking calls, run in threads by the handlers.

Only this module talks to the Kubernetes API (kopf's own watching aside). Objects are plain
dicts; writes are server-side apply with one field manager, so applying the same object
twice changes nothing and another actor's fields are left alone.

Credentials are kopf's own (`login`): the same `kopf.ConnectionInfo` that kopf's session
gets, so both clients authenticate alike. Requests go through urllib3. The `kubernetes`
package is not used at run time: kopf imports it whenever it is installed, with its
generated model classes (~5 MB of the entry point's imports: 68.5 MB against 63.6 MB
without it, docs/reliability.md "Scale"), so the operator image does not install it
(tests/unit/test_runtime_only.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

import kopf
import urllib3

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
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
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


def login(settings: kopf.OperatorSettings | None = None, kubeconfig: Path | None = None) -> kopf.ConnectionInfo:
    """The operator's credentials: the pod's ServiceAccount in a cluster, else $KUBECONFIG or
    ~/.kube/config (`kubeconfig`: that file instead; tests and tools).

    kopf reads both. In a pod the server is the one the kubelet names in
    KUBERNETES_SERVICE_HOST/PORT, as client-go's in-cluster config does, so the operator
    needs no cluster DNS. A kubeconfig whose user holds no token, certificate or password
    (an `exec` or `auth-provider` plugin) is handed to the `kubernetes` package through
    kopf, which runs such plugins; that needs the package, which the operator image does
    not install.
    """
    settings = settings or kopf.OperatorSettings()
    info = None if kubeconfig else kopf.login_with_service_account(settings=settings)
    if info is not None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port:
            info = replace(info, server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}")
        return info
    with _kubeconfig_env(kubeconfig):
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError(
            "no Kubernetes credentials: not in a pod with a ServiceAccount token, and neither "
            "$KUBECONFIG nor ~/.kube/config exists"
        )
    if info.token or info.certificate_path or info.certificate_data or info.username:
        return info
    try:
        import kubernetes  # noqa: F401  (only to ask whether kopf can piggyback on it)
    except ImportError as error:
        raise kopf.LoginError(
            "the kubeconfig's user has no token, client certificate or password (an exec or "
            "auth-provider plugin?): outside a cluster such a user needs the `kubernetes` "
            "package (pip install kubernetes), or give a kubeconfig with a token"
        ) from error
    with _kubeconfig_env(kubeconfig):
        found = kopf.login_via_client(settings=settings, logger=logging.getLogger(__name__))
    if found is None:
        raise kopf.LoginError("the kubernetes package found no credentials in the kubeconfig")
    return found


@contextmanager
def _kubeconfig_env(path: Path | None) -> Iterator[None]:
    """$KUBECONFIG set to `path` for the duration (kopf reads only the environment)."""
    if path is None:
        yield
        return
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = before


def path_of(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[(api_version, kind)]}"
    return f"{path}/{name}" if name else path


@dataclass
class Kube:
    """Blocking calls to the apiserver of `info`, sharing one pool of connections.

    `relogin`: where fresh credentials come from when the apiserver answers 401 (a
    ServiceAccount token the kubelet rotated); the call is then made once more.
    """

    info: kopf.ConnectionInfo
    pool_size: int | None = None
    relogin: Callable[[], kopf.ConnectionInfo] | None = None
    _pool: urllib3.PoolManager = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._pool = self._pool_for(self.info)

    def _pool_for(self, info: kopf.ConnectionInfo) -> urllib3.PoolManager:
        # `pool_size`: connections kept per host for reuse. With more threads sharing the
        # client than that, each call beyond it opens a TLS connection and throws it away.
        kwargs: dict[str, Any] = {"ssl_context": info.as_ssl_context()}
        if self.pool_size is not None:
            kwargs["maxsize"] = self.pool_size
        if info.proxy_url:
            return urllib3.ProxyManager(info.proxy_url, **kwargs)
        return urllib3.PoolManager(**kwargs)

    @classmethod
    def default(cls, pool: int | None = None) -> Kube:
        """A client of the operator's own credentials (`login`), logging in again on 401."""
        return cls(login(), pool_size=pool, relogin=login)

    @property
    def pool(self) -> urllib3.PoolManager:
        return self._pool

    def request(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()  # JSON is YAML too (apply)
        url = self.info.server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        response = self._send(method, url, data, content_type)
        if response.status == 401 and self.relogin is not None:
            self._log_in_again()
            response = self._send(method, url, data, content_type)
        text = response.data.decode(errors="replace")
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, text)
        return json.loads(text) if text else {}

    def _send(self, method: str, url: str, data: bytes | None, content_type: str) -> urllib3.BaseHTTPResponse:
        info, pool = self.info, self._pool
        headers = {"Accept": "application/json", "Content-Type": content_type, **info.as_http_headers()}
        return pool.request(method, url, body=data, headers=headers)

    def _log_in_again(self) -> None:
        assert self.relogin is not None
        with self._lock:
            info = self.relogin()
            if info != self.info:
                self.info, self._pool = info, self._pool_for(info)

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

    def items(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        """Every object of a kind in a namespace (one LIST)."""
        return list(self.request("GET", path_of(api_version, kind, namespace)).get("items", []))

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
