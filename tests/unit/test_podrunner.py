"""The engine-pod runner's translation of a pod into a simulator command (pure parts)."""

from __future__ import annotations

import copy
import os
import sys
import urllib.error
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from slipstream.api import models
from slipstream.controller import objects
from slipstream.localkube import podrunner


def test_expand_follows_the_kubelet_rules():
    env = {"T": "4096", "MODE": "ceiling"}
    assert podrunner.expand("$(T)", env) == "4096"
    assert podrunner.expand("--x=$(T)/$(MODE)", env) == "--x=4096/ceiling"
    assert podrunner.expand("$(MISSING)", env) == "$(MISSING)"
    assert podrunner.expand("$$(T)", env) == "$(T)"
    assert podrunner.expand("cost $$5", env) == "cost $5"


def pod(args: list[str], env: list[dict[str, Any]], *, ip: str = "127.3.0.7", phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": "kimi-0", "namespace": "ns", "uid": "u-1"},
        "spec": {"containers": [{"name": "engine", "args": args, "env": env,
                                 "ports": [{"name": "http", "containerPort": 30000}]}]},
        "status": {"phase": phase, "podIP": ip},
    }  # fmt: skip


STORE = {
    ("configmaps", "ns", "kimi-engine-setting"): {"threshold": "2048", "mode": "floor", "schedulePolicy": "srpt"},
    ("secrets", "ns", "kimi-admin"): {"api-key": "s3cret"},
}


def lookup(kind: str, ns: str, name: str):
    return STORE.get((kind, ns, name))


def test_plan_binds_the_pod_ip_expands_args_and_keeps_the_key_out_of_argv():
    env = [
        {"name": "SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD",
         "valueFrom": {"configMapKeyRef": {"name": "kimi-engine-setting", "key": "threshold"}}},
        {"name": "SLIPSTREAM_ADMIN_API_KEY", "valueFrom": {"secretKeyRef": {"name": "kimi-admin", "key": "api-key"}}},
        {"name": "EXTRA", "value": "x-$(SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD)"},
    ]  # fmt: skip
    args = ["--model-path", "m", "--host", "0.0.0.0", "--port", "30000",
            "--long-prefill-token-threshold", "$(SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD)",
            "--admin-api-key", "$(SLIPSTREAM_ADMIN_API_KEY)", "--tag=$(EXTRA)"]  # fmt: skip
    spec = podrunner.plan(pod(args, env), lookup, time_scale=20, command=("sim",))
    assert spec is not None
    assert spec.url == "http://127.3.0.7:30000"
    argv = list(spec.argv)
    assert argv[:5] == ["sim", "--host", "127.3.0.7", "--port", "30000"]
    assert argv.count("--host") == 1 and argv.count("--port") == 1
    assert argv[argv.index("--long-prefill-token-threshold") + 1] == "2048"
    assert "--tag=x-2048" in argv
    assert "s3cret" not in " ".join(argv) and "--admin-api-key" not in argv
    assert spec.env["SLIPSTREAM_ADMIN_API_KEY"] == "s3cret"
    assert argv[argv.index("--time-scale") + 1] == "20"
    assert argv[argv.index("--pod-name") + 1] == "ns/kimi-0"


def test_plan_skips_pods_not_running_and_refuses_routable_ips():
    assert podrunner.plan(pod([], [], phase="Pending"), lookup, time_scale=1) is None
    assert podrunner.plan(pod([], [], ip=""), lookup, time_scale=1) is None
    deleting = pod([], [])
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert podrunner.plan(deleting, lookup, time_scale=1) is None
    with pytest.raises(ValueError, match="outside 127.0.0.0/8"):
        podrunner.plan(pod([], [], ip="10.244.0.5"), lookup, time_scale=1)


def test_a_missing_configmap_or_key_is_a_config_error_naming_it():
    env = [{"name": "T", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "threshold"}}}]
    with pytest.raises(podrunner.PodConfigError, match="configmap ns/nope not found"):
        podrunner.plan(pod([], env), lookup, time_scale=1)
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "kimi-admin", "key": "other"}}}]
    with pytest.raises(podrunner.PodConfigError, match="key other of secret ns/kimi-admin"):
        podrunner.plan(pod([], env), lookup, time_scale=1)
    optional = copy.deepcopy(env)
    optional[0]["valueFrom"]["secretKeyRef"]["optional"] = True
    assert podrunner.plan(pod([], optional), lookup, time_scale=1) is not None


