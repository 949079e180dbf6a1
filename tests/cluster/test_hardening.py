"""Hardened by default, on a real control plane (docs/reliability.md, "Hardening"): the
engines' owned NetworkPolicy, engine pods without capabilities or a ServiceAccount token,
the operator's own NetworkPolicy and readiness probe from a default `helm install`,
`/readyz` through a peering pause, the listeners on loopback, `EnginesInSync` on no pods,
and `kubectl explain` showing defaults and units.

The local control plane has no CNI: a NetworkPolicy is created and validated by the
apiserver here but enforced by nothing, so what is checked is that each exists, as
specified, owned and accepted.

One release (`hard`, cluster-wide, in `hard-system`) with default values serves the
module; its operator runs as a process with that release's ServiceAccount token and the
environment the installed chart Deployment gives its container.
"""

from __future__ import annotations

import datetime
import json
import signal
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
    engine_pods,
    fixed_sd,
    get,
    must_get,
    reconciled,
)  # fmt: skip

from conftest import eventually
from slipstream import localkube
from slipstream.localkube import ports, supervisor

RELEASE, RELEASE_NS = "hard", "hard-system"
FULLNAME = "hard-slipstream"
SEED = f"{FULLNAME}-admin-seed"
OPERATOR_LABELS = {"app.kubernetes.io/name": "slipstream", "app.kubernetes.io/instance": RELEASE}


def chart_env(cluster: localkube.Cluster) -> dict[str, str]:
    """The literal environment the installed chart Deployment gives the operator container."""
    dep = must_get(cluster, "deployment", FULLNAME, RELEASE_NS)
    return {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}


class ReadyOperator(Operator):
    """The test operator, with `/readyz` on a port of its own, on loopback."""

    def start(self) -> None:
        (ready,) = ports.free_ports(1)
        self.ready_url = f"http://127.0.0.1:{ready}/readyz"
        self.extra_env.update({"SLIPSTREAM_READY_PORT": str(ready), "SLIPSTREAM_LISTEN_ADDRESS": "127.0.0.1"})
        super().start()

    def readyz(self, query: str = "") -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.ready_url + query, timeout=3) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster) -> Iterator[ReadyOperator]:
    cluster.helm("install", RELEASE, str(CHART), f"--namespace={RELEASE_NS}", "--create-namespace")
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/servingdeployments.serving.slipstream.dev", "crd/clusterkopfpeerings.kopf.dev",
    )  # fmt: skip
    env = chart_env(cluster)
    peers = env["SLIPSTREAM_ENGINE_NETWORK_POLICY"]  # on by default
    op = ReadyOperator(cluster, cluster.token_kubeconfig(RELEASE_NS, FULLNAME), "hardening", f"--peering={FULLNAME}", env={
        "SLIPSTREAM_ENGINE_NETWORK_POLICY": peers, "SLIPSTREAM_ADMIN_SEED_SECRET": f"{RELEASE_NS}/{SEED}",
        "SLIPSTREAM_ADMIN_TIMEOUT_SECONDS": "1"})  # fmt: skip
    op.start()
    try:
        yield op
    finally:
        op.stop()
        cluster.helm("uninstall", RELEASE, f"--namespace={RELEASE_NS}", check=False)


def some_pods(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, dict[str, Any]]:
    pods = engine_pods(cluster, ns, name)
    assert pods, f"no engine pod of {ns}/{name} yet"
    return pods


