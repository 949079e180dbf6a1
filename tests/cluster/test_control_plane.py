"""The local control plane behaves like a real cluster where tests rely on it."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import eventually, processes_mentioning
from slipstream import localkube
from slipstream.localkube import binaries, nodes


def test_apiserver_and_kubectl_report_the_pinned_release(cluster: localkube.Cluster) -> None:
    server = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)
    assert server["gitVersion"] == binaries.K8S_VERSION
    assert server["major"] == "1" and server["minor"] == "36"
    client = json.loads(cluster.kubectl("version", "--client", "-o", "json").stdout)
    assert client["clientVersion"]["gitVersion"] == binaries.K8S_VERSION
    scheduler = subprocess.run(
        [str(cluster.bin_dir / "kube-scheduler"), "--version"], capture_output=True, text=True
    )
    assert scheduler.stdout.split() == ["Kubernetes", binaries.K8S_VERSION], scheduler
    kwok = subprocess.run(
        [str(cluster.bin_dir / "kwok"), "--version"], capture_output=True, text=True
    )
    assert kwok.stdout.startswith(f"kwok version {binaries.KWOK_VERSION} "), kwok


def test_server_listens_on_loopback_only(cluster: localkube.Cluster) -> None:
    assert cluster.server.startswith("https://127.0.0.1:")
    kubeconfig = json.loads(cluster.kubeconfig.read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == cluster.server


def test_rbac_limits_a_service_account_token_to_its_role(cluster: localkube.Cluster) -> None:
    ns = "rbac-check"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "serviceaccount", "reader", f"--namespace={ns}")
    cluster.kubectl(
        "create", "role", "configmap-reader", "--verb=get,list", "--resource=configmaps",
        f"--namespace={ns}",
    )  # fmt: skip
    cluster.kubectl(
        "create", "rolebinding", "reader", "--role=configmap-reader",
        f"--serviceaccount={ns}:reader", f"--namespace={ns}",
    )  # fmt: skip
    cluster.kubectl("create", "configmap", "visible", "--from-literal=k=v", f"--namespace={ns}")
    token_kc = cluster.token_kubeconfig(ns, "reader")

    who = json.loads(cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=token_kc).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:reader"

    def can_read() -> str:
        result = cluster.kubectl(
            "get", "configmap", "visible", f"--namespace={ns}", "-o", "jsonpath={.data.k}",
            kubeconfig=token_kc, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    # The RBAC authorizer reads bindings from an informer cache: allow it to catch up.
    assert eventually(can_read, deadline_s=30, what="role grants get") == "v"

    denied = [
        ("create", "configmap", "new", "--from-literal=a=b", f"--namespace={ns}"),
        ("delete", "configmap", "visible", f"--namespace={ns}"),
        ("get", "secrets", f"--namespace={ns}"),
        ("get", "configmaps", "--namespace=default"),
        ("get", "namespaces"),
    ]
    for args in denied:
        result = cluster.kubectl(*args, kubeconfig=token_kc, check=False)
        assert result.returncode != 0, f"kubectl {' '.join(args)} was allowed"
        assert "forbidden" in result.stderr.lower(), result.stderr
    # The admin still sees the object the denied delete aimed at.
    cluster.kubectl("get", "configmap", "visible", f"--namespace={ns}")


def test_owned_object_is_garbage_collected_after_its_owner(cluster: localkube.Cluster) -> None:
    ns = "gc-check"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "configmap", "owner", f"--namespace={ns}")
    uid = cluster.kubectl(
        "get", "configmap", "owner", f"--namespace={ns}", "-o", "jsonpath={.metadata.uid}"
    ).stdout
    assert uid
    child = textwrap.dedent(f"""\
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: child
          namespace: {ns}
          ownerReferences:
          - apiVersion: v1
            kind: ConfigMap
            name: owner
            uid: {uid}
        data:
          k: v
        """)
    cluster.kubectl("apply", "-f", "-", input=child)
    # An unowned neighbour must survive: the collector deletes dependents only.
    cluster.kubectl("create", "configmap", "bystander", f"--namespace={ns}")
    cluster.kubectl("delete", "configmap", "owner", f"--namespace={ns}", "--wait=true")

    def child_gone() -> None:
        result = cluster.kubectl("get", "configmap", "child", f"--namespace={ns}", check=False)
        assert result.returncode != 0, "child still exists"
        assert "NotFound" in result.stderr, result.stderr

    eventually(child_gone, deadline_s=120, what="garbage collection of the owned ConfigMap")
    cluster.kubectl("get", "configmap", "bystander", f"--namespace={ns}")


def test_nodes_are_ready_with_eight_gpus_each(cluster: localkube.Cluster) -> None:
    listed = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in listed) == sorted(cluster.node_names)
    assert len(listed) == nodes.NODE_COUNT >= 5
    products = sorted({n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in listed})
    assert products == ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H200"]
    for node in listed:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready["Ready"] == "True", node["status"]["conditions"]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert not node["spec"].get("taints"), node["spec"]


def test_deployment_pods_are_scheduled_and_become_ready(cluster: localkube.Cluster) -> None:
    """Deployment -> ReplicaSet -> pods -> scheduler -> kwok: Ready, with GPUs placed by request."""
    ns = "workload-check"
    cluster.kubectl("create", "namespace", ns)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-app", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "gpu-app"}},
            "template": {
                "metadata": {"labels": {"app": "gpu-app"}},
                "spec": {
                    "containers": [{
                        "name": "app", "image": "never-pulled:1",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }],
                },
            },
        },
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(deployment))
    cluster.kubectl("rollout", "status", "deployment/gpu-app", f"--namespace={ns}", "--timeout=60s")

    def ready_pods() -> list[dict[str, Any]]:
        pods = json.loads(cluster.kubectl("get", "pods", f"--namespace={ns}", "-o", "json").stdout)
        items = pods["items"]
        assert len(items) == 2, [p["metadata"]["name"] for p in items]
        for pod in items:
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            assert pod["status"]["phase"] == "Running" and conditions.get("Ready") == "True", pod[
                "status"
            ]
        return items

    pods = eventually(ready_pods, deadline_s=60, what="two Ready pods")
    placed = [pod["spec"]["nodeName"] for pod in pods]
    assert set(placed) <= set(cluster.node_names)
    assert len(set(placed)) == 2, f"8 GPUs each must land on two different nodes: {placed}"
    # Pod IPs come from the cluster's own loopback range (localkube.podcidr), so engine
    # simulators can bind them and nothing outside this machine is ever addressed.
    network = ipaddress.ip_network(cluster.pod_cidr)
    assert network.subnet_of(ipaddress.ip_network("127.0.0.0/8"))
    assert all(ipaddress.ip_address(pod["status"]["podIP"]) in network for pod in pods)
    status = json.loads(
        cluster.kubectl("get", "deployment", "gpu-app", f"--namespace={ns}", "-o", "json").stdout
    )["status"]
    assert status["availableReplicas"] == status["readyReplicas"] == 2

    # Deleting the namespace deletes the pods through kwok (no kubelet to confirm them).
    cluster.kubectl("delete", "namespace", ns, "--timeout=120s")


def test_a_pod_asking_for_more_gpus_than_a_node_has_stays_pending(
    cluster: localkube.Cluster,
) -> None:
    ns = "unschedulable-check"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl(
        "run", "too-big", "--image=never-pulled:1", f"--namespace={ns}",
        "--overrides", json.dumps({"spec": {"containers": [{
            "name": "too-big", "image": "never-pulled:1",
            "resources": {"limits": {"nvidia.com/gpu": "16"}},
        }]}}),
    )  # fmt: skip

    def unschedulable() -> None:
        pod = json.loads(
            cluster.kubectl("get", "pod", "too-big", f"--namespace={ns}", "-o", "json").stdout
        )
        conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
        assert conditions.get("PodScheduled", {}).get("reason") == "Unschedulable", pod["status"]
        assert "nvidia.com/gpu" in conditions["PodScheduled"]["message"]

    eventually(unschedulable, deadline_s=60, what="the scheduler reporting too few GPUs")
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_helm_runs_against_the_cluster(cluster: localkube.Cluster) -> None:
    version = cluster.helm("version", "--short").stdout.strip()
    assert version.startswith(binaries.HELM_VERSION), version
    releases = json.loads(cluster.helm("list", "--all-namespaces", "-o", "json").stdout)
    assert releases == []


def test_failed_command_error_shows_stderr(cluster: localkube.Cluster) -> None:
    with pytest.raises(localkube.CommandError, match="NotFound"):
        cluster.kubectl("get", "configmap", "does-not-exist")


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    workdir = tmp_path / "own-cluster"
    one_node = (dataclasses.replace(nodes.DEFAULT_POOLS[0], prefix="solo-", count=1),)
    with localkube.Cluster.start(workdir, node_pools=one_node) as own:
        assert own.node_names == ["solo-0"]
        pids = own.pids
        assert set(pids) == {
            "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
        }  # fmt: skip
        own.kubectl("get", "namespaces")
        for pid in pids.values():
            os.kill(pid, 0)  # alive while running
    for name, pid in pids.items():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
            raise AssertionError(f"{name} (pid {pid}) still running after stop()")
    assert processes_mentioning(str(workdir)) == []
    assert own.pids == {}
    own.stop()  # idempotent


def test_component_crash_reports_its_log_and_cleans_up(tmp_path: Path) -> None:
    real = localkube.default_bin_dir()
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in (*binaries.REQUIRED, binaries.KWOK_STAGES):
        (fake / name).symlink_to(real / name)
    (fake / "kube-apiserver").unlink()
    (fake / "kube-apiserver").write_text(
        "#!/bin/sh\necho 'apiserver exploded on purpose' >&2\nexit 3\n"
    )
    (fake / "kube-apiserver").chmod(0o755)
    workdir = tmp_path / "crash"
    with pytest.raises(localkube.ComponentError) as info:
        localkube.Cluster.start(workdir, bin_dir=fake)
    message = str(info.value)
    assert "kube-apiserver" in message
    assert "exited with code 3" in message
    assert "apiserver exploded on purpose" in message
    # etcd had started before the apiserver failed: it must be gone too.
    assert processes_mentioning(str(workdir)) == []


def test_missing_binaries_name_the_build_script(tmp_path: Path) -> None:
    with pytest.raises(localkube.BinariesMissingError, match="scripts/build-kube.sh"):
        localkube.Cluster.start(tmp_path / "wd", bin_dir=tmp_path / "empty")


def test_build_script_and_library_agree_on_the_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "build-kube.sh"
    monkeypatch.delenv(binaries.BIN_DIR_ENV, raising=False)
    printed = subprocess.run(
        ["bash", str(script), "--print-dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(printed) == localkube.default_bin_dir()
    monkeypatch.setenv(binaries.BIN_DIR_ENV, "/tmp/elsewhere")
    assert localkube.default_bin_dir() == Path("/tmp/elsewhere")
    printed = subprocess.run(
        ["bash", str(script), "--print-dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert printed == "/tmp/elsewhere"
