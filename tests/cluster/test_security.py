"""Security of the chart and the operator on a real control plane (docs/reliability.md,
"Security"): least-privilege RBAC proven with the chart's ServiceAccount token, a second
release beside the first, what uninstall leaves, the `restricted` Pod Security Standard,
and the admin key absent from logs, Events, status, metrics and the pod spec.

One release (`sec`, cluster-wide, in `sec-system`) serves the module; its operator runs as
a process with that release's ServiceAccount token, so the chart's RBAC is what it gets.
"""

from __future__ import annotations

import base64
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_operator_reconcile import (
    CHART,
    DEADLINE_S,
    Operator,
    apply,
    condition,
    container,
    engine_pods,
    events,
    fixed_sd,
    get,
    must_get,
    reconciled,
)  # fmt: skip

from conftest import eventually
from slipstream import localkube
from slipstream.localkube import podrunner

RELEASE, RELEASE_NS = "sec", "sec-system"
FULLNAME = "sec-slipstream"  # the chart's full name for release "sec": SA, roles, peering
SEED = f"{FULLNAME}-admin-seed"  # the Secret generated admin keys are derived from
GRANTED_NS = "sec-app"  # in rbac.secretNamespaces: specs here may name their own Secret
LEAK_NS = "sec-leak"  # in rbac.secretNamespaces too
UNGRANTED_NS = "sec-ungranted"  # not listed: the operator reads no Secret there


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster) -> Iterator[Operator]:
    """Release `sec` with rbac.secretNamespaces=[sec-app, sec-leak]; its operator as its ServiceAccount."""
    for ns in (GRANTED_NS, LEAK_NS, UNGRANTED_NS):
        cluster.kubectl("create", "namespace", ns)
    cluster.helm(
        "install", RELEASE, str(CHART), f"--namespace={RELEASE_NS}", "--create-namespace",
        f"--set=rbac.secretNamespaces={{{GRANTED_NS},{LEAK_NS}}}",
    )  # fmt: skip
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/servingdeployments.serving.slipstream.dev", "crd/clusterkopfpeerings.kopf.dev",
    )  # fmt: skip
    op = Operator(cluster, cluster.token_kubeconfig(RELEASE_NS, FULLNAME), "security", f"--peering={FULLNAME}", env={
        "SLIPSTREAM_TUNING_TIME_SCALE": "0.1", "SLIPSTREAM_ROLLOUT_POLL_SECONDS": "0.5",
        "SLIPSTREAM_ADMIN_TIMEOUT_SECONDS": "2", "SLIPSTREAM_ADMIN_SEED_SECRET": f"{RELEASE_NS}/{SEED}"})  # fmt: skip
    op.start()
    try:
        yield op
    finally:
        op.stop()
        cluster.helm("uninstall", RELEASE, f"--namespace={RELEASE_NS}", check=False)


def can_i(cluster: localkube.Cluster, token: Path, verb: str, resource: str, ns: str | None) -> bool:
    """A SelfSubjectAccessReview as the token's user. `resource` is `plural[.group][/subresource][:name]`."""
    resource, _, name = resource.partition(":")
    resource, _, subresource = resource.partition("/")
    plural, _, group = resource.partition(".")
    attributes = {"verb": verb, "group": group, "resource": plural, "subresource": subresource, "name": name}
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {**attributes, **({"namespace": ns} if ns else {})}}}  # fmt: skip
    result = cluster.kubectl("create", "-f", "-", "-o", "json", kubeconfig=token, input=json.dumps(review))
    return bool(json.loads(result.stdout)["status"].get("allowed"))


