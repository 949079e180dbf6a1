"""The chart's ValidatingAdmissionPolicies on the real apiserver (docs/operator.md,
"Admission policies"): the cluster-wide operator's ServiceAccount confined to namespaces
that hold a ServingDeployment, and hand edits of owned objects refused with no pod replaced.

One release (`adm`, cluster-wide, in `adm-system`) serves the module; its operator runs as
a process with that release's ServiceAccount token, so RBAC and the policies are what the
operator gets. Requests "as the operator" use the same token.
"""

from __future__ import annotations

import json
import time
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
    events,
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


# -- autoscalers (issue 40, item 1) --------------------------------------------------------

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
"""The HPA controller's identity (kube-controller-manager runs with per-controller
ServiceAccounts here, as kubeadm sets it up): the chart's default `autoscalers`."""


def hpa(name: str, ns: str, low: int, high: int) -> str:
    return json.dumps({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name, "namespace": ns},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "minReplicas": low, "maxReplicas": high},
    })  # fmt: skip


def rescales(cluster: localkube.Cluster, ns: str, name: str) -> int:
    """SuccessfulRescale Events the HPA controller posted for `name` (their counts summed)."""
    listed = json.loads(cluster.kubectl("get", "events", f"--namespace={ns}", "-o", "json",
                                        f"--field-selector=involvedObject.kind=HorizontalPodAutoscaler,"
                                        f"involvedObject.name={name}").stdout)  # fmt: skip
    return sum(e.get("count") or 1 for e in listed["items"] if e.get("reason") == "SuccessfulRescale")


def reasons(cluster: localkube.Cluster, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in events(cluster, ns, name)]


def replicas_condition(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, Any] | None:
    conditions = must_get(cluster, "sd", name, ns).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "ReplicasManagedElsewhere"), None)


