"""The controller's blocking Kubernetes client (controller.clients.kube): kopf's credentials,
requests through urllib3 to a real HTTP server, a fresh login on 401, and the apiserver's
own message in the error."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from slipstream.controller.clients import kube as kube_


class Apiserver:
    """An HTTP server that records each request and answers 401 to any token but `valid`."""

    def __init__(self) -> None:
        self.valid = "new"
        self.seen: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.seen.append({"method": self.command, "path": self.path, "body": body,
                                   "auth": self.headers.get("Authorization"),
                                   "type": self.headers.get("Content-Type")})  # fmt: skip
                if self.headers.get("Authorization") != f"Bearer {outer.valid}":
                    status, reply = 401, {"kind": "Status", "message": "Unauthorized"}
                elif self.path.startswith("/api/v1/namespaces/ns/configmaps/missing"):
                    status, reply = 404, {"kind": "Status", "message": 'configmaps "missing" not found'}
                elif self.command == "PATCH" and "/status" in self.path:
                    status, reply = 422, {"kind": "Status", "message": "status.threshold: Invalid value: -1"}
                else:
                    status, reply = 200, {"metadata": {"resourceVersion": "7"}, "echo": self.path}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def apiserver() -> Iterator[Apiserver]:
    server = Apiserver()
    yield server
    server.server.shutdown()


def info(url: str, token: str) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=url, token=token, scheme="Bearer")


def test_a_request_carries_the_token_and_the_query_and_answers_json(apiserver: Apiserver) -> None:
    kube = kube_.Kube(info(apiserver.url, "new"))
    got = kube.request("GET", "/api/v1/namespaces/ns/pods", query=[("labelSelector", "app=a,tier=b")])
    assert got["echo"] == "/api/v1/namespaces/ns/pods?labelSelector=app%3Da%2Ctier%3Db"
    assert apiserver.seen[-1]["auth"] == "Bearer new"


def test_apply_sends_the_object_as_an_apply_patch_with_the_field_manager(apiserver: Apiserver) -> None:
    kube = kube_.Kube(info(apiserver.url, "new"))
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": "c"}, "data": {"k": "v"}}
    kube.apply(obj)
    patch = apiserver.seen[-1]
    assert patch["method"] == "PATCH" and patch["type"] == "application/apply-patch+yaml"
    assert patch["path"] == "/api/v1/namespaces/ns/configmaps/c?fieldManager=slipstream&force=true"
    assert yaml.safe_load(patch["body"]) == obj


def test_a_401_logs_in_again_once_and_repeats_the_call_with_the_new_token(apiserver: Apiserver) -> None:
    logins: list[str] = []

    def relogin() -> kopf.ConnectionInfo:
        logins.append("again")
        return info(apiserver.url, "new")

    kube = kube_.Kube(info(apiserver.url, "rotated-away"), relogin=relogin)
    assert kube.request("GET", "/api/v1/namespaces/ns/configmaps/c")["echo"]
    assert logins == ["again"]
    assert [s["auth"] for s in apiserver.seen] == ["Bearer rotated-away", "Bearer new"]
    apiserver.valid = "newer"  # the fresh login is no better: the 401 is the error, no loop
    with pytest.raises(kube_.ApiError) as raised:
        kube.request("GET", "/api/v1/namespaces/ns/configmaps/c")
    assert raised.value.status == 401 and logins == ["again", "again"]


def test_errors_carry_the_apiservers_message_and_a_404_read_is_none(apiserver: Apiserver) -> None:
    kube = kube_.Kube(info(apiserver.url, "new"))
    assert kube.get("v1", "ConfigMap", "ns", "missing") is None
    with pytest.raises(kube_.ApiError) as raised:
        kube.patch_status("serving.slipstream.dev/v1alpha1", "servingdeployments", "ns", "a", {"threshold": -1})
    assert raised.value.status == 422 and raised.value.message == "status.threshold: Invalid value: -1"


def kubeconfig(tmp_path: Path, user: dict[str, Any]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ops"}}],
    }))  # fmt: skip
    return path


def test_a_kubeconfig_with_a_token_logs_in_through_kopf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: None)  # not in a pod
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    found = kube_.login(kubeconfig=kubeconfig(tmp_path, {"token": "abc"}))
    assert (found.server, found.token, found.default_namespace) == ("https://10.0.0.1:6443", "abc", "ops")
    assert kube_.os.environ["KUBECONFIG"] == "/nonexistent", "the caller's environment is left as it was"


def test_a_plugin_user_without_the_kubernetes_package_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as in the operator image
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "gke-gcloud-auth-plugin"}}
    with pytest.raises(kopf.LoginError, match="exec or auth-provider plugin.*pip install kubernetes"):
        kube_.login(kubeconfig=kubeconfig(tmp_path, exec_user))


@pytest.mark.parametrize(("host", "server"), [("10.96.0.1", "https://10.96.0.1:443"), ("fd00::1", "https://[fd00::1]:443")])
def test_in_a_pod_the_server_is_the_one_the_kubelet_names(
    monkeypatch: pytest.MonkeyPatch, host: str, server: str
) -> None:
    pod = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="sa", ca_path="/ca.crt")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: pod)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    found = kube_.login()
    assert (found.server, found.token, found.ca_path) == (server, "sa", "/ca.crt")