# Every call the operator makes (controller/clients/kube.py, handlers.py, loop.py) and kopf's own
# (watching, peering, Events, CRD discovery): (verb, resource, namespace or None).
NEEDED = [
    *[(v, "servingdeployments.serving.slipstream.dev", GRANTED_NS) for v in ("get", "list", "watch", "patch")],
    ("patch", "servingdeployments.serving.slipstream.dev/status", GRANTED_NS),
    ("update", "servingdeployments.serving.slipstream.dev/finalizers", GRANTED_NS),
    *[(v, "deployments.apps", GRANTED_NS) for v in ("get", "list", "watch", "create", "patch")],
    *[(v, "services", GRANTED_NS) for v in ("get", "list", "watch", "create", "patch")],
    *[(v, "configmaps", GRANTED_NS) for v in ("get", "create", "patch")],
    *[(v, "podmonitors.monitoring.coreos.com", GRANTED_NS) for v in ("get", "create", "patch")],
    ("list", "pods", GRANTED_NS),
    ("list", "horizontalpodautoscalers.autoscaling", GRANTED_NS),  # an HPA on an engine Deployment
    ("create", "events", GRANTED_NS),
    ("get", "secrets", GRANTED_NS),  # a Secret a spec names (rbac.secretNamespaces)
    ("create", "secrets", GRANTED_NS),  # the generated <name>-admin-key
    ("create", "secrets", UNGRANTED_NS),  # create reads nothing
    ("get", f"secrets:{SEED}", RELEASE_NS),  # the seed, by name only
    ("list", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("list", "clusterkopfpeerings.kopf.dev", None),
    ("watch", "clusterkopfpeerings.kopf.dev", None),
    ("patch", f"clusterkopfpeerings.kopf.dev:{FULLNAME}", None),
]

# What it has no business with: Secrets outside the granted namespaces (the Helm release
# Secret of its own release included), listing Secrets anywhere, deleting or replacing
# anything, objects it does not own, RBAC, another release's peering object.
DENIED = [
    ("get", "secrets", RELEASE_NS),
    ("get", f"secrets:sh.helm.release.v1.{RELEASE}.v1", RELEASE_NS),
    ("update", f"secrets:{SEED}", RELEASE_NS),
    ("delete", f"secrets:{SEED}", RELEASE_NS),
    ("get", "secrets", UNGRANTED_NS),
    ("get", "secrets", "kube-system"),
    ("list", "secrets", GRANTED_NS),
    ("watch", "secrets", GRANTED_NS),
    ("update", "secrets", GRANTED_NS),
    ("patch", "secrets", GRANTED_NS),
    ("delete", "secrets", GRANTED_NS),
    ("create", "servingdeployments.serving.slipstream.dev", GRANTED_NS),
    ("delete", "servingdeployments.serving.slipstream.dev", GRANTED_NS),
    ("update", "servingdeployments.serving.slipstream.dev/status", GRANTED_NS),
    ("delete", "deployments.apps", GRANTED_NS),
    ("update", "deployments.apps", GRANTED_NS),
    ("delete", "services", GRANTED_NS),
    ("delete", "configmaps", GRANTED_NS),
    ("list", "configmaps", GRANTED_NS),
    ("get", "pods", GRANTED_NS),
    ("create", "pods", GRANTED_NS),
    ("patch", "horizontalpodautoscalers.autoscaling", GRANTED_NS),  # read, never written
    ("delete", "pods", GRANTED_NS),
    ("create", "pods/exec", GRANTED_NS),
    ("get", "pods/log", GRANTED_NS),
    ("patch", "events", GRANTED_NS),
    ("patch", "nodes", None),
    ("list", "namespaces", None),
    ("patch", "namespaces", None),
    ("create", "rolebindings.rbac.authorization.k8s.io", GRANTED_NS),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
    ("bind", f"clusterroles.rbac.authorization.k8s.io:{FULLNAME}-secret-reader", None),
    ("patch", "clusterkopfpeerings.kopf.dev:slipstream", None),
    ("create", "clusterkopfpeerings.kopf.dev", None),
    ("patch", "kopfpeerings.kopf.dev", GRANTED_NS),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("create", "serviceaccounts/token", RELEASE_NS),
]


def test_service_account_may_do_what_the_operator_needs_and_nothing_else(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    token = operator.kubeconfig

    def bound() -> None:  # the RBAC authorizer's informer catches up with the new bindings
        assert can_i(cluster, token, "get", "secrets", GRANTED_NS)

    eventually(bound, deadline_s=30, what="the chart's RoleBinding in effect")
    missing = [need for need in NEEDED if not can_i(cluster, token, *need)]
    assert not missing, f"the chart's ServiceAccount may not: {missing}"
    allowed = [deny for deny in DENIED if can_i(cluster, token, *deny)]
    assert not allowed, f"the chart's ServiceAccount may: {allowed}"

    # Not only `can-i`: the real reads are refused. The Helm release Secret in the
    # release's namespace, and a Secret beside a ServingDeployment nobody granted.
    release_secret = f"sh.helm.release.v1.{RELEASE}.v1"
    assert get(cluster, "secret", release_secret, RELEASE_NS) is not None  # the admin sees it
    cluster.kubectl("create", "secret", "generic", "bystander", "--from-literal=k=v", f"--namespace={UNGRANTED_NS}")
    for name, ns in ((release_secret, RELEASE_NS), ("bystander", UNGRANTED_NS)):
        result = cluster.kubectl("get", "secret", name, f"--namespace={ns}", kubeconfig=token, check=False)
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), result
    listing = cluster.kubectl("get", "secrets", f"--namespace={GRANTED_NS}", kubeconfig=token, check=False)
    assert listing.returncode != 0 and "forbidden" in listing.stderr.lower(), listing


def test_operator_reconciles_with_only_the_charts_rights(cluster: localkube.Cluster, operator: Operator) -> None:
    """A real reconcile as the chart's ServiceAccount: a generated key (Secret created by
    the operator), a given key (Secret read), owned objects applied, Events posted, status
    written, the tuning loop's pod list; nothing in the log says Forbidden."""
    cluster.kubectl("create", "secret", "generic", "given-key", "--from-literal=api-key=given-s3cret",
                    f"--namespace={GRANTED_NS}")  # fmt: skip
    apply(cluster, GRANTED_NS, fixed_sd("generated"), fixed_sd("given", adminApiKeySecretRef={"name": "given-key"}))
    for name in ("generated", "given"):
        eventually(lambda name=name: reconciled(cluster, GRANTED_NS, name), deadline_s=DEADLINE_S, what=f"{name} reconciled")
        assert condition(must_get(cluster, "sd", name, GRANTED_NS), "Reconciled")["status"] == "True", operator.log_tail()
        dep = must_get(cluster, "deployment", name, GRANTED_NS)
        assert any(e["reason"] == "Created" for e in events(cluster, GRANTED_NS, name))
        env = {e["name"]: e for e in container(dep)["env"]}
        want = "generated-admin-key" if name == "generated" else "given-key"
        assert env["SLIPSTREAM_ADMIN_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == want
    assert must_get(cluster, "secret", "generated-admin-key", GRANTED_NS)["metadata"]["ownerReferences"]

    def tuning_step_ran() -> None:
        log = operator.log()
        assert "tuning step failed" not in log, operator.log_tail()
        sd = must_get(cluster, "sd", "generated", GRANTED_NS)
        types = {c["type"] for c in sd.get("status", {}).get("conditions", [])}
        assert "EnginesInSync" in types, sd.get("status")

    eventually(tuning_step_ran, deadline_s=DEADLINE_S, what="a tuning step as the chart's ServiceAccount")
    for word in ("Forbidden", "forbidden"):
        assert word not in operator.log(), operator.log_tail()


def test_a_named_secret_outside_the_granted_namespaces_gets_a_condition_and_the_fix_works(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    """A generated key needs no grant anywhere; a spec naming its own Secret where the
    operator may not read Secrets is refused with a condition naming the fix, and the fix
    (`helm upgrade --set rbac.secretNamespaces=...`) serves it without an operator restart."""
    ns = "sec-late"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "secret", "generic", "late-key", "--from-literal=api-key=late-s3cret", f"--namespace={ns}")
    apply(cluster, ns, fixed_sd("generated"), fixed_sd("named", adminApiKeySecretRef={"name": "late-key"}))
    eventually(lambda: must_get(cluster, "deployment", "generated", ns), deadline_s=DEADLINE_S, what="generated served")

    def refused() -> dict[str, Any]:
        c = condition(must_get(cluster, "sd", "named", ns), "Reconciled")
        assert c["status"] == "False" and c["reason"] == "AdminKeySecretForbidden", c
        return c

    c = eventually(refused, deadline_s=DEADLINE_S, what="named refused with a condition")
    assert "rbac.secretNamespaces" in c["message"] and "late-key" in c["message"], c["message"]
    warnings = [e for e in events(cluster, ns, "named") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["AdminKeySecretForbidden"], warnings
    assert get(cluster, "deployment", "named", ns) is None  # no engines without their key

    cluster.helm("upgrade", RELEASE, str(CHART), f"--namespace={RELEASE_NS}", "--reuse-values",
                 f"--set=rbac.secretNamespaces={{{GRANTED_NS},{LEAK_NS},{ns}}}")  # fmt: skip

    def served() -> None:
        assert condition(reconciled(cluster, ns, "named"), "Reconciled")["status"] == "True"
        must_get(cluster, "deployment", "named", ns)

    eventually(served, deadline_s=DEADLINE_S + 30, what="named served once its namespace is granted")


def test_a_second_release_installs_beside_the_first_and_uninstall_leaves_only_the_crds(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    second, second_ns = "sec2", "sec2-system"
    cluster.helm("install", second, str(CHART), f"--namespace={second_ns}", "--create-namespace")
    peerings = json.loads(cluster.kubectl("get", "clusterkopfpeerings", "-o", "json").stdout)["items"]
    names = {p["metadata"]["name"] for p in peerings}
    assert {FULLNAME, "sec2-slipstream"} <= names, names
    deployment = must_get(cluster, "deployment", "sec2-slipstream", second_ns)
    assert "--peering=sec2-slipstream" in container(deployment)["args"]

    cluster.helm("uninstall", second, f"--namespace={second_ns}", "--wait")
    cluster_scoped = "clusterroles,clusterrolebindings,clusterkopfpeerings"
    left = cluster.kubectl("get", cluster_scoped, "-l", f"app.kubernetes.io/instance={second}", "-o", "name").stdout
    assert left.strip() == "", f"left behind by uninstall: {left}"
    namespaced = cluster.kubectl("get", "all,roles,rolebindings,serviceaccounts,configmaps,secrets", f"--namespace={second_ns}",
                                 "-l", f"app.kubernetes.io/instance={second}", "-o", "name").stdout  # fmt: skip
    # Only the admin-key seed stays (helm.sh/resource-policy: keep): engines started with a
    # generated key stay reachable after a reinstall.
    assert namespaced.split() == ["secret/sec2-slipstream-admin-seed"], f"left behind by uninstall: {namespaced}"
    # The documented choice: CRDs stay (Helm never deletes crds/; kopf's may serve other
    # operators, and deleting the ServingDeployment CRD would delete every engine), and the
    # first release is untouched.
    for crd in ("servingdeployments.serving.slipstream.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        cluster.kubectl("get", "crd", crd)
    cluster.kubectl("get", "clusterkopfpeering", FULLNAME)
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "kubectl delete crd clusterkopfpeerings.kopf.dev kopfpeerings.kopf.dev" in notes
    assert "kubectl delete secret" in notes


# -- the admin key never leaks -------------------------------------------------------------


def http(method: str, url: str, body: dict[str, Any] | None = None, key: str | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_admin_key_is_absent_from_logs_events_status_metrics_and_pod_spec(
    cluster: localkube.Cluster, operator: Operator, tmp_path: Path
) -> None:
    """Two ServingDeployments, one with a key from the spec's Secret and one with the
    generated key; engine simulators run from their pods' specs (the pod runner resolves
    the secretKeyRef as the kubelet would); a Fixed edit makes the operator call every
    engine's /set_internal_state with the key. Then the key is looked for everywhere a
    user or a scraper can read: it must be only in its Secret and the engines' env."""
    ns = LEAK_NS
    known = "known-" + secrets.token_hex(20)
    cluster.kubectl("create", "secret", "generic", "known-admin", f"--from-literal=api-key={known}", f"--namespace={ns}")
    docs = [fixed_sd("known", adminApiKeySecretRef={"name": "known-admin"}), fixed_sd("gen")]
    for doc in docs:
        doc["spec"]["replicas"] = 1
        doc["spec"]["tuning"]["intervalSeconds"] = 10
    apply(cluster, ns, *docs)
    runner = podrunner.PodRunner(cluster.get_json, tmp_path / "engines", namespace=ns, time_scale=1.0).start()
    try:
        for name in ("known", "gen"):
            eventually(lambda name=name: reconciled(cluster, ns, name), deadline_s=DEADLINE_S, what=f"{name} reconciled")
        generated = base64.b64decode(must_get(cluster, "secret", "gen-admin-key", ns)["data"]["api-key"]).decode()
        keys = {"known": known, "gen": generated}
        seed = base64.b64decode(must_get(cluster, "secret", SEED, RELEASE_NS)["data"]["seed"]).decode()
        cluster.kubectl("patch", "sd", "known", "gen", f"--namespace={ns}", "--type=merge", "-p",
                        '{"spec":{"tuning":{"threshold":2048}}}')  # fmt: skip

        def engines_took_it() -> dict[str, str]:
            urls = {}
            for name in keys:
                sd = must_get(cluster, "sd", name, ns)
                assert sd["status"].get("threshold") == 2048, sd["status"]
                assert condition(sd, "EnginesInSync")["status"] == "True", sd["status"]
                pod = next(iter(engine_pods(cluster, ns, name).values()))
                urls[name] = f"http://{pod['status']['podIP']}:30000"
            return urls

        urls = eventually(engines_took_it, deadline_s=DEADLINE_S * 2, what="2048 set on the engines with the key")

        # Every place a user, a log collector or a scraper reads.
        with urllib.request.urlopen(operator.metrics_url, timeout=10) as response:
            metrics_text = response.read().decode()
        places = {
            "operator log": operator.log(),
            "Events": cluster.kubectl("get", "events", f"--namespace={ns}", "-o", "json").stdout,
            "ServingDeployments (status)": cluster.kubectl("get", "sd", f"--namespace={ns}", "-o", "json").stdout,
            "operator /metrics": metrics_text,
            "Deployments, ReplicaSets, pods (args, command, env)": cluster.kubectl(
                "get", "deployments,replicasets,pods", f"--namespace={ns}", "-o", "json").stdout,
            "ConfigMaps, Services": cluster.kubectl("get", "configmaps,services", f"--namespace={ns}", "-o", "json").stdout,
            "engine logs": "\n".join(p.read_text(errors="replace") for p in (tmp_path / "engines").glob("*.log")),
        }  # fmt: skip
        assert places["engine logs"], "no engine log to search"
        for name, key in keys.items():
            encoded = base64.b64encode(key.encode()).decode()
            for place, text in places.items():
                assert key not in text and encoded not in text, f"{name}'s admin key is in the {place}"
                assert seed not in text, f"the admin-key seed is in the {place}"
            dep = must_get(cluster, "deployment", name, ns)
            c = container(dep)
            env = {e["name"]: e for e in c["env"]}
            assert "value" not in env["SLIPSTREAM_ADMIN_API_KEY"], "the key must come by secretKeyRef only"
            assert not [a for a in c.get("command", []) + c["args"] if "admin-api-key" in a], c

            # The engine simulator started with the key: its info endpoints (open to any
            # client of the Service port, as SGLang's are) redact it; a setting change
            # without the key is refused.
            for path in ("/get_server_info", "/server_info"):
                for caller_key in (None, key):
                    code, body = http("GET", urls[name] + path, key=caller_key)
                    assert code == 200 and key not in body and encoded not in body, (code, body)
                    info = json.loads(body)
                    assert info["long_prefill_token_threshold"] == 2048, info
                    assert info.get("admin_api_key") in (None, "<redacted>"), info.get("admin_api_key")
            code, body = http("POST", urls[name] + "/set_internal_state",
                              {"server_args": {"long_prefill_token_threshold": 1024}})  # fmt: skip
            assert code in (401, 403), (code, body)
    finally:
        runner.stop()


# -- Pod Security Standards --------------------------------------------------------------------


def labelled_namespace(cluster: localkube.Cluster, name: str, level: str) -> str:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}",
                    "pod-security.kubernetes.io/enforce-version=latest")  # fmt: skip
    return name


def pods_admitted(cluster: localkube.Cluster, ns: str, selector: str, want: int) -> list[dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "pods", f"--namespace={ns}", f"--selector={selector}", "-o", "json").stdout)["items"]
    refusals = [e["message"] for e in json.loads(cluster.kubectl("get", "events", f"--namespace={ns}", "-o", "json").stdout)["items"]
                if e["reason"] == "FailedCreate"]  # fmt: skip
    assert len(items) == want, f"{len(items)} of {want} pods admitted; refusals: {refusals}"
    return items


def pods_refused(cluster: localkube.Cluster, ns: str, owner: str) -> str:
    events_ = json.loads(cluster.kubectl("get", "events", f"--namespace={ns}", "-o", "json").stdout)["items"]
    found = [e["message"] for e in events_ if e["reason"] == "FailedCreate" and e["involvedObject"]["name"].startswith(owner)]
    assert found, f"no FailedCreate for {owner}"
    return found[0]


def test_the_operator_deployment_is_admitted_under_the_restricted_pod_security_standard(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = labelled_namespace(cluster, "sec-restricted", "restricted")
    # The apiserver's PodSecurity admission is on (a default of v1.36): a plain pod is refused.
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": ns},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(plain), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused
    cluster.helm("install", "psa", str(CHART), f"--namespace={ns}", "--set=watchNamespace=sec-restricted")
    try:
        pods = eventually(lambda: pods_admitted(cluster, ns, "app.kubernetes.io/instance=psa", 2),
                          deadline_s=DEADLINE_S, what="both operator pods admitted")  # fmt: skip
        spec = pods[0]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    finally:
        cluster.helm("uninstall", "psa", f"--namespace={ns}", "--wait", check=False)


def test_engine_pods_meet_baseline_by_default_and_restricted_with_a_pod_security_context(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    """The default engine securityContext (no privilege escalation, RuntimeDefault seccomp)
    passes `baseline`; `restricted` also needs a non-root user and every capability dropped,
    which spec.engine.podSecurityContext and securityContext give where the image allows."""
    for level in ("baseline", "restricted"):
        labelled_namespace(cluster, f"sec-engines-{level}", level)
    apply(cluster, "sec-engines-baseline", fixed_sd("plain"))
    eventually(lambda: pods_admitted(cluster, "sec-engines-baseline", "serving.slipstream.dev/name=plain", 1),
               deadline_s=DEADLINE_S, what="engine pod admitted under baseline")  # fmt: skip

    strict = "sec-engines-restricted"
    non_root = {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "securityContext": {"capabilities": {"drop": ["ALL"]}}}  # fmt: skip
    apply(cluster, strict, fixed_sd("root"), fixed_sd("nonroot", **non_root))
    eventually(lambda: pods_admitted(cluster, strict, "serving.slipstream.dev/name=nonroot", 1),
               deadline_s=DEADLINE_S, what="non-root engine pod admitted under restricted")  # fmt: skip
    message = eventually(lambda: pods_refused(cluster, strict, "root-"), deadline_s=DEADLINE_S,
                         what="the root engine pod refused under restricted")  # fmt: skip
    assert "runAsNonRoot" in message, message


def test_the_network_policy_is_accepted_by_the_apiserver(cluster: localkube.Cluster, operator: Operator) -> None:
    """The local control plane enforces no NetworkPolicy (no CNI): the rendered-template
    tests check its rules; here the apiserver validates it as an object. The default
    install made the ingress-only one; the one with egress rules is applied over it."""
    installed = must_get(cluster, "networkpolicy", FULLNAME, RELEASE_NS)
    assert installed["spec"]["policyTypes"] == ["Ingress"], installed["spec"]
    rendered = cluster.helm(
        "template", RELEASE, str(CHART), f"--namespace={RELEASE_NS}", "--show-only=templates/networkpolicy.yaml",
        "--set=networkPolicy.egress.enabled=true", "--set=networkPolicy.apiServer.cidrs={127.0.0.1/32}",
    ).stdout  # fmt: skip
    result = cluster.kubectl("apply", "--dry-run=server", f"--namespace={RELEASE_NS}", "-f", "-", input=rendered)
    assert "networkpolicy.networking.k8s.io/sec-slipstream configured (server dry run)" in result.stdout, result.stdout
    assert result.returncode == 0 and "error" not in result.stderr.lower(), result.stderr
