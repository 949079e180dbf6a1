"""The chart rendered by the real helm binary, offline (no cluster, no --kube-version):
RBAC scopes, the per-release peering object, the port clash refusal, the NetworkPolicy,
the namespaced mode and the admission policies.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from slipstream.localkube import binaries, chartrbac

CHART = Path(__file__).resolve().parents[2] / "charts" / "slipstream"


def helm_template(*sets: str, release: str = "r", tmp: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    helm = binaries.default_bin_dir() / "helm"
    if not helm.exists():
        pytest.fail(f"{helm} is missing: {binaries.BUILD_HINT}", pytrace=False)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    # No cluster anywhere: a kubeconfig that names none, helm's homes in tmp.
    env.update({"KUBECONFIG": str(tmp / "none"), "HELM_CACHE_HOME": str(tmp / "c"),
                "HELM_CONFIG_HOME": str(tmp / "cfg"), "HELM_DATA_HOME": str(tmp / "d")})  # fmt: skip
    argv = [str(helm), "template", release, str(CHART), "--namespace=ops", *(f"--set={s}" for s in sets)]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def docs(*sets: str, tmp: Path, release: str = "r") -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(helm_template(*sets, release=release, tmp=tmp).stdout) if d]


def one(rendered: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in rendered if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def rules_for(rendered: list[dict[str, Any]], resource: str) -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], rule) for d in rendered if d["kind"] in ("ClusterRole", "Role")
            for rule in d["rules"] if resource in rule["resources"]]  # fmt: skip


def test_renders_offline_without_kube_version(tmp_path: Path) -> None:
    kinds = {d["kind"] for d in docs(tmp=tmp_path)}
    assert {"Deployment", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "ServiceAccount"} <= kinds
    assert "NetworkPolicy" in kinds  # the operator's own, on by default


def test_no_rule_grants_wildcards_and_secrets_are_read_only_where_granted(tmp_path: Path) -> None:
    rendered = docs("rbac.secretNamespaces={a,b}", tmp=tmp_path)
    for d in rendered:
        for rule in d.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
    secret_rules = sorted((name, tuple(rule["verbs"]), tuple(rule.get("resourceNames", [])))
                          for name, rule in rules_for(rendered, "secrets"))  # fmt: skip
    assert secret_rules == [
        ("r-slipstream", ("create",), ()),  # the generated <name>-admin-key; create reads nothing
        ("r-slipstream-admin-seed", ("get",), ("r-slipstream-admin-seed",)),  # by name only
        ("r-slipstream-secret-reader", ("get",), ()),  # the Secrets specs name, where granted
    ]
    assert one(rendered, "Role", "r-slipstream-admin-seed")["metadata"]["namespace"] == "ops"
    bindings = [d for d in rendered if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and d["roleRef"]["name"] == "r-slipstream-secret-reader"]  # fmt: skip
    assert {(d["kind"], d["metadata"]["namespace"]) for d in bindings} == {("RoleBinding", "a"), ("RoleBinding", "b")}
    assert not rules_for(rendered, "kopfpeerings")  # cluster-wide install: no namespaced peering rights
    (status,) = [rule for _, rule in rules_for(rendered, "servingdeployments/status")]
    assert status["verbs"] == ["patch"]
    (events,) = [rule for _, rule in rules_for(rendered, "events")]
    assert (events["apiGroups"], events["verbs"]) == ([""], ["create"])


def test_namespaced_install_has_namespaced_peering_rights_and_secrets_in_its_namespace(tmp_path: Path) -> None:
    rendered = docs("watchNamespace=team-a", tmp=tmp_path)
    assert not rules_for(rendered, "clusterkopfpeerings")
    peering_rules = rules_for(rendered, "kopfpeerings")
    assert {name for name, _ in peering_rules} == {"r-slipstream"}
    assert one(rendered, "RoleBinding", "r-slipstream")["metadata"]["namespace"] == "team-a"
    assert not [d for d in rendered if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "r-slipstream"]
    assert ("r-slipstream", ["get"]) in [(name, rule["verbs"]) for name, rule in rules_for(rendered, "secrets")]
    patch = [rule for _, rule in peering_rules if "patch" in rule["verbs"]]
    assert patch == [{"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "resourceNames": ["r-slipstream"], "verbs": ["patch"]}]
    assert one(rendered, "KopfPeering", "r-slipstream")["metadata"]["namespace"] == "team-a"


def test_the_peering_object_is_named_per_release(tmp_path: Path) -> None:
    names = []
    for release in ("first", "second"):
        rendered = docs(tmp=tmp_path, release=release)
        peering = [d for d in rendered if d["kind"] == "ClusterKopfPeering"]
        assert len(peering) == 1
        names.append(peering[0]["metadata"]["name"])
        args = one(rendered, "Deployment", f"{release}-slipstream")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--peering={names[-1]}" in args
        patch = [rule for _, rule in rules_for(rendered, "clusterkopfpeerings") if "patch" in rule["verbs"]]
        assert [rule.get("resourceNames") for rule in patch] == [[names[-1]]]
    assert names == ["first-slipstream", "second-slipstream"]
    override = [d for d in docs("peering.name=shared", tmp=tmp_path) if d["kind"] == "ClusterKopfPeering"]
    assert override[0]["metadata"]["name"] == "shared"


def test_health_port_equal_to_the_metrics_port_is_refused(tmp_path: Path) -> None:
    bad = helm_template("healthPort=9090", tmp=tmp_path, check=False)
    assert bad.returncode != 0
    assert "healthPort and metrics.port must differ" in bad.stderr, bad.stderr
    helm_template("healthPort=9090", "metrics.enabled=false", tmp=tmp_path)  # no metrics listener: no clash
    helm_template("healthPort=9091", tmp=tmp_path)


def test_network_policy_limits_egress_to_apiserver_prometheus_engines_and_dns(tmp_path: Path) -> None:
    rendered = docs("networkPolicy.egress.enabled=true", "networkPolicy.apiServer.cidrs={10.0.0.1/32}", tmp=tmp_path)
    policy = one(rendered, "NetworkPolicy", "r-slipstream")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "slipstream", "app.kubernetes.io/instance": "r"}
    assert [[p["port"] for p in rule["ports"]] for rule in policy["ingress"]] == [[9090], [8080, 8081]]
    apiserver, prometheus, engines, dns = policy["egress"]
    assert apiserver == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}],
                         "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}  # fmt: skip
    assert prometheus["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert prometheus["ports"] == [{"port": 9090, "protocol": "TCP"}]
    assert engines["to"] == [{"namespaceSelector": {}, "podSelector": {"matchExpressions": [
        {"key": "serving.slipstream.dev/name", "operator": "Exists"}]}}]  # fmt: skip
    assert engines["ports"] == [{"port": 30000, "protocol": "TCP"}]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert len(policy["egress"]) == 4  # nothing else leaves the operator pod

    scoped = one(docs("networkPolicy.egress.enabled=true", "watchNamespace=team-a", tmp=tmp_path), "NetworkPolicy", "r-slipstream")
    engines = scoped["spec"]["egress"][2]
    assert engines["to"][0]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]}  # fmt: skip
    bad = helm_template("networkPolicy.enabled=true", "networkPolicy.apiServer.cidrs={nonsense}", tmp=tmp_path, check=False)
    assert bad.returncode != 0 and "cidrs" in bad.stderr, bad.stderr


def test_by_default_the_operator_policy_admits_only_its_ports_and_leaves_egress_open(tmp_path: Path) -> None:
    """Hardened by default where it cannot break the operator: ingress to the metrics,
    health and readiness ports only; egress rules (which need the cluster's apiserver and
    Prometheus addresses) only with networkPolicy.egress.enabled."""
    policy = one(docs(tmp=tmp_path), "NetworkPolicy", "r-slipstream")["spec"]
    assert policy["policyTypes"] == ["Ingress"] and "egress" not in policy, policy
    assert [[p["port"] for p in rule["ports"]] for rule in policy["ingress"]] == [[9090], [8080, 8081]]
    assert all("from" not in rule for rule in policy["ingress"])  # the ports, from any source (Prometheus, kubelet)
    off = [d for d in docs("networkPolicy.enabled=false", tmp=tmp_path) if d["kind"] == "NetworkPolicy"]
    assert off == []


def operator_container(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(rendered, "Deployment", "r-slipstream")["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_operator_gets_a_readiness_probe_on_readyz_that_accepts_a_standby(tmp_path: Path) -> None:
    """Ready: serving, or standing by behind the active replica; a probe that failed on the
    standby would hold every rollout of a two-replica Deployment."""
    container = operator_container(docs(tmp=tmp_path))
    probe = container["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz?standby=ok", "port": "ready"}, probe
    assert {"name": "ready", "containerPort": 8081} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SLIPSTREAM_READY_PORT"] == "8081"
    moved = {e["name"]: e.get("value") for e in operator_container(docs("readinessPort=9191", tmp=tmp_path))["env"]}
    assert moved["SLIPSTREAM_READY_PORT"] == "9191"
    for clash in ("readinessPort=8080", "readinessPort=9090"):
        bad = helm_template(clash, tmp=tmp_path, check=False)
        assert bad.returncode != 0 and "readinessPort must differ" in bad.stderr, (clash, bad.stderr)


def test_the_engines_network_policy_peers_reach_the_operator_and_rbac_lets_it_write_them(tmp_path: Path) -> None:
    """The chart renders who may reach the engines into the operator's environment (the
    operator makes one NetworkPolicy per ServingDeployment from it) and grants the write."""
    from slipstream.controller import netpol

    rendered = docs("networkPolicy.engines.clientNamespaces={gateway}",
                    "networkPolicy.prometheus.namespaceSelector.matchLabels.team=obs", tmp=tmp_path)  # fmt: skip
    env = {e["name"]: e.get("value") for e in operator_container(rendered)["env"]}
    peers = netpol.Peers.parse(env["SLIPSTREAM_ENGINE_NETWORK_POLICY"])
    assert peers == netpol.Peers(
        operator_namespace="ops",
        operator_pods={"app.kubernetes.io/name": "slipstream", "app.kubernetes.io/instance": "r"},
        prometheus={"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring", "team": "obs"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        client_namespaces=("gateway",),
    )  # fmt: skip
    rules = [rule for _, rule in rules_for(rendered, "networkpolicies")]
    assert rules == [{"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create", "patch"]}]
    off = docs("networkPolicy.engines.enabled=false", tmp=tmp_path)
    assert "SLIPSTREAM_ENGINE_NETWORK_POLICY" not in {e["name"] for e in operator_container(off)["env"]}
    assert not rules_for(off, "networkpolicies")


OPERATOR = "system:serviceaccount:ops:r-slipstream"


def test_namespaced_mode_binds_roles_in_each_watched_namespace_and_nothing_cluster_wide_creates(tmp_path: Path) -> None:
    rendered = docs("watchNamespaces={team-a,team-b}", tmp=tmp_path)
    bindings = [d for d in rendered if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "r-slipstream"]
    assert sorted(d["metadata"]["namespace"] for d in bindings) == ["team-a", "team-b"]
    assert sorted(d["metadata"]["namespace"] for d in rendered if d["kind"] == "KopfPeering") == ["team-a", "team-b"]
    cluster_bound = {d["roleRef"]["name"] for d in rendered if d["kind"] == "ClusterRoleBinding"}
    assert cluster_bound == {"r-slipstream-cluster"}
    (cluster_role,) = [d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "r-slipstream-cluster"]
    writes = {"create", "update", "patch", "delete"}
    assert not [rule for rule in cluster_role["rules"] if writes & set(rule["verbs"])], cluster_role["rules"]
    args = one(rendered, "Deployment", "r-slipstream")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    # RBAC confines a namespaced install: no confinement policy; the owned objects' one
    # covers only the namespaces served.
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered}
    assert ("ValidatingAdmissionPolicy", "r-slipstream-confine") not in kinds
    owned = one(rendered, "ValidatingAdmissionPolicy", "r-slipstream-owned-objects")["spec"]["matchConstraints"]
    assert owned["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}  # fmt: skip
    # The older single-namespace value is the same as a list of one.
    assert [d["metadata"]["namespace"] for d in docs("watchNamespace=team-a", tmp=tmp_path)
            if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "r-slipstream"] == ["team-a"]  # fmt: skip
    bad = helm_template("watchNamespaces={Team_A}", tmp=tmp_path, check=False)
    assert bad.returncode != 0 and "watchNamespaces" in bad.stderr, bad.stderr


def test_cluster_wide_install_renders_the_confinement_policy_for_its_service_account(tmp_path: Path) -> None:
    rendered = docs(tmp=tmp_path)
    policy = one(rendered, "ValidatingAdmissionPolicy", "r-slipstream-confine")["spec"]
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert (rule["operations"], rule["resources"], rule["scope"]) == (["CREATE", "UPDATE"], ["*/*"], "Namespaced")
    assert [c["expression"] for c in policy["matchConditions"]] == [
        f'request.userInfo.username == "{OPERATOR}"', "request.resource.resource != 'events'"]  # fmt: skip
    closed, owned = policy["validations"]
    for namespace in ("kube-system", "kube-public", "kube-node-lease", "ops"):
        assert f"'{namespace}'" in closed["expression"] or f'"{namespace}"' in closed["expression"]
    assert "r.kind == 'ServingDeployment'" in owned["expression"]
    assert "serving.slipstream.dev/operator-writes" in owned["expression"]
    binding = one(rendered, "ValidatingAdmissionPolicyBinding", "r-slipstream-confine")["spec"]
    assert binding == {"policyName": "r-slipstream-confine", "validationActions": ["Deny"]}
    off = {d["metadata"]["name"] for d in docs("admissionPolicies.confine.enabled=false", tmp=tmp_path)
           if d["kind"].startswith("ValidatingAdmissionPolicy")}  # fmt: skip
    assert off == {"r-slipstream-owned-objects", "r-slipstream-engine-pods"}


def test_owned_objects_policy_matches_spec_writes_and_scale_by_anyone_but_the_operator(tmp_path: Path) -> None:
    rendered = docs(tmp=tmp_path)
    policy = one(rendered, "ValidatingAdmissionPolicy", "r-slipstream-owned-objects")["spec"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["operations"])) for r in policy["matchConstraints"]["resourceRules"]}
    assert rules == {(("apps",), ("deployments", "deployments/scale"), ("UPDATE", "DELETE")),
                     (("",), ("services", "configmaps"), ("UPDATE", "DELETE"))}  # fmt: skip
    assert "namespaceSelector" not in policy["matchConstraints"]  # cluster-wide: every namespace
    conditions = {c["name"]: c["expression"] for c in policy["matchConditions"]}
    assert conditions["not-an-operator"].startswith(f'!(request.userInfo.username == "{OPERATOR}" ||')
    assert "subresource('status')" in conditions["not-an-operator"]
    assert "ServingDeployment" in conditions["owned-by-a-servingdeployment"]
    # Exactly the autoscalers' identities pass on /scale, the controllers on deletes and owners.
    assert '["system:serviceaccount:kube-system:horizontal-pod-autoscaler"]' in conditions["not-an-autoscaler-scaling"]
    assert "request.subResource == 'scale'" in conditions["not-an-autoscaler-scaling"]
    cleanup = {v["name"]: v["expression"] for v in policy["variables"]}["cleanup"]
    assert "system:serviceaccount:kube-system:generic-garbage-collector" in cleanup
    deleted, edited, owners = policy["validations"]
    assert deleted["expression"] == "request.operation != 'DELETE' || variables.cleanup"
    assert "object.spec == oldObject.spec" in edited["expression"]
    assert "variables.instead" in edited["messageExpression"]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert "edit the ServingDeployment instead" in variables["instead"]
    assert "ownerReferences" in owners["expression"] and "serving.slipstream.dev/name" in owners["expression"]
    pods = one(rendered, "ValidatingAdmissionPolicy", "r-slipstream-engine-pods")["spec"]
    assert [r["resources"] for r in pods["matchConstraints"]["resourceRules"]] == [["pods"]]
    (pod_check,) = pods["validations"]
    assert "object.spec == oldObject.spec" in pod_check["expression"]
    assert one(rendered, "ValidatingAdmissionPolicyBinding", "r-slipstream-engine-pods")["spec"]["validationActions"] == ["Deny"]
    assert one(rendered, "ValidatingAdmissionPolicyBinding", "r-slipstream-owned-objects")["spec"]["validationActions"] == ["Deny"]
    off = [d for d in docs("admissionPolicies.ownedObjects.enabled=false", tmp=tmp_path)
           if d["kind"].startswith("ValidatingAdmissionPolicy") and not d["metadata"]["name"].endswith("-confine")]  # fmt: skip
    assert off == []


def test_docs_permission_tables_match_the_charts_rbac(tmp_path: Path) -> None:
    doc = (CHART.parents[1] / "docs" / "operator.md").read_text()
    for mode, sets in chartrbac.INSTALLS.items():
        rendered = docs(*sets, tmp=tmp_path, release=chartrbac.RELEASE)
        assert chartrbac.section(doc, mode) == chartrbac.table(rendered), (
            f"docs/operator.md's {mode} permission table differs from the chart: "
            "run `PYTHONPATH=operator python scripts/permission-table.py`")
    # What the hand-written list once left out is in the table now.
    cluster_wide = chartrbac.section(doc, "cluster-wide")
    for item in ("`customresourcedefinitions` | any | list, watch", "`servingdeployments/finalizers`",
                 "`pods` | any | list", "`servicemonitors`"):  # fmt: skip
        assert item in cluster_wide, item