def test_the_operators_own_pod_template_translates_to_engine_flags():
    sd = models.ServingDeployment.model_validate({
        "apiVersion": models.API_VERSION, "kind": models.KIND,
        "metadata": {"name": "kimi", "namespace": "ns", "uid": "u"},
        "spec": {"engine": {"image": "e:1", "model": "org/m", "chunkedPrefillSize": 8192, "pageSize": 64,
                            "adminApiKeySecretRef": {"name": "kimi-admin", "key": "api-key"}},
                 "tuning": {"mode": "Fixed", "threshold": 2048}},
    })  # fmt: skip
    template = objects.deployment(sd)["spec"]["template"]
    p = {"metadata": {"name": "kimi-abc", "namespace": "ns", "uid": "u-2"}, "spec": template["spec"],
         "status": {"phase": "Running", "podIP": "127.9.0.3"}}  # fmt: skip
    spec = podrunner.plan(p, lookup, time_scale=1, command=("sim",))
    assert spec is not None
    argv = list(spec.argv)
    flag = {name: argv[argv.index(name) + 1] for name in
            ("--long-prefill-token-threshold", "--long-prefill-mode", "--schedule-policy", "--chunked-prefill-size")}  # fmt: skip
    assert flag == {"--long-prefill-token-threshold": "2048", "--long-prefill-mode": "floor",
                    "--schedule-policy": "srpt", "--chunked-prefill-size": "8192"}  # fmt: skip
    assert not any("$(" in a for a in argv), argv
    assert spec.env["SLIPSTREAM_ADMIN_API_KEY"] == "s3cret"


class FakeApi:
    """The apiserver as the runner reads it: one pod list and the objects its env names."""

    def __init__(self, pods: list[dict[str, Any]], store: dict[tuple[str, str, str], dict[str, str]]) -> None:
        self.pods, self.store = pods, store

    def get_json(self, path: str) -> Any:
        if "/pods?" in path:
            return {"items": copy.deepcopy(self.pods)}
        _, _, _, _, ns, kind, name = path.split("/")
        if (kind, ns, name) not in self.store:
            raise urllib.error.HTTPError(path, 404, "not found", Message(), None)
        return {"data": dict(self.store[(kind, ns, name)])}


def test_a_running_simulator_outlives_its_configmap_as_a_kubelets_container_would(tmp_path: Path) -> None:
    """Deleting (or emptying) the ConfigMap an engine pod's env came from leaves its
    simulator running, the same process, with no restart counted; a pod that starts while
    the ConfigMap is gone gets none until it is back; a deleted pod's simulator stops."""
    env = [{"name": "SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD",
            "valueFrom": {"configMapKeyRef": {"name": "kimi-engine-setting", "key": "threshold"}}}]  # fmt: skip
    first = pod(["--port", "30000"], env)
    api = FakeApi([first], {("configmaps", "ns", "kimi-engine-setting"): {"threshold": "2048"}})
    sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
    runner = podrunner.PodRunner(api.get_json, tmp_path, command=sleeper, base_env={})
    try:
        runner.sync_once()
        (started,) = runner.simulators()
        assert started["pid"] > 0
        del api.store[("configmaps", "ns", "kimi-engine-setting")]
        second = copy.deepcopy(first)
        second["metadata"] |= {"name": "kimi-1", "uid": "u-2"}
        second["status"]["podIP"] = "127.3.0.8"
        api.pods.append(second)
        for _ in range(3):
            runner.sync_once()
        (kept,) = runner.simulators()
        assert (kept["uid"], kept["pid"], kept["restarts"]) == ("u-1", started["pid"], 0)
        assert os.kill(kept["pid"], 0) is None  # still alive
        api.store[("configmaps", "ns", "kimi-engine-setting")] = {"threshold": "4096"}
        runner.sync_once()
        assert sorted(s["uid"] for s in runner.simulators()) == ["u-1", "u-2"]
        assert next(s for s in runner.simulators() if s["uid"] == "u-1")["pid"] == started["pid"]
        api.pods = [second]
        runner.sync_once()
        assert [s["uid"] for s in runner.simulators()] == ["u-2"]
    finally:
        runner.stop()


def test_keeps_is_false_for_another_pod_a_deleted_one_or_a_new_ip() -> None:
    spec = podrunner.plan(pod(["--port", "1"], []), lookup, time_scale=1, command=("sim",))
    assert spec is not None
    assert podrunner.keeps(pod(["--port", "1"], []), spec)
    moved = pod(["--port", "1"], [], ip="127.3.0.9")
    assert not podrunner.keeps(moved, spec)
    assert not podrunner.keeps(pod(["--port", "1"], [], phase="Succeeded"), spec)
    deleting = pod(["--port", "1"], [])
    deleting["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    assert not podrunner.keeps(deleting, spec)
