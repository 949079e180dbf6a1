"""HorizontalPodAutoscalers (and KEDA ScaledObjects, which make one) on an engine Deployment.

An HPA is the by-the-book way to size a fleet of engines, so the operator neither fights
it nor waits to be fought: when one targets the engine Deployment, spec.replicas of the
Deployment is left to it from the first write the operator sees (never reverted, unlike
another writer, `replicas`), the `ReplicasManagedElsewhere` condition names it (reason
`Autoscaler`) and one `AutoscalerFound` Event says so. While it targets the Deployment a
change of the ServingDeployment's spec.replicas is not applied (an Event says why); when
it is deleted the operator applies spec.replicas again (`ReplicasTakenBack`). The chart's
admission policy lets exactly the HPA controller's identity write the scale subresource
(docs/operator.md, "Autoscalers"). Pure: the handlers list the HPAs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

HPA_API_VERSION = "autoscaling/v2"
HPA_KIND = "HorizontalPodAutoscaler"
REASON = "Autoscaler"
"""The `ReplicasManagedElsewhere` condition's reason when an HPA holds the replicas."""


def targeting(hpas: Iterable[dict[str, Any]], deployment: str) -> list[str]:
    """Names of the HPAs (not being deleted) whose scaleTargetRef is the apps Deployment
    `deployment` in their own namespace, sorted."""
    out = []
    for hpa in hpas:
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        meta = hpa.get("metadata") or {}
        group = str(ref.get("apiVersion") or "").partition("/")[0]
        if meta.get("deletionTimestamp") or ref.get("kind") != "Deployment" or group != "apps":
            continue
        if ref.get("name") == deployment:
            out.append(str(meta.get("name")))
    return sorted(out)


def named(names: Iterable[str]) -> str:
    return ", ".join(f"{HPA_KIND} {n}" for n in names)


def message(names: list[str], replicas: int | None, spec_replicas: int) -> str:
    return (
        f"spec.replicas of the engine Deployment is set by {named(names)} (now {replicas}; the spec says "
        f"{spec_replicas}): the operator leaves it to the autoscaler. Delete the autoscaler to have the "
        "operator apply spec.replicas again"
    )


def held_message(names: list[str], spec_replicas: int) -> str:
    return (
        f"spec.replicas ({spec_replicas}) is not applied while {named(names)} scales the engine Deployment: "
        "set the autoscaler's minReplicas/maxReplicas instead, or delete it to hand the replicas back"
    )


def held_by(conditions: Iterable[Any], condition: str) -> bool:
    """Whether `condition` (ReplicasManagedElsewhere) is True because of an autoscaler."""
    return any(c.type == condition and c.status == "True" and c.reason == REASON for c in conditions)
