"""The chart's ValidatingAdmissionPolicies on the real apiserver (docs/operator.md,
"Admission policies"): the cluster-wide operator's ServiceAccount confined to namespaces
that hold a ServingDeployment, and hand edits of owned objects refused with no pod replaced.

One release (`adm`, cluster-wide, in `adm-system`) serves the module; its operator runs as
a process with that release's ServiceAccount token, so RBAC and the policies are what the
operator gets. Requests "as the operator" use the same token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_operator_reconcile import (
    CHART,
    DEADLINE_S,
    Operator,
    apply,
    engine_pods,
    fixed_sd,
    must_get,
    namespace,
    pod_identities,
    reconciled,
    replica_sets,
)  # fmt: skip

from conftest import eventually
from slipstream import localkube

RELEASE, RELEASE_NS = "adm", "adm-system"
FULLNAME = "adm-slipstream"
APP_NS = "adm-app"  # holds a ServingDeployment
EMPTY_NS = "adm-empty"  # holds none
EDIT_REFUSAL = "edit the ServingDeployment instead"


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster) -> Iterator[Operator]:
    """Release `adm` with the chart's default policies; its operator as its ServiceAccount."""
    for ns in (APP_NS, EMPTY_NS):
        namespace(cluster, ns)
    cluster.helm("install", RELEASE, str(CHART), f"--namespace={RELEASE_NS}", "--create-namespace")
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/servingdeployments.serving.slipstream.dev", "crd/clusterkopfpeerings.kopf.dev",
    )  # fmt: skip
    op = Operator(cluster, token(cluster), "admission", f"--peering={FULLNAME}",
                  env={"SLIPSTREAM_ADMIN_SEED_SECRET": f"{RELEASE_NS}/{FULLNAME}-admin-seed"})  # fmt: skip
    op.start()
    try:
        yield op
    finally:
        op.stop()
        cluster.helm("uninstall", RELEASE, f"--namespace={RELEASE_NS}", check=False)


def token(cluster: localkube.Cluster) -> Path:
    return cluster.token_kubeconfig(RELEASE_NS, FULLNAME)


def configmap(ns: str, owner: dict[str, Any] | None = None) -> str:
    """A ConfigMap to create, owned by the ServingDeployment ``owner`` (as the operator's are) or by nothing."""
    meta: dict[str, Any] = {"name": "vap-probe", "namespace": ns}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True}]  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"probe": "1"}})


def create_as_operator(cluster: localkube.Cluster, document: str) -> Any:
    """Create ``document`` as the operator's ServiceAccount (its RBAC allows ConfigMaps anywhere)."""
    return cluster.kubectl("create", "-f", "-", kubeconfig=token(cluster), input=document, check=False)


def assert_refused(cluster: localkube.Cluster, result: Any, ns: str, message: str) -> None:
    assert result.returncode != 0, f"the operator created a ConfigMap in {ns}"
    assert f"{FULLNAME}-confine" in result.stderr and message in result.stderr, result.stderr
    assert cluster.kubectl("get", "configmap", "vap-probe", f"--namespace={ns}", check=False).returncode != 0


def replica_set_uids(cluster: localkube.Cluster, ns: str, name: str) -> set[str]:
    return {rs["metadata"]["uid"] for rs in replica_sets(cluster, ns, name).values()}


def serving(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, Any]:
    """Apply a Fixed ServingDeployment and wait until its engine pods are Ready."""
    apply(cluster, ns, fixed_sd(name))

    def ready() -> dict[str, Any]:
        reconciled(cluster, ns, name)
        deployment = must_get(cluster, "deployment", name, ns)
        assert deployment.get("status", {}).get("readyReplicas") == deployment["spec"]["replicas"], deployment.get("status")
        return deployment

    return eventually(ready, deadline_s=DEADLINE_S, what=f"{ns}/{name} ready")


