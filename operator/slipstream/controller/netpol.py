"""The engines' NetworkPolicy: one per ServingDeployment, owned by it, beside its Service.

Who may reach an engine pod's port (spec.engine.port: the OpenAI API, /metrics and the
admin API /set_internal_state all listen there):

- the operator's pods (the admin API, /get_server_info);
- Prometheus' pods (the engines' /metrics), where the chart's values say it runs;
- pods of the ServingDeployment's own namespace (a router or gateway beside the engines)
  and of the namespaces the chart's values name (`networkPolicy.engines.clientNamespaces`).

A NetworkPolicy selects by address and port, never by HTTP path: whoever may reach the
serving port reaches the admin path too, and the admin key (spec.engine.adminApiKeySecretRef
or the generated one) is what keeps /set_internal_state to the operator. Egress is left
open: engines fetch weights from wherever their image says.

Why the operator makes them and the chart does not: the policy lives in each served
namespace and selects one ServingDeployment's pods on its port, so it has the lifetime,
namespace and port of a ServingDeployment, not of the release; owned, it goes with it. The
chart renders what only it knows (its own namespace and pod labels, the values) into
SLIPSTREAM_ENGINE_NETWORK_POLICY, parsed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slipstream.api import models
from slipstream.controller import objects

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the apiserver on every namespace: selects a namespace by its name."""


@dataclass(frozen=True)
class Peers:
    """Who besides the engine's own namespace may reach it (SLIPSTREAM_ENGINE_NETWORK_POLICY)."""

    operator_namespace: str
    operator_pods: dict[str, str]
    """The operator pods' labels (the chart's selector labels)."""
    prometheus: dict[str, Any]
    """A NetworkPolicy peer: namespaceSelector and podSelector of Prometheus' pods."""
    client_namespaces: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str) -> Peers | None:
        """The chart's JSON (`operatorNamespace`, `operatorPods`, `prometheus`,
        `clientNamespaces`); empty: no policy is made (the operator run by hand)."""
        if not raw.strip():
            return None
        data = json.loads(raw)
        prometheus = data["prometheus"]
        return cls(
            operator_namespace=str(data["operatorNamespace"]),
            operator_pods={str(k): str(v) for k, v in data["operatorPods"].items()},
            prometheus={key: prometheus[key] for key in ("namespaceSelector", "podSelector")},
            client_namespaces=tuple(str(n) for n in data.get("clientNamespaces") or ()),
        )


def network_policy(sd: models.ServingDeployment, peers: Peers) -> dict[str, Any]:
    """The NetworkPolicy on ``sd``'s engine pods: ingress to its port from ``peers`` only."""
    port = [{"port": sd.spec.engine.port, "protocol": "TCP"}]
    operator = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: peers.operator_namespace}},
        "podSelector": {"matchLabels": dict(peers.operator_pods)},
    }
    clients: list[dict[str, Any]] = [{"podSelector": {}}]  # every pod of this namespace
    if peers.client_namespaces:
        clients.append({"namespaceSelector": {"matchExpressions": [
            {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(peers.client_namespaces)}]}})  # fmt: skip
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": objects.metadata(sd, sd.metadata.name),
        "spec": {
            "podSelector": {"matchLabels": objects.label_selector(sd)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [operator], "ports": port},
                {"from": [dict(peers.prometheus)], "ports": port},
                {"from": clients, "ports": port},
            ],
        },
    }
