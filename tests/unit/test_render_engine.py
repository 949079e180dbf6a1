"""Rendering of the engine's launch arguments and of the objects a ServingDeployment owns."""

from __future__ import annotations

from typing import Any

import pytest

from slipstream.api import models
from slipstream.controller import objects, status
from slipstream.engine import args as engine_args


def make(spec: dict[str, Any] | None = None, status_: dict[str, Any] | None = None) -> models.ServingDeployment:
    base: dict[str, Any] = {
        "engine": {"image": "img:1", "model": "org/model", "tensorParallelSize": 8, "chunkedPrefillSize": 8192,
                   "pageSize": 64},
        "tuning": {"mode": "Fixed", "threshold": 4096},
        "prometheus": {"url": "http://prometheus.monitoring:9090"},  # Auto and Recommend need it
    }  # fmt: skip
    for key, value in (spec or {}).items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return models.ServingDeployment.model_validate(
        {"metadata": {"name": "kimi", "namespace": "prod", "uid": "u-1", "generation": 3},
         "spec": base, "status": status_ or {}}
    )  # fmt: skip


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def container(sd: models.ServingDeployment) -> dict[str, Any]:
    return objects.deployment(sd)["spec"]["template"]["spec"]["containers"][0]


def test_launch_args_with_literal_setting() -> None:
    sd = make()
    setting = models.EngineSetting(threshold=2048, mode="floor", schedule_policy="srpt")
    args = engine_args.launch_args(sd.spec.engine, "tenant", engine_args.SettingArgs.of(setting))
    assert flag(args, "--model-path") == "org/model"
    assert flag(args, "--tp-size") == "8"
    assert flag(args, "--chunked-prefill-size") == "8192"
    assert flag(args, "--page-size") == "64"
    assert flag(args, "--long-prefill-token-threshold") == "2048"
    assert flag(args, "--long-prefill-mode") == "floor"
    assert flag(args, "--schedule-policy") == "srpt"
    assert "--enable-metrics" in args
    assert flag(args, "--tokenizer-metrics-custom-labels-header") == "x-custom-labels"
    assert flag(args, "--tokenizer-metrics-allowed-custom-labels") == "tenant"
    assert "--enable-hierarchical-cache" not in args and "--admin-api-key" not in args