def test_the_operator_writes_only_what_a_servingdeployment_owns_and_never_in_system_namespaces(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    serving(cluster, APP_NS, "held")  # its normal work, created and patched as its ServiceAccount
    assert "forbidden" not in operator.log().lower(), operator.log_tail()
    held = must_get(cluster, "sd", "held", APP_NS)
    unowned = "only when a ServingDeployment there owns them"
    assert_refused(cluster, create_as_operator(cluster, configmap(APP_NS)), APP_NS, unowned)
    assert_refused(cluster, create_as_operator(cluster, configmap(EMPTY_NS)), EMPTY_NS, unowned)
    closed = "system namespaces and its own are closed to it"
    for ns in ("kube-system", RELEASE_NS):  # an ownerReference (forged here) does not open them
        assert_refused(cluster, create_as_operator(cluster, configmap(ns, owner=held)), ns, closed)
    owned = create_as_operator(cluster, configmap(APP_NS, owner=held))
    assert owned.returncode == 0, owned.stderr
    # A namespace opts in with the label; Events pass everywhere.
    cluster.kubectl("label", "namespace", EMPTY_NS, "serving.slipstream.dev/operator-writes=allowed")
    opened = create_as_operator(cluster, configmap(EMPTY_NS))
    assert opened.returncode == 0, opened.stderr
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "probe-", "namespace": RELEASE_NS},
             "involvedObject": {"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NS}, "reason": "Probe", "message": "probe"}  # fmt: skip
    posted = create_as_operator(cluster, json.dumps(event))
    assert posted.returncode == 0, posted.stderr


def test_hand_edits_of_owned_objects_are_refused_and_no_engine_pod_is_replaced(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    deployment = serving(cluster, APP_NS, "guarded")
    pods, sets = pod_identities(cluster, APP_NS, "guarded"), replica_set_uids(cluster, APP_NS, "guarded")
    assert pods and sets
    scaled = cluster.kubectl("scale", "deployment", "guarded", "--replicas=3", f"--namespace={APP_NS}", check=False)
    assert scaled.returncode != 0 and EDIT_REFUSAL in scaled.stderr, scaled.stderr
    assert "kubectl edit servingdeployment guarded -n adm-app" in scaled.stderr, scaled.stderr
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--log-level=debug"}]
    added = cluster.kubectl("patch", "deployment", "guarded", f"--namespace={APP_NS}", "--type=json",
                            "-p", json.dumps(patch), check=False)  # fmt: skip
    assert added.returncode != 0 and EDIT_REFUSAL in added.stderr, added.stderr
    service = cluster.kubectl("patch", "service", "guarded", f"--namespace={APP_NS}", "--type=merge",
                              "-p", '{"spec": {"sessionAffinity": "ClientIP"}}', check=False)  # fmt: skip
    assert service.returncode != 0 and EDIT_REFUSAL in service.stderr, service.stderr
    setting = cluster.kubectl("patch", "configmap", "guarded-engine-setting", f"--namespace={APP_NS}", "--type=merge",
                              "-p", '{"data": {"hand": "edit"}}', check=False)  # fmt: skip
    assert setting.returncode != 0 and EDIT_REFUSAL in setting.stderr, setting.stderr
    # Metadata is not spec: labels (and the controllers' annotations and finalizers) pass.
    cluster.kubectl("label", "deployment", "guarded", "team=a", f"--namespace={APP_NS}")

    after = must_get(cluster, "deployment", "guarded", APP_NS)
    assert after["metadata"]["generation"] == deployment["metadata"]["generation"]
    assert after["spec"] == deployment["spec"]
    assert pod_identities(cluster, APP_NS, "guarded") == pods
    assert replica_set_uids(cluster, APP_NS, "guarded") == sets

    # Editing the ServingDeployment is the way, and the operator's own writes pass.
    cluster.kubectl("patch", "sd", "guarded", f"--namespace={APP_NS}", "--type=merge", "-p", '{"spec": {"replicas": 2}}')

    def scaled_by_the_operator() -> None:
        assert must_get(cluster, "deployment", "guarded", APP_NS)["spec"]["replicas"] == 2
        assert len(engine_pods(cluster, APP_NS, "guarded")) == 2

    eventually(scaled_by_the_operator, deadline_s=DEADLINE_S, what="the ServingDeployment's replicas reached")
    assert set(pods) <= set(pod_identities(cluster, APP_NS, "guarded")), "an engine pod was replaced"


def test_a_namespaced_install_serves_its_namespaces_and_has_no_rights_elsewhere(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    served = [namespace(cluster, ns) for ns in ("adm-team-a", "adm-team-b")]
    other = namespace(cluster, "adm-team-c")
    operator.stop()  # the cluster-wide operator would serve these namespaces too
    release, release_ns = "adm-teams", "adm-teams-system"
    try:
        cluster.helm("install", release, str(CHART), f"--namespace={release_ns}", "--create-namespace",
                     f"--set=watchNamespaces={{{','.join(served)}}}", "--set=peering.name=teams")  # fmt: skip
        kubeconfig = cluster.token_kubeconfig(release_ns, f"{release}-slipstream")
        scoped = Operator(cluster, kubeconfig, "teams", *(f"--namespace={ns}" for ns in served), "--peering=teams",
                          env={"SLIPSTREAM_ADMIN_SEED_SECRET": f"{release_ns}/{release}-slipstream-admin-seed"})  # fmt: skip
        scoped.start()
        try:
            for ns in served:
                serving(cluster, ns, "scoped")
            assert "forbidden" not in scoped.log().lower(), scoped.log_tail()
            refused = cluster.kubectl("scale", "deployment", "scoped", "--replicas=2", f"--namespace={served[1]}", check=False)
            assert refused.returncode != 0 and EDIT_REFUSAL in refused.stderr, refused.stderr
        finally:
            scoped.stop()
        for ns in (other, "kube-system", "default"):
            for verb, resource in (("create", "deployments"), ("create", "configmaps"), ("get", "servingdeployments")):
                can = cluster.kubectl("auth", "can-i", verb, resource, f"--namespace={ns}", kubeconfig=kubeconfig, check=False)
                assert can.stdout.strip() == "no", f"{verb} {resource} in {ns}: {can.stdout}{can.stderr}"
    finally:
        cluster.helm("uninstall", release, f"--namespace={release_ns}", check=False)
        operator.start()
