"""The engines' NetworkPolicy as the operator renders it from the chart's JSON."""

from __future__ import annotations

import json

from test_render_engine import make

from slipstream.controller import netpol

CHART_JSON = json.dumps({
    "operatorNamespace": "ops",
    "operatorPods": {"app.kubernetes.io/name": "slipstream", "app.kubernetes.io/instance": "r"},
    "prometheus": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                   "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
    "clientNamespaces": ["gateway"],
})  # fmt: skip


def test_nothing_is_made_without_the_charts_peers() -> None:
    assert netpol.Peers.parse("") is None


def test_only_the_operator_prometheus_own_namespace_and_named_clients_reach_the_engine_port() -> None:
    peers = netpol.Peers.parse(CHART_JSON)
    assert peers is not None
    policy = netpol.network_policy(make({"engine": {"port": 31000}}), peers)
    assert (policy["kind"], policy["metadata"]["name"], policy["metadata"]["namespace"]) == ("NetworkPolicy", "kimi", "prod")
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("ServingDeployment", "u-1", True)
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"serving.slipstream.dev/name": "kimi"}}
    assert spec["policyTypes"] == ["Ingress"], "egress stays open: engines fetch weights"
    operator, prometheus, clients = spec["ingress"]
    for rule in spec["ingress"]:
        assert rule["ports"] == [{"port": 31000, "protocol": "TCP"}], "the engine's port and nothing else"
    assert operator["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "slipstream",
                                                                 "app.kubernetes.io/instance": "r"}}}]  # fmt: skip
    assert prometheus["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert clients["from"] == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gateway"]}]}},
    ]  # fmt: skip
    alone = netpol.Peers.parse(json.dumps({**json.loads(CHART_JSON), "clientNamespaces": []}))
    assert alone is not None
    assert netpol.network_policy(make(), alone)["spec"]["ingress"][2]["from"] == [{"podSelector": {}}]


def test_the_client_knows_where_network_policies_live() -> None:
    from slipstream.controller.clients import kube

    assert kube.path_of("networking.k8s.io/v1", "NetworkPolicy", "prod", "kimi") == (
        "/apis/networking.k8s.io/v1/namespaces/prod/networkpolicies/kimi"
    )