def test_a_default_install_ships_the_operators_network_policy_and_readiness_probe(
    cluster: localkube.Cluster, operator: ReadyOperator
) -> None:
    """Created by `helm install` with no values: accepted by the apiserver, as specified."""
    policy = must_get(cluster, "networkpolicy", FULLNAME, RELEASE_NS)["spec"]
    assert policy["podSelector"] == {"matchLabels": OPERATOR_LABELS}
    assert policy["policyTypes"] == ["Ingress"], policy
    assert sorted(p["port"] for rule in policy["ingress"] for p in rule["ports"]) == [8080, 8081, 9090]
    container = must_get(cluster, "deployment", FULLNAME, RELEASE_NS)["spec"]["template"]["spec"]["containers"][0]
    probe = container["readinessProbe"]
    assert probe["httpGet"]["path"] == "/readyz?standby=ok" and probe["httpGet"]["port"] == "ready", probe
    assert {"name": "ready", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert chart_env(cluster)["SLIPSTREAM_READY_PORT"] == "8081"


def test_each_serving_deployment_gets_an_owned_network_policy_on_its_engines(
    cluster: localkube.Cluster, operator: ReadyOperator
) -> None:
    ns = "hard-netpol"
    cluster.kubectl("create", "namespace", ns)
    apply(cluster, ns, fixed_sd("guarded", port=31000))
    try:
        sd = eventually(lambda: reconciled(cluster, ns, "guarded"), deadline_s=DEADLINE_S, what="guarded reconciled")
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None
    assert condition(sd, "Reconciled")["status"] == "True", sd["status"]
    policy = must_get(cluster, "networkpolicy", "guarded", ns)
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("ServingDeployment", "guarded", sd["metadata"]["uid"])
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"serving.slipstream.dev/name": "guarded"}}
    assert spec["policyTypes"] == ["Ingress"]
    operator_rule, prometheus_rule, clients_rule = spec["ingress"]
    for rule in spec["ingress"]:
        assert rule["ports"] == [{"port": 31000, "protocol": "TCP"}], rule
    assert operator_rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": RELEASE_NS}},
                                      "podSelector": {"matchLabels": OPERATOR_LABELS}}]  # fmt: skip
    assert prometheus_rule["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert clients_rule["from"] == [{"podSelector": {}}], "only its own namespace: no clientNamespaces by default"
    # The engine pods it selects are the Deployment's.
    pods = eventually(lambda: some_pods(cluster, ns, "guarded"), deadline_s=DEADLINE_S, what="an engine pod")
    for pod in pods.values():
        assert pod["metadata"]["labels"]["serving.slipstream.dev/name"] == "guarded"
    # (Lines of this namespace only: a session's cluster may hold other modules' leftovers.)
    refused = [line for line in operator.log().splitlines() if "Forbidden" in line and ns in line]
    assert not refused, f"the chart's RBAC is short of something: {refused}"
    cluster.kubectl("delete", "sd", "guarded", f"--namespace={ns}")

    def collected() -> None:
        assert get(cluster, "networkpolicy", "guarded", ns) is None

    eventually(collected, deadline_s=DEADLINE_S, what="the NetworkPolicy garbage-collected with its owner")


def test_engine_pods_drop_every_capability_and_mount_no_service_account_token(
    cluster: localkube.Cluster, operator: ReadyOperator
) -> None:
    """As admitted by the real apiserver: its ServiceAccount admission adds a projected
    token volume to every pod that does not opt out."""
    ns = "hard-pods"
    cluster.kubectl("create", "namespace", ns)
    apply(cluster, ns, fixed_sd("bare"))
    pods = eventually(lambda: some_pods(cluster, ns, "bare"), deadline_s=DEADLINE_S, what="an engine pod")
    for pod in pods.values():
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        volumes = [v["name"] for v in spec.get("volumes", [])]
        assert not [v for v in volumes if v.startswith("kube-api-access")], volumes
        (engine,) = spec["containers"]
        assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"]}, engine["securityContext"]
        assert engine["securityContext"]["allowPrivilegeEscalation"] is False
        assert not [m for m in engine.get("volumeMounts", []) if "serviceaccount" in m["mountPath"]], engine


def test_engines_in_sync_is_unknown_while_no_engine_pod_runs(cluster: localkube.Cluster, operator: ReadyOperator) -> None:
    ns = "hard-nopods"
    cluster.kubectl("create", "namespace", ns)
    doc = fixed_sd("empty")
    doc["spec"]["replicas"] = 0
    doc["spec"]["tuning"]["intervalSeconds"] = 10
    apply(cluster, ns, doc)

    def unknown() -> dict[str, Any]:
        c = condition(must_get(cluster, "sd", "empty", ns), "EnginesInSync")
        assert (c["status"], c["reason"]) == ("Unknown", "NoEnginePods"), c
        return c

    c = eventually(unknown, deadline_s=DEADLINE_S, what="EnginesInSync Unknown on no pods")
    assert "no engine pod" in c["message"]
    # One pod (a kwok pod: no engine answers it) and the condition judges it instead.
    cluster.kubectl("patch", "sd", "empty", f"--namespace={ns}", "--type=merge", "-p", '{"spec":{"replicas":1}}')

    def judged() -> None:
        c = condition(must_get(cluster, "sd", "empty", ns), "EnginesInSync")
        assert c["status"] == "False" and c["reason"] == "PodsUnreachable", c

    eventually(judged, deadline_s=DEADLINE_S * 2, what="EnginesInSync judging the one pod")


def listening(port: int) -> set[str]:
    """The local addresses a TCP socket listens on ``port`` with (IPv4, /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_the_operators_listeners_bind_loopback_when_told(operator: ReadyOperator) -> None:
    """As `slipstream cluster up` runs it (SLIPSTREAM_LISTEN_ADDRESS=127.0.0.1): metrics and
    /readyz on loopback only (docs/localkube.md)."""
    for url in (operator.metrics_url, operator.ready_url):
        port = int(url.split(":")[2].split("/")[0])
        assert listening(port) == {"127.0.0.1"}, (url, listening(port))


def test_readyz_says_paused_while_a_dead_peers_entry_holds_the_operator(
    cluster: localkube.Cluster, operator: ReadyOperator
) -> None:
    """After a SIGKILL, the killed process's peering entry outlives it: a replica of lower
    priority stays paused until it expires. Such an entry is written here (a priority above
    any a replica draws, a 15 s lifetime), so the pause is certain, not a coin toss of the
    two priorities. kopf's health endpoint stays 200 throughout; /readyz does not, and
    `cluster status` says why."""
    def serving() -> None:
        code, report = operator.readyz()
        assert code == 200 and report["state"] == "serving", report

    eventually(serving, deadline_s=DEADLINE_S, what="the operator serving")
    lastseen = datetime.datetime.now(datetime.UTC).isoformat()
    dead = {"status": {"killed-predecessor@test": {"priority": 2**40, "lifetime": 15, "lastseen": lastseen}}}
    cluster.kubectl("patch", "clusterkopfpeering", FULLNAME, "--type=merge", "-p", json.dumps(dead))

    def paused() -> dict[str, Any]:
        code, report = operator.readyz()
        assert code == 503 and report["state"] == "paused", report
        return report

    report = eventually(paused, deadline_s=10, what="the operator paused by the entry")
    assert "killed-predecessor@test" in report["why"], report
    assert operator.readyz("?standby=ok")[0] == 200, "a standby is ready for the kubelet"
    with urllib.request.urlopen(operator.health_url, timeout=3) as response:
        assert response.status == 200, "kopf's liveness says nothing of the pause"
    said = supervisor.operator_serving({"operator_ready_url": operator.ready_url})
    assert said is not None and said.startswith("operator paused") and "killed-predecessor" in said, said

    eventually(serving, deadline_s=45, what="serving once the dead entry expired")
    assert supervisor.operator_serving({"operator_ready_url": operator.ready_url}) is None


def test_a_sigkilled_and_restarted_operator_is_not_serving_until_kopf_lets_it(
    cluster: localkube.Cluster, operator: ReadyOperator
) -> None:
    """The real sequence: SIGKILL, start again; liveness answers at once, /readyz serves only
    once kopf decided (at once when the new process draws the higher priority, after the
    old entry's lifetime otherwise): whichever, /readyz never says serving while paused."""
    assert operator.proc is not None
    operator.proc.send_signal(signal.SIGKILL)
    operator.proc.wait()
    operator.proc = None
    operator.start()  # returns once kopf's health endpoint answers
    code, report = operator.readyz()
    assert (code == 200) == (report["state"] == "serving"), report
    if report["state"] == "paused":
        assert "in favour of" in report["why"] or "first peering" in report["why"], report

    def serving() -> None:
        assert operator.readyz()[0] == 200, operator.readyz()

    eventually(serving, deadline_s=90, what="serving after the killed process's entry expired")


EXPLAINED = {
    # kubectl explain path: what its description must say
    "servingdeployments.spec.tuning.mode": "Default Fixed",
    "servingdeployments.spec.tuning.engineMode": "Default ceiling",
    "servingdeployments.spec.tuning.schedulePolicy": "Default fcfs",
    "servingdeployments.spec.tuning.minConcurrency": "Default 1",
    "servingdeployments.spec.tuning.maxConcurrency": "Default 8",
    "servingdeployments.spec.tuning.objective.ttftP99Seconds": "in seconds",
    "servingdeployments.spec.tuning.threshold": "in tokens",
    "servingdeployments.spec.engine.securityContext.capabilities.drop": "Default [ALL]",
}


@pytest.mark.parametrize("path", list(EXPLAINED))
def test_kubectl_explain_shows_the_default_or_unit(cluster: localkube.Cluster, operator: ReadyOperator, path: str) -> None:
    """What the apiserver publishes of the installed CRD, as `kubectl explain` prints it."""
    out = cluster.kubectl("explain", path).stdout
    assert EXPLAINED[path] in " ".join(out.split()), out
