"""kopf handlers: a ServingDeployment in, its owned objects, status and Events out.

One reconcile function serves create, update and resume: it computes every owned object
from the spec (`objects`), applies them server-side in a worker thread (`kube`), records an
Event per object it created or changed, and writes status (`status`). A timer refreshes
readiness from the engine Deployment and keeps the ConfigMap at the current setting (in
Auto the tuner moves it in status, which fires no update handler). Deletion needs no
handler work: owner references let the garbage collector remove the owned objects.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
import prometheus_client

from slipstream.api import models
from slipstream.controller import kube as kube_
from slipstream.controller import objects, status
from slipstream.controller import settings as settings_

RECONCILES = prometheus_client.Counter(
    "slipstream_reconciles", "ServingDeployment reconciliations, by result.", ["result"]
)
OBJECT_CHANGES = prometheus_client.Counter(
    "slipstream_object_changes", "Owned objects created or updated, by kind.", ["kind", "change"]
)


@dataclass(frozen=True)
class Outcome:
    """What one pass of applying the owned objects did."""

    setting: models.EngineSetting
    changes: list[tuple[str, str, str]] = field(default_factory=list)
    """(kind, name, "created" | "updated") for every object that changed."""
    rolled: bool = False
    """The Deployment's pod template changed: its pods are being replaced."""
    deployment: dict[str, Any] | None = None
    problem: tuple[str, str] | None = None
    """(reason, message) when the spec cannot be served as it is."""


def secret_problem(kube: kube_.Kube, sd: models.ServingDeployment) -> tuple[str, str] | None:
    ref = sd.spec.engine.admin_api_key_secret_ref
    if ref is None:
        return None
    state = kube.secret_state(sd.metadata.namespace, ref.name, ref.key)
    if state == "missing-secret":
        return (
            "AdminKeySecretMissing",
            f"Secret {ref.name!r} (spec.engine.adminApiKeySecretRef) does not exist in namespace "
            f"{sd.metadata.namespace!r}: create it with `kubectl create secret generic {ref.name} "
            f"--from-literal={ref.key}=<key>`; the engines are not started until it exists",
        )
    if state == "missing-key":
        return (
            "AdminKeySecretMissing",
            f"Secret {ref.name!r} has no key {ref.key!r} (spec.engine.adminApiKeySecretRef.key): "
            "add the key or point adminApiKeySecretRef.key at the right one",
        )
    return None


def monitor(kube: kube_.Kube, sd: models.ServingDeployment) -> dict[str, Any] | None:
    if not sd.spec.prometheus.create_pod_monitor:
        return None
    for kind in objects.MONITOR_KINDS:
        if kube.serves("monitoring.coreos.com/v1", kind.lower() + "s"):
            return objects.monitor(sd, kind)
    return None


def apply_objects(kube: kube_.Kube, sd: models.ServingDeployment) -> Outcome:
    """Blocking: run it in a thread. Applies every owned object that should exist."""
    setting = objects.current_setting(sd)
    problem = secret_problem(kube, sd)
    desired = [objects.configmap(sd, setting), objects.service(sd), monitor(kube, sd)]
    if problem is None:
        desired.append(objects.deployment(sd))
    changes: list[tuple[str, str, str]] = []
    rolled, deployment = False, None
    for obj in filter(None, desired):
        after, before, change = kube.apply(obj)
        if obj["kind"] == "Deployment":
            deployment = after
            rolled = before is not None and before["spec"]["template"] != after["spec"]["template"]
        if change is not None:
            changes.append((obj["kind"], obj["metadata"]["name"], change))
    if problem is not None:
        deployment = kube.get("apps/v1", "Deployment", sd.metadata.namespace, sd.metadata.name)
    return Outcome(setting, changes, rolled, deployment, problem)


def sync_setting(kube: kube_.Kube, sd: models.ServingDeployment) -> Outcome:
    """Blocking. Brings the ConfigMap to the current setting (in Auto, the tuner moves it
    in status; no spec change, so no update handler, follows)."""
    setting = objects.current_setting(sd)
    desired = objects.configmap(sd, setting)
    current = kube.get("v1", "ConfigMap", sd.metadata.namespace, desired["metadata"]["name"])
    if current is not None and current.get("data") == desired["data"]:
        return Outcome(setting)
    _, _, change = kube.apply(desired)
    changes: list[tuple[str, str, str]] = [("ConfigMap", desired["metadata"]["name"], change)] if change else []
    return Outcome(setting, changes)


