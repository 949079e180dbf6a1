"""Another writer of the engine Deployment's replicas (an HPA, a second controller): seen,
reported, not fought over.

A person's `kubectl scale` is a hand edit: reverted once, with an Event (`drift`). A writer
that sets spec.replicas again after each revert is a controller: reverting it forever is a
fight that churns pods. The Deployment's managedFields name who owns spec.replicas (the
scale subresource included), so after `CONTESTED_AFTER` reverts of another manager's
replicas within `WINDOW_S`, the operator stops applying spec.replicas (it releases the
field to the other writer) and says so in the `ReplicasManagedElsewhere` condition and one
Warning. A change of the ServingDeployment's spec.replicas takes the field back. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slipstream.api import models
from slipstream.controller.watch import drift

CONDITION = "ReplicasManagedElsewhere"
CONTESTED_AFTER = 3
"""Reverts of another manager's spec.replicas that make a fight (one is a hand edit)."""
WINDOW_S = 600.0
"""Seconds over which those reverts count (an HPA re-syncs every 15 s by default)."""


def writers(live: dict[str, Any], ours: str) -> list[str]:
    """Field managers other than `ours` that own spec.replicas of `live` (with the
    subresource, e.g. `kubectl (scale)`)."""
    return drift.managers_of(live, ours, "f:spec", "f:replicas")


def contested(sd: models.ServingDeployment) -> bool:
    """Whether the operator has handed spec.replicas to another writer."""
    return any(c.type == CONDITION and c.status == "True" for c in sd.status.conditions)


def without_replicas(deployment: dict[str, Any]) -> dict[str, Any]:
    """The desired Deployment without spec.replicas (applying it releases the field)."""
    return {**deployment, "spec": {k: v for k, v in deployment["spec"].items() if k != "replicas"}}


@dataclass
class Reverts:
    """Recent reverts of another writer's replicas, per Deployment: (time, the Deployment's
    generation) pairs, so the several watch events of one write count once. In memory: a
    restarted operator counts afresh, which costs at most CONTESTED_AFTER reverts more."""

    seen: dict[str, dict[int, float]] = field(default_factory=dict)

    def note(self, key: str, generation: int, now: float) -> bool:
        """Record a revert of the write that made `generation`; True when the writer has now
        contested the field."""
        writes = {g: t for g, t in self.seen.get(key, {}).items() if now - t < WINDOW_S}
        writes.setdefault(generation, now)
        self.seen[key] = writes
        return len(writes) >= CONTESTED_AFTER

    def forget(self, key: str) -> None:
        self.seen.pop(key, None)


def message(who: Iterable[str], replicas: int | None, spec_replicas: int) -> str:
    names = ", ".join(who) or "another writer"
    return (
        f"spec.replicas of the engine Deployment is also written by {names} (now {replicas}; the spec says "
        f"{spec_replicas}): the operator no longer sets it, to avoid fighting. Remove the other writer and "
        "change spec.replicas of the ServingDeployment to take it back"
    )
