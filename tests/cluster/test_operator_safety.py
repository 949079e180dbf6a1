"""Safety of the operator on a real control plane (issue 10): least-privilege RBAC proven
with the chart's ServiceAccount, the operator Deployment under the `restricted` Pod
Security Standard, the chart's smaller fixes, specs Kubernetes refuses made visible, and
hand edits of owned objects reverted with an Event.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from test_operator_reconcile import (
    CHART,
    RELEASE_NS,
    Operator,
    apply,
    container,
    events,
    fixed_sd,
    get,
    installed_operator,
    merged,
    must_get,
    namespace,
    reconciled,
    rolled_out,
)

from conftest import eventually
from slipstream import localkube

DEADLINE_S = 60


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster) -> Iterator[Operator]:
    # The drift watch is what these tests check: the owned-objects admission policy, which
    # would refuse the hand edits first, is off (test_admission_policies.py checks it).
    yield from installed_operator(cluster, "safety", env={"SLIPSTREAM_TUNING_TIME_SCALE": "0.1"},
                                  sets=("admissionPolicies.ownedObjects.enabled=false",))  # fmt: skip


def drift_skips(operator: Operator) -> float:
    """Deployment events the drift watch skipped without a read (the operator's metrics)."""
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
        text = response.read().decode()
    found = re.findall(r'^slipstream_drift_events_skipped_total\{kind="Deployment"\} (\S+)$', text, re.M)
    return float(found[0]) if found else 0.0


def can_i(cluster: localkube.Cluster, operator: Operator, *args: str) -> bool:
    result = cluster.kubectl("auth", "can-i", *args, kubeconfig=operator.kubeconfig, check=False)
    assert result.stdout.strip() in ("yes", "no"), (args, result.stdout, result.stderr)
    return result.stdout.strip() == "yes"


# -- RBAC: what the operator needs, and nothing it has no business with ---------------------

NEEDED = [
    ("watch", "servingdeployments.serving.slipstream.dev", "--all-namespaces"),
    ("patch", "servingdeployments.serving.slipstream.dev", "--subresource=status", "-n", "team-x"),
    ("patch", "deployments.apps", "-n", "team-x"),
    ("watch", "deployments.apps", "--all-namespaces"),
    ("patch", "services", "-n", "team-x"),
    ("patch", "configmaps", "-n", "team-x"),
    ("list", "pods", "-n", "team-x"),
    ("create", "secrets", "-n", "team-x"),
    ("create", "events", "-n", "team-x"),
    ("get", "secret/slipstream-admin-seed", "-n", RELEASE_NS),
    ("get", "secret/kimi-k3-admin", "-n", "team-x"),  # a name listed in rbac.secretNames
]
DENIED = [
    ("get", "secrets", "-n", "team-x"),
    ("get", "secret/other-admin", "-n", "team-x"),
    ("list", "secrets", "--all-namespaces"),
    ("get", "secret/sh.helm.release.v1.slipstream.v1", "-n", RELEASE_NS),
    ("get", "secrets", "-n", "kube-system"),
    ("delete", "deployments.apps", "-n", "team-x"),
    ("delete", "servingdeployments.serving.slipstream.dev", "-n", "team-x"),
    ("update", "servingdeployments.serving.slipstream.dev", "-n", "team-x"),
    ("create", "pods", "-n", "team-x"),
    ("patch", "pods", "-n", "team-x"),
    ("get", "nodes"),
    ("create", "namespaces"),
    ("patch", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io", "-n", "team-x"),
    ("patch", "kopfpeerings.kopf.dev", "-n", "team-x"),
]


def test_the_service_account_may_do_what_the_operator_needs_and_no_more(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    allowed = {args for args in NEEDED if can_i(cluster, operator, *args)}
    assert allowed == set(NEEDED), f"missing: {set(NEEDED) - allowed}"
    leaks = [args for args in DENIED if can_i(cluster, operator, *args)]
    assert not leaks, f"granted but not needed: {leaks}"
    # Not just the verdict: the request itself is refused.
    release = cluster.kubectl("get", "secret", "sh.helm.release.v1.slipstream.v1", f"--namespace={RELEASE_NS}",
                              kubeconfig=operator.kubeconfig, check=False)  # fmt: skip
    assert release.returncode != 0 and "forbidden" in release.stderr.lower(), release.stderr


def test_the_operator_deployment_passes_the_restricted_pod_security_standard(cluster: localkube.Cluster) -> None:
    ns = namespace(cluster, "restricted")
    cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    cluster.kubectl("create", "serviceaccount", "x-slipstream", f"--namespace={ns}")
    rendered = cluster.helm("template", "x", str(CHART), f"--namespace={ns}").stdout
    (dep,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator", "namespace": ns},
           "spec": dep["spec"]["template"]["spec"]}  # fmt: skip
    admitted = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert admitted.returncode == 0, admitted.stderr
    # The admission is on: a pod without the restrictions is refused in that namespace.
    bare = {**pod, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    refused = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(bare), check=False)
    assert refused.returncode != 0 and "restricted" in refused.stderr, refused.stderr


def test_the_chart_renders_offline_and_refuses_a_port_clash(cluster: localkube.Cluster) -> None:
    offline = cluster.helm("template", "x", str(CHART))  # no --kube-version
    docs = [d for d in yaml.safe_load_all(offline.stdout) if d]
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert not [r for r in rules if "kopfpeerings" in r["resources"]], "namespaced peering rights cluster-wide"
    assert not [r for r in rules if "secrets" in r["resources"] and "get" in r["verbs"]], "secrets readable everywhere"
    scoped = cluster.helm("template", "x", str(CHART), "--set=watchNamespace=team-a").stdout
    scoped_rules = [r for d in yaml.safe_load_all(scoped) if d and d["kind"] == "ClusterRole" for r in d["rules"]]
    assert not [r for r in scoped_rules if "clusterkopfpeerings" in r["resources"]]
    clash = cluster.helm("template", "x", str(CHART), "--set=healthPort=9090", check=False)
    assert clash.returncode != 0 and "healthPort and metrics.port must differ" in clash.stderr, clash.stderr


def test_a_second_release_installs_beside_the_first(cluster: localkube.Cluster, operator: Operator) -> None:
    try:
        cluster.helm("install", "other", str(CHART), "--namespace=other-system", "--create-namespace")
        peering = json.loads(cluster.kubectl("get", "clusterkopfpeering", "other-slipstream", "-o", "json").stdout)
        assert peering["metadata"]["name"] == "other-slipstream"
    finally:
        cluster.helm("uninstall", "other", "--namespace=other-system", check=False)


# -- specs the CRD refuses, and what Kubernetes refuses later ------------------------------

REFUSED = [
    ("dotted name", {"metadata": {"name": "kimi.k3"}}, "metadata.name must be a DNS label"),
    ("70-character name", {"metadata": {"name": "k" * 70}}, "metadata.name must be a DNS label"),
    ("quantity lots", {"spec": {"engine": {"resources": {"requests": {"cpu": "lots"}}}}}, "spec.engine.resources.requests.cpu"),
    ("env name", {"spec": {"engine": {"env": [{"name": "1 BAD=", "value": "x"}]}}}, "spec.engine.env[0].name"),
]


@pytest.mark.parametrize(("what", "changes", "expected"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_crd_refuses_what_would_break_an_owned_object(
    cluster: localkube.Cluster, operator: Operator, what: str, changes: dict[str, Any], expected: str
) -> None:
    doc = merged(fixed_sd("refused"), changes)
    result = cluster.kubectl("apply", "--dry-run=server", "--namespace=default", "-f", "-",
                             input=yaml.safe_dump(doc), check=False)  # fmt: skip
    assert result.returncode != 0 and expected in result.stderr, f"{what}: {result.stderr}"


def test_an_owned_object_kubernetes_refuses_gives_a_condition_and_one_warning(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = namespace(cluster, "refused-object")
    # Requests above limits: each quantity is valid (the CRD cannot compare them); the
    # Deployment built from them is refused.
    apply(cluster, ns, fixed_sd("picky", resources={"requests": {"cpu": 4}, "limits": {"cpu": 2}}))
    message = _refused_with_one_warning(cluster, operator, ns, "picky", "DeploymentRefused")
    assert "resources.requests" in message and "limit" in message, message


def _refused_with_one_warning(cluster: localkube.Cluster, operator: Operator, ns: str, name: str, reason: str) -> str:
    """Waits for phase Degraded with Reconciled False for `reason`, a retry, and checks
    that the retries made one Warning Event, not one each; returns the condition's message."""

    def degraded() -> dict[str, Any]:
        sd = must_get(cluster, "sd", name, ns)
        assert sd.get("status", {}).get("phase") == "Degraded", sd.get("status")
        return sd

    sd = eventually(degraded, deadline_s=DEADLINE_S, what=f"{name} degraded")
    (cond,) = [c for c in sd["status"]["conditions"] if c["type"] == "Reconciled"]
    assert cond["status"] == "False" and cond["reason"] == reason, cond
    eventually(lambda: _retried(operator, ns), deadline_s=DEADLINE_S, what="a retry of the reconcile")
    warnings = [e for e in events(cluster, ns, name) if e["reason"] == reason]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and warnings[0].get("count", 1) == 1, warnings
    return str(cond["message"])


def test_a_model_the_patched_engine_refuses_gets_no_pods_a_condition_and_one_warning(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = namespace(cluster, "unsupported-model")
    # gpt-oss is a hybrid sliding-window model: the engine would refuse T > 0 at start-up,
    # so the operator refuses first and creates no Deployment (no crash-looping pods).
    apply(cluster, ns, fixed_sd("swa", model="openai/gpt-oss-20b"))
    message = _refused_with_one_warning(cluster, operator, ns, "swa", "UnsupportedModel")
    assert "gpt-oss" in message and "threshold 0" in message, message
    assert get(cluster, "deployment", "swa", ns) is None


def _retried(operator: Operator, ns: str) -> None:
    assert operator.log().count("Handler 'reconcile' failed temporarily") >= 2 or operator.log().count(
        "DeploymentRefused") >= 2, operator.log_tail()


# -- hand edits ------------------------------------------------------------------------------


def test_hand_edits_of_the_engine_deployment_are_reverted_with_an_event(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = namespace(cluster, "hand-edits")
    doc = fixed_sd("edited")
    doc["spec"]["replicas"] = 2
    apply(cluster, ns, doc)
    eventually(lambda: reconciled(cluster, ns, "edited"), deadline_s=DEADLINE_S, what="edited reconciled")
    eventually(lambda: rolled_out(cluster, ns, "edited"), deadline_s=DEADLINE_S, what="edited rolled out")

    # A scale-up through the spec: the Deployment's spec event is judged, the status events
    # of its new pod (readiness, counts) are skipped without a read (controller/watch/judged.py).
    skipped = drift_skips(operator)
    cluster.kubectl("patch", "sd", "edited", f"--namespace={ns}", "--type=merge", "-p", '{"spec": {"replicas": 3}}')

    def scaled_up() -> None:
        assert rolled_out(cluster, ns, "edited")["spec"]["replicas"] == 3
        assert drift_skips(operator) > skipped, "no status-only event of the scale-up was skipped"

    eventually(scaled_up, deadline_s=DEADLINE_S, what="scaled up to 3, its status events skipped")

    cluster.kubectl("scale", "deployment", "edited", "--replicas=5", f"--namespace={ns}")

    def reverted() -> None:
        dep = must_get(cluster, "deployment", "edited", ns)
        assert dep["spec"]["replicas"] == 3
        messages = [e["message"] for e in events(cluster, ns, "edited") if e["reason"] == "DriftReverted"]
        assert any("spec.replicas: 5 -> 3" in m for m in messages), messages

    eventually(reverted, deadline_s=DEADLINE_S, what="kubectl scale reverted")
    # The same edit again: what the revert left is what was recorded, so it is judged too.
    reverts = len([e for e in events(cluster, ns, "edited") if e["reason"] == "DriftReverted"])
    cluster.kubectl("scale", "deployment", "edited", "--replicas=5", f"--namespace={ns}")

    def reverted_again() -> None:
        assert must_get(cluster, "deployment", "edited", ns)["spec"]["replicas"] == 3
        assert len([e for e in events(cluster, ns, "edited") if e["reason"] == "DriftReverted"]) > reverts

    eventually(reverted_again, deadline_s=DEADLINE_S, what="the second kubectl scale reverted")

    args = container(must_get(cluster, "deployment", "edited", ns))["args"]
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--tp-size=4"}]
    cluster.kubectl("patch", "deployment", "edited", f"--namespace={ns}", "--type=json", "-p", json.dumps(patch))

    def args_reverted() -> None:
        assert container(must_get(cluster, "deployment", "edited", ns))["args"] == args
        messages = [e["message"] for e in events(cluster, ns, "edited") if e["reason"] == "DriftReverted"]
        assert any("added --tp-size=4" in m for m in messages), messages

    eventually(args_reverted, deadline_s=DEADLINE_S, what="extra argument reverted")
    assert "Forbidden" not in operator.log(), "the chart's RBAC is short of something"