def change_message(kind: str, name: str, change: str, sd: models.ServingDeployment, outcome: Outcome) -> str:
    message = f"{change.capitalize()} {kind} {name}"
    if kind == "Deployment" and outcome.rolled:
        message += ": pod template changed, rolling the engine pods"
    if kind == "ConfigMap":
        new = outcome.setting
        message += (
            f": new pods start with threshold={new.threshold} mode={new.mode} "
            f"schedulePolicy={new.schedule_policy}"
        )
        if sd.status.threshold is not None and sd.status.threshold != new.threshold:
            message += f" (threshold was {sd.status.threshold}; the pod template is unchanged)"
    return message


def utcnow() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def register(
    registry: kopf.OperatorRegistry, config: settings_.ControllerSettings, kube: kube_.Kube
) -> None:
    """Attach the handlers to a registry (a fresh one per operator or per test)."""
    resource = (models.GROUP, models.VERSION, models.PLURAL)

    def record_changes(body: kopf.Body, sd: models.ServingDeployment, outcome: Outcome) -> None:
        for kind, name, change in outcome.changes:
            OBJECT_CHANGES.labels(kind, change).inc()
            kopf.event(body, type="Normal", reason=change.capitalize(),
                       message=change_message(kind, name, change, sd, outcome))  # fmt: skip

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same credentials as `kube`: in-cluster ServiceAccount, else $KUBECONFIG.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(id="configure", registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # The CRD's structural schema prunes unknown status fields: keep kopf's own state
        # in annotations, under our group.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=models.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=models.GROUP, key="last-handled-configuration"
        )
        settings.persistence.finalizer = f"{models.GROUP}/finalizer"
        # Events are for what the operator changes, not for every handler log line.
        settings.posting.level = logging.WARNING
        settings.posting.reporting_component = "slipstream"

    @kopf.on.resume(*resource, id="reconcile", registry=registry)
    @kopf.on.create(*resource, id="reconcile", registry=registry)
    @kopf.on.update(*resource, id="reconcile", registry=registry)
    async def reconcile(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
        sd = models.ServingDeployment.model_validate(dict(body))
        outcome = await asyncio.to_thread(apply_objects, kube, sd)
        record_changes(body, sd, outcome)
        conditions = status.after_reconcile(sd, outcome.problem, outcome.deployment, utcnow())
        patch.status.update(status.patch(sd, outcome.setting, conditions, outcome.deployment))
        if outcome.problem is not None:
            RECONCILES.labels("deferred").inc()
            if outcome.problem[0] not in {c.reason for c in sd.status.conditions if c.status == "False"}:
                kopf.event(body, type="Warning", reason=outcome.problem[0], message=outcome.problem[1])
            raise kopf.TemporaryError(outcome.problem[1], delay=config.retry_delay_seconds)
        RECONCILES.labels("ok").inc()
        logger.info(
            "%s/%s reconciled: %d object(s) changed", sd.metadata.namespace, sd.metadata.name,
            len(outcome.changes),
        )  # fmt: skip

    @kopf.timer(
        *resource, id="refresh", interval=config.status_interval_seconds,
        initial_delay=config.status_interval_seconds, registry=registry,
    )  # fmt: skip
    async def refresh(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        sd = models.ServingDeployment.model_validate(dict(body))
        if sd.status.observed_generation is None:
            return  # not reconciled yet: reconcile writes the first status
        outcome = await asyncio.to_thread(sync_setting, kube, sd)
        record_changes(body, sd, outcome)
        deployment = await asyncio.to_thread(
            kube.get, "apps/v1", "Deployment", sd.metadata.namespace, sd.metadata.name
        )
        conditions = status.with_readiness(sd, sd.status.conditions, deployment, utcnow())
        was = next((c.status for c in sd.status.conditions if c.type == status.READY), None)
        now = next(c for c in conditions if c.type == status.READY)
        if was != now.status:
            reason = "EnginesReady" if now.status == "True" else "EnginesNotReady"
            kopf.event(body, type="Normal", reason=reason, message=now.message)
        patch.status.update(
            status.changed(
                sd, {**status.setting_patch(sd, outcome.setting), **status.readiness_patch(conditions, deployment)}
            )
        )

    @kopf.on.delete(*resource, id="deleted", optional=True, registry=registry)
    async def deleted(name: str, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
        logger.info("%s/%s deleted: its owned objects go with it (owner references)", namespace, name)