def replicas_owners(cluster: localkube.Cluster, name: str) -> set[str]:
    """The field managers that own spec.replicas of the engine Deployment (the operator's is
    `slipstream`: it applies them)."""
    deployment = json.loads(cluster.kubectl("get", "deployment", name, f"--namespace={APP_NS}", "-o", "json",
                                            "--show-managed-fields").stdout)  # fmt: skip
    fields = deployment["metadata"].get("managedFields") or []
    assert fields, "no managedFields shown"
    return {e["manager"] for e in fields if "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {})}


def as_user(cluster: localkube.Cluster, user: str) -> tuple[str, ...]:
    """Impersonate the ServiceAccount `user` with the `edit` role in APP_NS added to its own
    rights (a RoleBinding), so that only the admission policy can refuse a write of
    Deployments there (system:masters would make it pass as an operator would: a
    ServiceAccount that may patch ServingDeployment status)."""
    binding = "vap-edit-" + user.rsplit(":", 1)[-1]
    ns, _, name = user.removeprefix("system:serviceaccount:").partition(":")
    cluster.kubectl("create", "rolebinding", binding, "--clusterrole=edit", f"--serviceaccount={ns}:{name}",
                    f"--namespace={APP_NS}", check=False)  # fmt: skip

    def bound() -> None:
        can = cluster.kubectl("auth", "can-i", "patch", "deployments", f"--namespace={APP_NS}", f"--as={user}", check=False)
        assert can.stdout.strip() == "yes", can.stdout + can.stderr

    eventually(bound, deadline_s=DEADLINE_S, what=f"{user} may patch deployments")
    return (f"--as={user}",)


def test_only_the_hpa_controller_may_scale_an_engine_deployment_and_only_through_scale(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    serving(cluster, APP_NS, "scaler")
    other = as_user(cluster, "system:serviceaccount:kube-system:replicaset-controller")
    autoscaler = as_user(cluster, HPA_USER)
    refused = cluster.kubectl("scale", "deployment", "scaler", "--replicas=3", f"--namespace={APP_NS}", *other, check=False)
    assert refused.returncode != 0 and EDIT_REFUSAL in refused.stderr, refused.stderr
    edit = cluster.kubectl("patch", "deployment", "scaler", f"--namespace={APP_NS}", "--type=merge", *autoscaler,
                           "-p", '{"spec": {"replicas": 3}}', check=False)  # fmt: skip
    assert edit.returncode != 0 and EDIT_REFUSAL in edit.stderr, "the HPA's identity may write only /scale"
    gone = cluster.kubectl("delete", "deployment", "scaler", f"--namespace={APP_NS}", *autoscaler, check=False)
    assert gone.returncode != 0 and "deleting it would stop engines" in gone.stderr, gone.stderr
    assert must_get(cluster, "deployment", "scaler", APP_NS)["spec"]["replicas"] == 1
    allowed = cluster.kubectl("scale", "deployment", "scaler", "--replicas=2", f"--namespace={APP_NS}", *autoscaler,
                              check=False)  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    cluster.kubectl("delete", "sd", "scaler", f"--namespace={APP_NS}", "--wait=false")


def test_a_real_hpa_scales_the_engines_under_the_default_policies_and_is_never_fought(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    """kube-controller-manager's HPA controller (minReplicas 2 over the spec's 1) scales the
    engine Deployment through /scale, which the default policy lets it do; the operator
    leaves the replicas to it at the first write it sees (one rescale in all: no revert),
    names it in ReplicasManagedElsewhere (reason Autoscaler) and one AutoscalerFound Event.
    With both set, a change of the ServingDeployment's replicas is not applied while the HPA
    stands (an Event says so); deleting the HPA hands them back. No engine pod is replaced."""
    name = "autoscaled"
    serving(cluster, APP_NS, name)
    first = engine_states(cluster, APP_NS, name)
    cluster.kubectl("apply", "-f", "-", input=hpa(name, APP_NS, 2, 3))
    try:
        def left_to_the_hpa() -> dict[str, Any]:
            deployment = must_get(cluster, "deployment", name, APP_NS)
            assert deployment["spec"]["replicas"] == 2, deployment["spec"]["replicas"]
            c = replicas_condition(cluster, APP_NS, name)
            assert c is not None and c["status"] == "True" and c["reason"] == "Autoscaler", c
            assert f"HorizontalPodAutoscaler {name}" in c["message"], c
            assert reasons(cluster, APP_NS, name).count("AutoscalerFound") == 1
            assert replicas_owners(cluster, name) == {"kube-controller-manager"}, "the operator still applies replicas"
            return deployment

        started = time.monotonic()
        deployment = eventually(left_to_the_hpa, deadline_s=DEADLINE_S, what="the HPA's replicas left to it")
        print(f"HPA: replicas left to it {time.monotonic() - started:.1f} s after it was created")
        assert rescales(cluster, APP_NS, name) == 1, "the operator reverted the HPA's scale"
        assert "ReplicasContested" not in reasons(cluster, APP_NS, name)

        # Both set: the ServingDeployment asks for 3; the HPA (min 2, max 3) keeps its 2.
        cluster.kubectl("patch", "sd", name, f"--namespace={APP_NS}", "--type=merge", "-p", '{"spec": {"replicas": 3}}')
        eventually(lambda: assert_in("ReplicasLeftToAutoscaler", reasons(cluster, APP_NS, name)),
                   deadline_s=DEADLINE_S, what="the spec's replicas left to the HPA")  # fmt: skip
        after = must_get(cluster, "deployment", name, APP_NS)
        assert after["spec"]["replicas"] == 2 and after["metadata"]["generation"] == deployment["metadata"]["generation"]
        assert rescales(cluster, APP_NS, name) == 1
        c = replicas_condition(cluster, APP_NS, name)
        assert c is not None and c["reason"] == "Autoscaler", c
    finally:
        cluster.kubectl("delete", "hpa", name, f"--namespace={APP_NS}", "--wait=true")

    def taken_back() -> None:
        deployment = must_get(cluster, "deployment", name, APP_NS)
        assert deployment["spec"]["replicas"] == 3, deployment["spec"]["replicas"]
        assert replicas_owners(cluster, name) == {"slipstream"}
        assert replicas_condition(cluster, APP_NS, name) is None
        assert "ReplicasTakenBack" in reasons(cluster, APP_NS, name)
        assert len(engine_pods(cluster, APP_NS, name)) == 3

    eventually(taken_back, deadline_s=DEADLINE_S, what="the replicas taken back from the deleted HPA")
    now = engine_states(cluster, APP_NS, name)
    assert all(now.get(pod) == state for pod, state in first.items()), f"an engine pod was replaced: {first} -> {now}"
    cluster.kubectl("delete", "sd", name, f"--namespace={APP_NS}", "--wait=false")


def assert_in(item: str, items: list[str]) -> None:
    assert item in items, items


def engine_states(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{pod name: (uid, restart count of each container)}: equal before and after means no
    engine pod was replaced or restarted."""
    return {
        pod: (p["metadata"]["uid"], tuple(s.get("restartCount", 0) for s in p.get("status", {}).get("containerStatuses", [])))
        for pod, p in engine_pods(cluster, ns, name).items()
    }  # fmt: skip


# -- every verb (issue 40, item 2) --------------------------------------------------------

DELETE_REFUSAL = "deleting it would stop engines or leave them unserved"
POD_REFUSAL = "may not change by hand"
OWNER_REFUSAL = "its ownerReferences and the labels the operator sets tie it"


def refused_with(result: Any, *texts: str) -> None:
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for text in texts:
        assert text in result.stderr, result.stderr


def forged_owner(uid: str = "00000000-0000-0000-0000-000000000000") -> str:
    return json.dumps({"metadata": {"ownerReferences": [
        {"apiVersion": "serving.slipstream.dev/v1alpha1", "kind": "ServingDeployment", "name": "other",
         "uid": uid, "controller": True}]}})  # fmt: skip


def test_deletes_pod_edits_and_forged_owners_are_refused_and_no_engine_pod_is_replaced(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    name = "verbs"
    deployment = serving(cluster, APP_NS, name)
    pods, sets = engine_states(cluster, APP_NS, name), replica_set_uids(cluster, APP_NS, name)
    assert pods and sets
    ns = f"--namespace={APP_NS}"
    for kind, obj in (("deployment", name), ("service", name), ("configmap", f"{name}-engine-setting")):
        refused_with(cluster.kubectl("delete", kind, obj, ns, "--wait=false", check=False), DELETE_REFUSAL,
                     f"kubectl edit servingdeployment {name} -n {APP_NS}")  # fmt: skip
    refused_with(cluster.kubectl("delete", "deployment", name, ns, "--cascade=orphan", check=False), DELETE_REFUSAL)
    # A forged owner, a removed one, or the operator's label changed would take the object
    # out of the policy (and the drift watch); other labels still pass.
    refused_with(cluster.kubectl("patch", "service", name, ns, "--type=merge", "-p", forged_owner(), check=False),
                 OWNER_REFUSAL)  # fmt: skip
    refused_with(cluster.kubectl("patch", "deployment", name, ns, "--type=json",
                                 "-p", '[{"op": "remove", "path": "/metadata/ownerReferences"}]', check=False),
                 OWNER_REFUSAL)  # fmt: skip
    refused_with(cluster.kubectl("label", "configmap", f"{name}-engine-setting", ns, "app.kubernetes.io/managed-by-",
                                 check=False), OWNER_REFUSAL)  # fmt: skip
    cluster.kubectl("label", "service", name, ns, "team=a")

    pod = sorted(pods)[0]
    why = f"pod {pod} is an engine of ServingDeployment {name}"
    refused_with(cluster.kubectl("set", "image", f"pod/{pod}", "engine=other:2", ns, check=False), why, POD_REFUSAL)
    refused_with(cluster.kubectl("label", "pod", pod, ns, "serving.slipstream.dev/name=stray", "--overwrite", check=False),
                 why)  # fmt: skip
    refused_with(cluster.kubectl("label", "pod", pod, ns, "pod-template-hash-", check=False), why)
    refused_with(cluster.kubectl("patch", "pod", pod, ns, "--type=json",
                                 "-p", '[{"op": "remove", "path": "/metadata/ownerReferences"}]', check=False), why)  # fmt: skip
    refused_with(cluster.kubectl("patch", "pod", pod, ns, "--type=merge", "-p", forged_owner(), check=False), why)
    cluster.kubectl("label", "pod", pod, ns, "team=a")  # a label of one's own passes
    cluster.kubectl("annotate", "pod", pod, ns, "note=checked")

    after = must_get(cluster, "deployment", name, APP_NS)
    assert after["metadata"]["generation"] == deployment["metadata"]["generation"] and after["spec"] == deployment["spec"]
    assert engine_states(cluster, APP_NS, name) == pods
    assert replica_set_uids(cluster, APP_NS, name) == sets
    assert must_get(cluster, "pod", pod, APP_NS)["spec"]["containers"][0]["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]

    # The controllers the policy lets through still clean up: deleting the ServingDeployment
    # removes what it owns (the garbage collector), engine pods included.
    cluster.kubectl("delete", "sd", name, ns, "--wait=false")

    def collected() -> None:
        for kind, obj in (("deployment", name), ("service", name), ("configmap", f"{name}-engine-setting")):
            assert cluster.kubectl("get", kind, obj, ns, check=False).returncode != 0, f"{kind} {obj} still there"
        assert not engine_pods(cluster, APP_NS, name)

    eventually(collected, deadline_s=DEADLINE_S, what="the owned objects garbage-collected")


def test_with_the_policy_off_a_deleted_owned_object_is_recreated_at_once_with_an_event(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    """The drift watch's fallback (admissionPolicies.ownedObjects off, via helm upgrade): a
    deleted Service or engine Deployment is created again from the spec on its DELETED
    event, with a `Recreated` Warning; an orphaning delete of the Deployment leaves the pods,
    which the recreated Deployment adopts, so none is replaced."""
    name = "repaired"
    serving(cluster, APP_NS, name)
    pods, sets = engine_states(cluster, APP_NS, name), replica_set_uids(cluster, APP_NS, name)
    ns = f"--namespace={APP_NS}"
    cluster.helm("upgrade", RELEASE, str(CHART), f"--namespace={RELEASE_NS}", "--reuse-values",
                 "--set=admissionPolicies.ownedObjects.enabled=false")  # fmt: skip
    try:
        for kind, delete in (("service", ()), ("deployment", ("--cascade=orphan",))):
            print(f"deleted {kind} recreated in {deleted_and_recreated(cluster, kind, name, *delete):.1f} s")
        assert "Deployment, Service and ConfigMap match the spec" in json.dumps(must_get(cluster, "sd", name, APP_NS)["status"])

        def adopted() -> None:
            deployment = must_get(cluster, "deployment", name, APP_NS)
            assert deployment.get("status", {}).get("readyReplicas") == 1, deployment.get("status")
            assert replica_set_uids(cluster, APP_NS, name) == sets

        eventually(adopted, deadline_s=DEADLINE_S, what="the old ReplicaSet adopted")
        assert engine_states(cluster, APP_NS, name) == pods, "an engine pod was replaced"
    finally:
        cluster.helm("upgrade", RELEASE, str(CHART), f"--namespace={RELEASE_NS}", "--reuse-values",
                     "--set=admissionPolicies.ownedObjects.enabled=true")  # fmt: skip
        cluster.kubectl("delete", "sd", name, ns, "--wait=false")


def deleted_and_recreated(cluster: localkube.Cluster, kind: str, name: str, *flags: str) -> float:
    """Delete an owned object (once the admission policy lets it) and wait until the operator
    has created it again, with one more `Recreated` Event; seconds from the delete."""
    before = must_get(cluster, kind, name, APP_NS)["metadata"]["uid"]
    recreated = reasons(cluster, APP_NS, name).count("Recreated")

    def deleted() -> None:  # the policy's removal reaches admission within a moment
        result = cluster.kubectl("delete", kind, name, f"--namespace={APP_NS}", "--wait=true", *flags, check=False)
        assert result.returncode == 0, result.stderr

    eventually(deleted, deadline_s=DEADLINE_S, what=f"{kind} deleted")
    started = time.monotonic()

    def back() -> None:
        assert must_get(cluster, kind, name, APP_NS)["metadata"]["uid"] != before
        assert reasons(cluster, APP_NS, name).count("Recreated") == recreated + 1

    eventually(back, deadline_s=DEADLINE_S, what=f"{kind} recreated")
    return time.monotonic() - started