def test_hicache_admin_key_and_extra_args() -> None:
    sd = make({"engine": {"hicache": {"enabled": True, "sizeGB": 512, "storageBackend": "file"},
                          "adminApiKeySecretRef": {"name": "admin"}, "extraArgs": ["--disable-cuda-graph"],
                          "trustRemoteCode": True, "contextLength": 131072}})  # fmt: skip
    args = container(sd)["args"]
    assert "--enable-hierarchical-cache" in args
    assert flag(args, "--hicache-size") == "512" and "--hicache-ratio" not in args
    assert flag(args, "--hicache-write-policy") == "write_through"
    assert flag(args, "--hicache-storage-backend") == "file"
    assert not [a for a in args if "admin-api-key" in a or "ADMIN_API_KEY" in a], "the key never goes in argv"
    assert "--trust-remote-code" in args and flag(args, "--context-length") == "131072"
    assert args[-1] == "--disable-cuda-graph"
    env = {e["name"]: e for e in container(sd)["env"]}
    assert env["SLIPSTREAM_ADMIN_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "admin", "key": "api-key"}


def test_without_a_secret_in_the_spec_the_engines_take_the_generated_one() -> None:
    sd = make()
    env = {e["name"]: e for e in container(sd)["env"]}
    assert env["SLIPSTREAM_ADMIN_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "kimi-admin-key", "key": "api-key"}
    assert not [a for a in container(sd)["args"] if "admin" in a]
    secret = objects.admin_key_secret(sd, "s3cret")
    assert secret["metadata"]["name"] == "kimi-admin-key" and secret["stringData"] == {"api-key": "s3cret"}
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "ServingDeployment"


def test_pod_template_takes_the_setting_from_the_configmap() -> None:
    c = container(make())
    assert c["command"] == ["python3", "-m", "sglang.launch_server"]
    args = c["args"]
    assert flag(args, "--long-prefill-token-threshold") == "$(SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD)"
    env = {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in c["env"] if "configMapKeyRef" in e.get("valueFrom", {})}
    assert env["SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD"] == {"name": "kimi-engine-setting", "key": "threshold"}
    assert env["SLIPSTREAM_LONG_PREFILL_MODE"]["key"] == "mode"
    assert env["SLIPSTREAM_SCHEDULE_POLICY"]["key"] == "schedulePolicy"
    # Kubernetes expands $(VAR) only for variables defined before use in env: all are.
    assert all(f"$({name})" not in str(c["env"]) for name in env)


def test_threshold_change_keeps_the_pod_template_and_changes_the_configmap() -> None:
    before, after = make(), make({"tuning": {"threshold": 2048}})
    assert objects.deployment(before) == objects.deployment(after)
    cm_before = objects.configmap(before, objects.current_setting(before))
    cm_after = objects.configmap(after, objects.current_setting(after))
    assert cm_before["data"]["threshold"] == "4096" and cm_after["data"]["threshold"] == "2048"
    assert cm_after["data"] == {"threshold": "2048", "mode": "ceiling", "schedulePolicy": "fcfs"}


@pytest.mark.parametrize(
    "change",
    [{"engine": {"image": "img:2"}}, {"engine": {"model": "org/other"}}, {"engine": {"tensorParallelSize": 4}},
     {"engine": {"resources": {"requests": {"memory": "1Ti"}}}}],
    ids=["image", "model", "parallelism", "resources"],
)  # fmt: skip
def test_changes_that_need_new_pods_change_the_pod_template(change: dict[str, Any]) -> None:
    assert objects.deployment(make())["spec"]["template"] != objects.deployment(make(change))["spec"]["template"]


def test_every_owned_object_has_an_owner_reference_and_labels() -> None:
    sd = make()
    owned = [objects.deployment(sd), objects.service(sd), objects.configmap(sd, objects.current_setting(sd)),
             objects.monitor(sd, "PodMonitor"), objects.monitor(sd, "ServiceMonitor")]  # fmt: skip
    for obj in owned:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "serving.slipstream.dev/v1alpha1", "kind": "ServingDeployment",
                       "name": "kimi", "uid": "u-1", "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        assert obj["metadata"]["namespace"] == "prod"
        assert obj["metadata"]["labels"][objects.NAME_LABEL] == "kimi"
    dep = objects.deployment(sd)
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert objects.service(sd)["spec"]["ports"][0]["port"] == 30000


def test_gpus_default_to_tensor_parallel_size() -> None:
    assert container(make())["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    res = container(make({"engine": {"gpus": 0, "resources": {"requests": {"cpu": 4}}}}))["resources"]
    assert res == {"requests": {"cpu": "4"}}


@pytest.mark.parametrize(
    ("tuning", "status_", "expected"),
    [
        ({"mode": "Fixed", "threshold": 4096}, {}, (4096, "ceiling", "fcfs")),
        ({"mode": "Off", "threshold": 4096}, {}, (0, "ceiling", "fcfs")),
        # status: what the engines were read back running, whatever the mode (the
        # tuning loop moves them to the spec's value through their admin API)
        ({"mode": "Recommend", "threshold": 2048}, {"threshold": 512}, (512, "ceiling", "fcfs")),
        ({"mode": "Fixed", "threshold": 2048}, {"threshold": 4096}, (4096, "ceiling", "fcfs")),
        ({"mode": "Auto", "threshold": 4096, "schedulePolicy": "srpt"}, {}, (4096, "ceiling", "srpt")),
        ({"mode": "Auto", "threshold": 4096}, {"threshold": 1024, "mode": "floor"}, (1024, "floor", "fcfs")),
        ({"mode": "Auto", "threshold": None}, {}, (0, "ceiling", "fcfs")),
    ],
)
def test_current_setting_by_mode(tuning: dict[str, Any], status_: dict[str, Any], expected: tuple[int, str, str]) -> None:
    sd = make({"tuning": tuning}, status_)
    setting = objects.current_setting(sd)
    assert (setting.threshold, setting.mode, setting.schedule_policy) == expected


def test_new_pods_get_the_candidate_while_promoting_and_the_baseline_while_rolling_back() -> None:
    rollout = {"candidate": {"threshold": 1024}, "baseline": {"threshold": 4096, "mode": "floor"}}
    promoting = make({"tuning": {"mode": "Auto"}}, {"threshold": 4096, "rollout": {**rollout, "phase": "Promoting"}})
    assert objects.configmap_setting(promoting).threshold == 1024
    back = make({"tuning": {"mode": "Auto"}}, {"threshold": 4096, "rollout": {**rollout, "phase": "RollingBack"}})
    assert objects.configmap_setting(back) == models.EngineSetting(threshold=4096, mode="floor")
    canary = make({"tuning": {"mode": "Auto"}}, {"threshold": 2048, "rollout": {**rollout, "phase": "Canary"}})
    assert objects.configmap_setting(canary).threshold == 2048


@pytest.mark.parametrize(
    "status_",
    [
        {"threshold": 9999},  # not a whole number of pages (64)
        {"threshold": 16384},  # above C
        {"threshold": 4096, "rollout": {"phase": "Promoting", "candidate": {"threshold": 100}}},
        {"threshold": 4096, "rollout": {"phase": "RollingBack", "baseline": {"threshold": 65536}}},
    ],
)
def test_a_status_setting_no_engine_would_start_with_never_reaches_the_configmap(status_: dict[str, Any]) -> None:
    """Another writer's status (a rival controller, a hand edit) must not crash-loop new pods."""
    sd = make({"tuning": {"mode": "Fixed", "threshold": 2048}}, status_)
    setting = objects.configmap_setting(sd)
    assert setting.threshold in (2048, 4096), setting
    assert objects.configmap(sd, setting)["data"][engine_args.THRESHOLD_KEY] in ("2048", "4096")


@pytest.mark.parametrize(("c", "t", "n"), [(8192, 4096, 2), (16384, 4096, 4), (8192, 0, 1), (8192, 8192, 1)])
def test_concurrency(c: int, t: int, n: int) -> None:
    assert models.prefills_at_once(c, t) == n


def test_condition_transition_time_moves_only_with_its_status() -> None:
    first = status.set_condition([], "Ready", False, "Rolling", "0/1", 1, "2026-01-01T00:00:00Z")
    same = status.set_condition(first, "Ready", False, "Rolling", "0/1 again", 2, "2026-01-01T00:05:00Z")
    assert same[0].last_transition_time == "2026-01-01T00:00:00Z" and same[0].message == "0/1 again"
    flipped = status.set_condition(same, "Ready", True, "Available", "1/1", 2, "2026-01-01T00:09:00Z")
    assert flipped[0].last_transition_time == "2026-01-01T00:09:00Z" and len(flipped) == 1


def test_phase_and_readiness() -> None:
    dep = {"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "availableReplicas": 2, "updatedReplicas": 2}}
    assert status.deployment_ready(2, dep)[0] is True
    assert status.deployment_ready(3, dep)[:2] == (False, "Rolling")
    assert status.deployment_ready(2, {**dep, "metadata": {"generation": 3}})[0] is False
    assert status.deployment_ready(1, None)[1] == "NoDeployment"
    t = "2026-01-01T00:00:00Z"
    ok = status.set_condition([], status.RECONCILED, True, "Applied", "", 1, t)
    assert status.phase([]) == "Pending"
    assert status.phase(ok) == "Progressing"
    assert status.phase(status.set_condition(ok, status.READY, True, "Available", "", 1, t)) == "Ready"
    bad = status.set_condition(ok, status.RECONCILED, False, "AdminKeySecretMissing", "", 1, t)
    assert status.phase(bad) == "Degraded"


def test_status_patch() -> None:
    sd = make()
    patch = status.patch(sd, objects.current_setting(sd), status.after_reconcile(sd, None, None, "t"), None)
    assert patch["threshold"] == 4096 and patch["concurrency"] == 2
    assert patch["mode"] == "ceiling" and patch["observedGeneration"] == 3
    assert patch["phase"] == "Progressing" and patch["readyReplicas"] is None
    assert [(c["type"], c["status"], c["reason"]) for c in patch["conditions"]] == [
        ("Reconciled", "True", "Applied"), ("Ready", "False", "NoDeployment")]
    missing = status.after_reconcile(sd, ("AdminKeySecretMissing", "create it"), None, "t")
    assert status.phase(missing) == "Degraded"
    models.ServingDeploymentStatus.model_validate({k: v for k, v in patch.items() if v is not None})


def test_a_refused_spec_without_engines_shows_no_setting() -> None:
    """`kubectl get sd` shows what is applied: a refused spec with no engine Deployment runs
    nothing, so its status removes the setting (merge-patch nulls), even the first time;
    a refused spec whose old Deployment still runs keeps showing that setting."""
    sd = make()
    refused = status.after_reconcile(sd, ("UnsupportedFeature", "set hicache.enabled false"), None, "t")
    patch = status.patch(sd, objects.current_setting(sd), refused, None)
    assert {k: patch[k] for k in status.SETTING_FIELDS} == dict.fromkeys(status.SETTING_FIELDS)
    assert patch["phase"] == "Degraded"
    running = {"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1}}
    kept = status.patch(sd, objects.current_setting(sd), refused, running)
    assert kept["threshold"] == 4096 and kept["concurrency"] == 2
    assert status.runs_nothing(refused, engines_exist=False) and not status.runs_nothing(refused, engines_exist=True)
    served = status.after_reconcile(sd, None, None, "t")
    assert not status.runs_nothing(served, engines_exist=False)  # replicas 0 or not yet created: the setting stands


def test_the_operator_never_imports_torch_or_sglang() -> None:
    import subprocess
    import sys

    code = ("import sys, slipstream.controller.runtime.main, slipstream.engine.admin; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_status_changed_keeps_only_differing_fields() -> None:
    sd = make(status_={"threshold": 4096, "concurrency": 2, "mode": "ceiling", "schedulePolicy": "fcfs"})
    moved = models.EngineSetting(threshold=1024, mode="floor")
    assert status.changed(sd, status.setting_patch(sd, objects.current_setting(sd))) == {}
    assert status.changed(sd, status.setting_patch(sd, moved)) == {"threshold": 1024, "concurrency": 8, "mode": "floor"}
    assert status.changed(sd, {"readyReplicas": None}) == {}


def test_engine_pods_get_a_security_context_and_the_spec_can_tighten_it() -> None:
    pod = objects.deployment(make())["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    assert pod["automountServiceAccountToken"] is False
    # An RDMA transport may need IPC_LOCK: added back, every other capability still dropped.
    rdma = make({"engine": {"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}})
    rdma_caps = objects.deployment(rdma)["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert rdma_caps == {"add": ["IPC_LOCK"], "drop": ["ALL"]}
    tight = make({"engine": {"securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True},
                             "podSecurityContext": {"runAsUser": 1000, "fsGroup": 1000}}})  # fmt: skip
    spec = objects.deployment(tight)["spec"]["template"]["spec"]
    assert spec["securityContext"] == {"runAsUser": 1000, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    # drop: [] keeps the runtime's default set: no capabilities field at all.
    loose = make({"engine": {"securityContext": {"capabilities": {"drop": []}}}})
    assert "capabilities" not in objects.deployment(loose)["spec"]["template"]["spec"]["containers"][0]["securityContext"]


def test_monitors_scrape_at_the_interval_the_canary_sub_windows_assume() -> None:
    for kind in ("PodMonitor", "ServiceMonitor"):
        (default,) = objects.monitor(make(), kind)["spec"][objects.MONITOR_KINDS[kind]]
        (slow,) = objects.monitor(make(), kind, 15.0)["spec"][objects.MONITOR_KINDS[kind]]
        assert (default["interval"], slow["interval"]) == ("5000ms", "15000ms")


def test_monitors_label_every_engine_target_with_its_deployment() -> None:
    for kind in ("PodMonitor", "ServiceMonitor"):
        (endpoint,) = objects.monitor(make(), kind)["spec"][objects.MONITOR_KINDS[kind]]
        by_target = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert by_target["servingdeployment"] == ["__meta_kubernetes_pod_label_serving_slipstream_dev_name"]
        assert by_target["pod"] == ["__meta_kubernetes_pod_name"]
