"""Status of a ServingDeployment as pure functions: conditions, phase, the status patch."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import pydantic

from slipstream.api import models

RECONCILED = "Reconciled"
READY = "Ready"


def set_condition(
    conditions: list[models.Condition],
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> list[models.Condition]:
    """Replace one condition (in its place, else appended); its lastTransitionTime moves only
    when its status does. ``status`` None is Unknown: there is nothing to judge it on."""
    value: Literal["True", "False", "Unknown"] = "Unknown" if status is None else "True" if status else "False"
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == value else now
    new = models.Condition(
        type=type_, status=value, reason=reason, message=message,
        last_transition_time=since, observed_generation=generation,
    )  # fmt: skip
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]  # in place: writers agree on order


def deployment_ready(replicas: int, deployment: dict[str, Any] | None) -> tuple[bool, str, str]:
    """(ready, reason, message) of the engine Deployment."""
    if deployment is None:
        return False, "NoDeployment", "the engine Deployment does not exist yet"
    status = deployment.get("status") or {}
    if status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0):
        return False, "Rolling", "the Deployment controller has not seen the latest spec yet"
    available = status.get("availableReplicas") or 0
    updated = status.get("updatedReplicas") or 0
    if available >= replicas and updated >= replicas:
        return True, "Available", f"{available}/{replicas} engine pods available"
    return False, "Rolling", f"{available}/{replicas} engine pods available, {updated} updated"


def ready_replicas(deployment: dict[str, Any] | None) -> int | None:
    value = ((deployment or {}).get("status") or {}).get("readyReplicas")
    return int(value) if value is not None else None


def with_readiness(
    sd: models.ServingDeployment, conditions: list[models.Condition], deployment: dict[str, Any] | None, now: str
) -> list[models.Condition]:
    """`conditions` with Ready set from the engine Deployment's status."""
    ready, reason, message = deployment_ready(sd.spec.replicas, deployment)
    return set_condition(conditions, READY, ready, reason, message, sd.metadata.generation, now)


def after_reconcile(
    sd: models.ServingDeployment, problem: tuple[str, str] | None, deployment: dict[str, Any] | None, now: str
) -> list[models.Condition]:
    """Reconciled (False with the problem's reason and fix, if any) and Ready."""
    reason, message = problem or ("Applied", "Deployment, Service and ConfigMap match the spec")
    conditions = set_condition(
        sd.status.conditions, RECONCILED, problem is None, reason, message, sd.metadata.generation, now
    )
    return with_readiness(sd, conditions, deployment, now)


def phase(conditions: list[models.Condition]) -> models.DeploymentPhase:
    by_type = {c.type: c for c in conditions}
    reconciled, ready = by_type.get(RECONCILED), by_type.get(READY)
    if reconciled is not None and reconciled.status == "False":
        return "Degraded"
    if ready is not None and ready.status == "True":
        return "Ready"
    if reconciled is None:
        return "Pending"
    return "Progressing"


def readiness_patch(conditions: list[models.Condition], deployment: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "phase": phase(conditions),
        "readyReplicas": ready_replicas(deployment),
        "conditions": [c.to_k8s() for c in conditions],
    }


def patch(
    sd: models.ServingDeployment,
    setting: models.EngineSetting | None,
    conditions: list[models.Condition],
    deployment: dict[str, Any] | None,
) -> dict[str, Any]:
    """The status fields reconcile owns. The setting (threshold, mode, order) only when
    given: the first time; afterwards the tuning loop writes what the engines report. None
    of them while the spec is refused and no engine Deployment exists (`runs_nothing`)."""
    if runs_nothing(conditions, deployment is not None):
        shown = no_setting()
    else:
        shown = setting_patch(sd, setting) if setting is not None else {}
    return {
        **shown,
        "observedGeneration": sd.metadata.generation,
        **readiness_patch(conditions, deployment),
    }


SETTING_FIELDS = ("threshold", "concurrency", "mode", "schedulePolicy")
"""The status fields of the fleet's setting (the THRESHOLD, CONCURRENCY and MODE columns)."""


def runs_nothing(conditions: Iterable[models.Condition], engines_exist: bool) -> bool:
    """A refused spec (Reconciled False) with no engines runs no setting at all: its status
    must not show the setting it asked for, as if it were applied (`kubectl get sd` showed
    THRESHOLD 4096 for a spec the operator had refused)."""
    refused = any(c.type == RECONCILED and c.status == "False" for c in conditions)
    return refused and not engines_exist


def no_setting() -> dict[str, Any]:
    """A merge patch that removes the setting fields (kubectl leaves their columns blank)."""
    return dict.fromkeys(SETTING_FIELDS)


def setting_patch(sd: models.ServingDeployment, setting: models.EngineSetting) -> dict[str, Any]:
    return {
        "threshold": setting.threshold,
        "concurrency": models.prefills_at_once(sd.spec.engine.chunked_prefill_size, setting.threshold),
        "mode": setting.mode,
        "schedulePolicy": setting.schedule_policy,
    }


def changed(sd: models.ServingDeployment, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields whose value differs from the status now (None: absent)."""
    current = sd.status.to_k8s()
    return {key: value for key, value in fields.items() if current.get(key) != value}


def merged_conditions(current: list[dict[str, Any]], patch: dict[str, Any], owned: Iterable[str]) -> dict[str, Any]:
    """`conditions` and `phase` of a status patch, re-based on the conditions now stored:
    the patch's conditions of the `owned` types replace those stored, the others stay."""
    types = set(owned)
    mine = {c["type"]: c for c in patch.get("conditions", []) if c["type"] in types}
    merged = [mine.pop(c["type"], c) for c in current] + list(mine.values())
    parsed = [models.Condition.model_validate(c) for c in merged]
    return {"conditions": merged, "phase": phase(parsed)}


def invalid_spec_message(error: pydantic.ValidationError) -> str:
    """One line naming each refused field (as the Kubernetes object spells it) and why."""
    parts = []
    for e in error.errors()[:5]:
        field = ""
        for x in e["loc"]:
            field += f"[{x}]" if isinstance(x, int) else (f".{x}" if field else str(x))
        parts.append(f"{field}: {e['msg']}")
    more = f" (and {error.error_count() - 5} more)" if error.error_count() > 5 else ""
    return "the spec cannot be served: " + "; ".join(parts) + more + ": fix these fields"


def invalid_spec_patch(before: list[dict[str, Any]], message: str, generation: int, now: str) -> dict[str, Any]:
    """Status for a spec the models refuse: Reconciled False (InvalidSpec), phase Degraded."""
    conditions = []
    for c in before:
        try:
            conditions.append(models.Condition.model_validate(c))
        except pydantic.ValidationError:
            continue  # a garbled condition is replaced, not kept
    conditions = set_condition(conditions, RECONCILED, False, "InvalidSpec", message, generation, now)
    return {"conditions": [c.to_k8s() for c in conditions], "phase": "Degraded"}
