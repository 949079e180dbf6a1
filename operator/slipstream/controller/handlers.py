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
import concurrent.futures
import contextlib
import datetime
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
import prometheus_client
import pydantic

from slipstream.api import models
from slipstream.controller import loop, netpol, objects, stages, status, tuning
from slipstream.controller import settings as settings_
from slipstream.controller.clients import adminkeys, apisession
from slipstream.controller.clients import kube as kube_
from slipstream.controller.watch import autoscalers, deployments, drift, replicas
from slipstream.controller.watch import judged as judged_
from slipstream.engine import support

log = logging.getLogger(__name__)

RECONCILES = prometheus_client.Counter(
    "slipstream_reconciles", "ServingDeployment reconciliations, by result.", ["result"]
)
OBJECT_CHANGES = prometheus_client.Counter(
    "slipstream_object_changes", "Owned objects created or updated, by kind.", ["kind", "change"]
)
DRIFT_EVENTS_SKIPPED = prometheus_client.Counter(
    "slipstream_drift_events_skipped",
    "Events of owned Deployments and Services the drift watch skipped without a read: none of "
    "the object's owned parts changed since its last good judgement (controller/watch/judged.py).",
    ["kind"],
)
DRIFT_EVENTS_JUDGED = prometheus_client.Counter(
    "slipstream_drift_events_judged",
    "Events of owned Deployments and Services the drift watch judged (up to two reads each: "
    "the ServingDeployment and the object).",
    ["kind"],
)
TUNING_STEPS = prometheus_client.Counter(
    "slipstream_tuning_steps", "Steps of the tuning loops, by result.", ["result"]
)
ROLLOUTS = prometheus_client.Counter(
    "slipstream_rollouts", "Rollouts that ended, by result (Promoted, RolledBack) and namespace: counted "
    "with the Event that says so (ThresholdChanged, RolledBack), which each rollout records once.",
    ["namespace", "result"],
)
ROLLOUT_ENDS = {"ThresholdChanged": "Promoted", "RolledBack": "RolledBack"}
"""The rollout's closing Events (rollout.machine) and the result each counts as."""
MIX_JUMPS = prometheus_client.Counter(
    "slipstream_mix_jump_steps", "Tuning steps taken before their timer because the queue mix jumped from the one "
    "the last step decided on (tune/mixjump.py).",
)
LAST_STEP = prometheus_client.Gauge(
    "slipstream_tuning_last_step_timestamp_seconds", "When the deployment's tuning loop last finished a step "
    "(failed steps included), Unix time: time() minus it past two intervals is a loop that has stalled.",
    ["namespace", "servingdeployment"],
)
TUNING_STEP_SECONDS = prometheus_client.Histogram(
    "slipstream_tuning_step_seconds", "Wall time of one tuning step (observe, tune, rollout).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


@dataclass(frozen=True)
class ApplyOutcome:
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
    try:
        state = kube.secret_state(sd.metadata.namespace, ref.name, ref.key)
    except kube_.ApiError as error:
        if error.status != 403:
            raise
        return "AdminKeySecretForbidden", adminkeys.forbidden(sd, ref)
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


def monitor(kube: kube_.Kube, sd: models.ServingDeployment, interval_s: float) -> dict[str, Any] | None:
    if not sd.spec.prometheus.create_pod_monitor:
        return None
    for kind in objects.MONITOR_KINDS:
        if kube.serves("monitoring.coreos.com/v1", kind.lower() + "s"):
            return objects.monitor(sd, kind, interval_s)
    return None


def apply_objects(
    kube: kube_.Kube, keys: adminkeys.AdminKeys, sd: models.ServingDeployment, keep_replicas: bool = True,
    scrape_interval_s: float = 5.0, peers: netpol.Peers | None = None,
) -> ApplyOutcome:
    """Blocking: run it in a thread. Applies every owned object that should exist;
    spec.replicas of the Deployment only with `keep_replicas` (not while another writer
    has it: `replicas`); the engines' NetworkPolicy when `peers` says who may reach them."""
    setting = objects.configmap_setting(sd)
    # A spec the patched engine would refuse at start-up gets no pods (engine.support).
    problem = support.refusal(sd.spec) or secret_problem(kube, sd)
    changes: list[tuple[str, str, str]] = []
    if sd.spec.engine.admin_api_key_secret_ref is None:
        # The engines always run with an admin key: the operator's own, derived, into an
        # owned Secret created once.
        try:
            generated = objects.admin_key_secret(sd, keys.generated(sd))
        except adminkeys.KeyUnavailable as error:
            problem = (error.reason, str(error))
        else:
            if kube.create_if_missing(generated) is not None:
                changes.append(("Secret", generated["metadata"]["name"], "created"))
    desired = [objects.configmap(sd, setting), objects.service(sd), monitor(kube, sd, scrape_interval_s)]
    if peers is not None:  # before the pods exist: no engine starts reachable by everyone
        desired.append(netpol.network_policy(sd, peers))
    if problem is None:
        dep = objects.deployment(sd)
        desired.append(dep if keep_replicas else replicas.without_replicas(dep))
    rolled, deployment = False, None
    for obj in filter(None, desired):
        try:
            after, before, change = kube.apply(obj)
        except kube_.ApiError as error:
            if error.status not in (400, 403, 422):
                raise  # the apiserver is unwell, not the spec: kopf retries
            problem = refused(obj, error)
            break
        if obj["kind"] == "Deployment":
            deployment = after
            rolled = before is not None and before["spec"]["template"] != after["spec"]["template"]
        if change is not None:
            changes.append((obj["kind"], obj["metadata"]["name"], change))
    if problem is not None and deployment is None:
        deployment = kube.get("apps/v1", "Deployment", sd.metadata.namespace, sd.metadata.name)
    return ApplyOutcome(setting, changes, rolled, deployment, problem)


@dataclass(frozen=True)
class Judgement:
    """What the drift watch found of one owned object, judged against its spec."""

    owner: dict[str, Any]
    """The ServingDeployment it was judged against."""
    settled: dict[str, Any]
    """The object as it now matches the spec: as read when nothing drifted, as the revert
    left it otherwise (`judged.Judged.record`)."""
    paths: list[str] = field(default_factory=list)
    """What was reverted (empty: nothing drifted)."""
    contest: Contest | None = None
    """Why spec.replicas is now left to another writer, or None."""


@dataclass(frozen=True)
class Contest:
    """spec.replicas handed to another writer: the condition's reason, the Event's, and the
    message of both."""

    reason: str
    event: str
    message: str

    @classmethod
    def fight(cls, message: str) -> Contest:
        """Another writer came back after each revert (`replicas`): a Warning."""
        return cls("OtherWriter", "ReplicasContested", message)

    @classmethod
    def autoscaler(cls, message: str) -> Contest:
        """An HPA targets the Deployment (`autoscalers`): left to it at once, no revert."""
        return cls(autoscalers.REASON, "AutoscalerFound", message)


def hpas_of(kube: kube_.Kube, namespace: str, name: str) -> list[str]:
    """Blocking. The HPAs that target the engine Deployment `name` (one LIST). Without the
    right to list them (a chart older than this operator) none are known: another writer
    is then told apart by its coming back (`replicas`), as before."""
    try:
        found = kube.items(autoscalers.HPA_API_VERSION, autoscalers.HPA_KIND, namespace)
    except kube_.ApiError as error:
        if error.status not in (403, 404):
            raise
        log.warning("%s/%s: cannot list HorizontalPodAutoscalers (HTTP %d)", namespace, name, error.status)
        return []
    return autoscalers.targeting(found, name)


def desired_of(
    kube: kube_.Kube, kind: str, meta: dict[str, Any], held: Callable[[str], bool] = lambda uid: False,
) -> tuple[dict[str, Any], models.ServingDeployment, dict[str, Any]] | None:
    """Blocking. The owner of an owned Deployment or Service (by the metadata `meta` an
    event carried) as read now, its model, and the object its spec renders; None when
    there is nothing to judge against (the owner gone, another one of that name, being
    deleted, its spec invalid or not reconciled yet, or the object not one the spec renders)."""
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == models.KIND), None)
    if owner is None:
        return None
    found = kube.get(models.API_VERSION, models.KIND, meta["namespace"], owner["name"])
    if found is None or found["metadata"].get("uid") != owner.get("uid") or found["metadata"].get("deletionTimestamp"):
        return None
    try:
        sd = models.ServingDeployment.model_validate(found)
    except pydantic.ValidationError:
        return None  # reconcile reports it (InvalidSpec); there is no desired object to revert to
    if sd.status.observed_generation is None:
        return None  # not reconciled yet: reconcile applies it
    desired = objects.deployment(sd) if kind == "Deployment" else objects.service(sd)
    if desired["metadata"]["name"] != meta["name"]:
        return None
    if kind == "Deployment" and (replicas.contested(sd) or held(sd.metadata.uid)):  # left to another writer
        desired = replicas.without_replicas(desired)
    return found, sd, desired


def recreate_deleted(kube: kube_.Kube, kind: str, live: dict[str, Any]) -> dict[str, Any] | None:
    """Blocking. An owned Deployment or Service was deleted (the admission policy off, or
    by a controller it lets through) while its ServingDeployment stands: create it again
    from the spec, now rather than at the next spec change. Returns the owner it was
    recreated for, or None (the owner gone or going: the garbage collector's deletes; a
    spec with no such object; already there again)."""
    meta = live.get("metadata") or {}
    judged = desired_of(kube, kind, meta)
    if judged is None:
        return None
    found, sd, desired = judged
    if kind == "Deployment" and support.refusal(sd.spec) is not None:
        return None  # reconcile keeps a refused spec's Deployment away
    if kube.get(desired["apiVersion"], kind, meta["namespace"], meta["name"]) is not None:
        return None
    kube.apply(desired)
    return found


def revert_drift(
    kube: kube_.Kube, kind: str, live: dict[str, Any], reverts: replicas.Reverts | None = None, now: float = 0.0,
    held: Callable[[str], bool] = lambda uid: False,
) -> Judgement | None:
    """Blocking. When a person or another controller changed fields the operator owns in
    `live` (a Deployment or Service), apply them back. Returns the judgement, or None when
    there was nothing to judge against (`desired_of`, or the object gone)."""
    meta = live.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    judged = desired_of(kube, kind, meta, held)
    if judged is None:
        return None
    found, sd, desired = judged
    # The event may be older than the object (several arrive for one edit): judge the object now.
    current = kube.get(desired["apiVersion"], kind, meta["namespace"], meta["name"])
    if current is None:
        return None
    contest = None
    if kind == "Deployment":
        have = (current.get("spec") or {}).get("replicas")
        who = replicas.writers(current, kube_.FIELD_MANAGER)
        # Contested: desired_of left spec.replicas out, and there is nothing to count.
        contested = replicas.contested(sd) or held(sd.metadata.uid)
        if not contested and reverts is not None and who and have != desired["spec"].get("replicas"):
            key = f"{meta['namespace']}/{meta['name']}"
            generation = int(current["metadata"].get("generation") or 0)
            if hpas := hpas_of(kube, meta["namespace"], meta["name"]):  # an autoscaler: never fought
                reverts.forget(key)
                desired = replicas.without_replicas(desired)
                contest = Contest.autoscaler(autoscalers.message(hpas, have, sd.spec.replicas))
            elif reverts.note(key, generation, now):  # a writer that comes back each time: stop fighting
                reverts.forget(key)
                desired = replicas.without_replicas(desired)
                contest = Contest.fight(replicas.message(who, have, sd.spec.replicas))
    paths = drift.of_object(desired, current)
    if not paths:
        return Judgement(found, current, [], contest)
    try:
        settled, _, _ = kube.apply(desired)
    except kube_.ApiError as error:
        if error.status != 422:
            raise
        # Apply never drops a list entry another manager owns: a Service port whose key
        # (port) was edited stays beside ours, two ports named alike (422). Replace the
        # spec's lists with a merge patch, then apply to own every field again.
        kube.merge_patch(desired, {"spec": desired["spec"]})
        settled, _, _ = kube.apply(desired)
    return Judgement(found, settled, paths, contest)


def write_status(
    kube: kube_.Kube, body: dict[str, Any], patch: dict[str, Any], tries: int = 3, owned: tuple[str, ...] = tuning.CONDITIONS
) -> None:
    """Blocking. The tuning loop's status patch, never from a stale read: conditions are one
    list shared with reconcile, so it is written at the version it was read at, and on a
    conflict merged into the fresh object's conditions (ours replace only our types)."""
    meta = body["metadata"]
    version = meta.get("resourceVersion")
    for attempt in range(tries):
        try:
            kube.patch_status(models.API_VERSION, models.PLURAL, meta["namespace"], meta["name"], patch, version)
            return
        except kube_.ApiError as error:
            if error.status != 409 or attempt == tries - 1:
                raise
            log.info("%s/%s: status changed since it was read (HTTP 409); merging into the fresh one",
                     meta["namespace"], meta["name"])  # fmt: skip
        fresh = kube.get(models.API_VERSION, models.KIND, meta["namespace"], meta["name"])
        if fresh is None:
            return  # deleted meanwhile
        version = fresh["metadata"]["resourceVersion"]
        patch = {**patch, **status.merged_conditions(
            (fresh.get("status") or {}).get("conditions") or [], patch, owned)}


def contest_replicas(kube: kube_.Kube, body: dict[str, Any], contest: Contest) -> None:
    """Blocking. Record in status that spec.replicas is left to another writer."""
    sd = models.ServingDeployment.model_validate(body)
    conds = status.set_condition(sd.status.conditions, replicas.CONDITION, True, contest.reason, contest.message,
                                 sd.metadata.generation, utcnow())  # fmt: skip
    write_status(kube, body, {"conditions": [c.to_k8s() for c in conds]}, owned=(replicas.CONDITION,))


def refused(obj: dict[str, Any], error: kube_.ApiError) -> tuple[str, str]:
    """The problem when the apiserver refuses an owned object built from the spec: its
    message names the offending field, which the spec's field maps to."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if error.status == 403:
        return ("Forbidden", f"the operator may not write {kind} {name!r}: {error.message}; "
                "check the chart's RBAC (watchNamespace, rbac values)")  # fmt: skip
    return (
        f"{kind}Refused",
        f"the apiserver refused {kind} {name!r} built from this ServingDeployment: {error.message}; "
        "fix the spec field it comes from (spec.engine.resources, spec.engine.env, spec.engine.extraArgs, "
        "metadata.name, ...)",
    )


def change_message(kind: str, name: str, change: str, sd: models.ServingDeployment, outcome: ApplyOutcome) -> str:
    message = f"{change.capitalize()} {kind} {name}"
    if kind == "Deployment" and outcome.rolled:
        message += ": pod template changed, rolling the engine pods"
    if kind == "Secret":
        message += ": the engines' admin key (spec.engine.adminApiKeySecretRef names none)"
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


@dataclass
class Context:
    """What the handlers of one operator (one registry) share: its settings and clients, the
    tuning loops' dependencies, and the state the watches keep between events."""

    config: settings_.ControllerSettings
    kube: kube_.Kube
    keys: adminkeys.AdminKeys
    deps: loop.Deps
    tuner: concurrent.futures.ThreadPoolExecutor
    views: deployments.Views
    """The engine Deployments as the drift watch last saw them (for the status refresh)."""
    wakes: dict[str, asyncio.Event] = field(default_factory=dict)
    """uid -> the event that wakes that deployment's tuning loop (set on every spec change)."""
    reverts: replicas.Reverts = field(default_factory=replicas.Reverts)
    judged: judged_.Judged = field(default_factory=judged_.Judged)
    """The drift watch's last good judgement of each owned object (`judged`)."""
    peers: netpol.Peers | None = None
    """Who may reach the engines (`netpol`), from the settings; None: no NetworkPolicy."""
    contested: dict[str, Contest] = field(default_factory=dict)
    """uid -> the hand-over of spec.replicas this process has announced (AutoscalerFound or
    ReplicasContested), until the replicas are taken back. The reconcile and the drift
    watch both judge the replicas, each on a body that may not show the other's status
    write yet (or whose patch from an older body overwrote it): this record, not the body,
    decides that the field is left alone and that the Event is posted once."""

    def contest_news(self, uid: str, contest: Contest) -> bool:
        """Whether announcing `contest` for `uid` is news (and now it is not)."""
        if uid in self.contested:
            return False
        self.contested[uid] = contest
        return True

    @classmethod
    def build(cls, config: settings_.ControllerSettings, kube: kube_.Kube) -> Context:
        tokens = stages.PrometheusTokens(kube)
        fleet = stages.fleet_observer(config, tokens)
        keys = adminkeys.AdminKeys(kube, config)
        tuner = concurrent.futures.ThreadPoolExecutor(config.tuner_concurrency(), thread_name_prefix="slipstream-tuner")
        recommender = stages.TwinRecommender(config)
        deps = loop.Deps(kube=kube, config=config, keys=keys, observer=fleet, tokens=tokens.refresh,
                         recommender=recommender, latency=stages.latency_for(fleet, config, tokens), tuner=tuner,
                         twin_runs=loop.TwinRuns(config.tuner_concurrency(), recommender.memo is not None))  # fmt: skip
        return cls(config, kube, keys, deps, tuner, deployments.Views(config.status_watch_seconds),
                   peers=netpol.Peers.parse(config.engine_network_policy))  # fmt: skip


RESOURCE = (models.GROUP, models.VERSION, models.PLURAL)
MANAGED = {"app.kubernetes.io/managed-by": "slipstream"}
"""The label of the objects the operator owns (the drift watches select on it)."""


def register(
    registry: kopf.OperatorRegistry, config: settings_.ControllerSettings, kube: kube_.Kube
) -> Context:
    """Attach the handlers to a registry (a fresh one per operator or per test), bound to one
    shared `Context`, which is returned."""
    ctx = Context.build(config, kube)

    def bound(fn: Any) -> Any:
        return functools.update_wrapper(functools.partial(fn, ctx), fn)

    kopf.on.login(id="login", registry=registry)(bound(login))
    kopf.on.startup(id="configure", registry=registry)(bound(configure))
    kopf.on.cleanup(id="tuner-threads", registry=registry)(bound(stop_tuner))
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(*RESOURCE, id="reconcile", registry=registry)(bound(reconcile))
    kopf.timer(*RESOURCE, id="refresh", interval=config.status_interval_seconds,
               initial_delay=config.status_interval_seconds, registry=registry)(bound(refresh))  # fmt: skip
    kopf.daemon(*RESOURCE, id="tuning", cancellation_timeout=10, registry=registry)(bound(tuning_loop))
    # Hand edits of owned objects: watched as events (no kopf state is written on them) and
    # applied back at once. The ConfigMap is the tuning loop's: every step re-applies it.
    # Events that changed none of an object's owned parts since its last good judgement
    # (nearly all: a Deployment's status) are skipped without a read (`judged`).
    kopf.on.event(*RESOURCE, id="drift-owners", registry=registry)(bound(owner_seen))
    kopf.on.event("apps", "v1", "deployments", labels=MANAGED, id="deployment-drift",
                  registry=registry)(bound(deployment_drift))  # fmt: skip
    kopf.on.event("", "v1", "services", labels=MANAGED, id="service-drift", registry=registry)(bound(service_drift))
    kopf.on.delete(*RESOURCE, id="deleted", optional=True, registry=registry)(deleted)
    return ctx


def record_changes(body: kopf.Body, sd: models.ServingDeployment, outcome: ApplyOutcome) -> None:
    for kind, name, change in outcome.changes:
        OBJECT_CHANGES.labels(kind, change).inc()
        kopf.event(body, type="Normal", reason=change.capitalize(),
                   message=change_message(kind, name, change, sd, outcome))  # fmt: skip


async def login(ctx: Context, **kwargs: Any) -> kopf.AiohttpSession:
    # The same credentials as `kube` (`kube_.login`: in-cluster ServiceAccount, else
    # $KUBECONFIG); kopf's own session, with a bound on its connections (`apisession`).
    # kopf calls this again when the apiserver answers 401, which re-reads a rotated token.
    info = kube_.login(kwargs.get("settings"))
    return apisession.bounded(info, ctx.config.api_connections)


async def configure(ctx: Context, settings: kopf.OperatorSettings, **_: Any) -> None:
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(ctx.config.worker_threads, thread_name_prefix="slipstream")
    )
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
    settings.peering.lifetime = ctx.config.peering_lifetime_seconds


async def stop_tuner(ctx: Context, **_: Any) -> None:
    ctx.tuner.shutdown(wait=False, cancel_futures=True)  # queued runs are for loops that stopped


async def reconcile(ctx: Context, body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger,
                    diff: kopf.Diff | tuple[()] = (), **_: Any) -> None:  # fmt: skip
    """Create, update and resume: the owned objects from the spec, an Event per change, status."""
    try:
        sd = models.ServingDeployment.model_validate(dict(body))
    except pydantic.ValidationError as error:  # the CRD let through what the models refuse
        message = status.invalid_spec_message(error)
        before = (body.get("status") or {}).get("conditions") or []
        patch.status.update(status.invalid_spec_patch(before, message, body["metadata"].get("generation", 0), utcnow()))
        if not any(c.get("reason") == "InvalidSpec" and c.get("status") == "False" for c in before):
            kopf.event(body, type="Warning", reason="InvalidSpec", message=message)
        RECONCILES.labels("invalid").inc()
        raise kopf.PermanentError(message) from None  # until the spec changes
    # A user's change of spec.replicas takes the field back from another writer, but not
    # from an autoscaler that targets the Deployment (`autoscalers`): that one keeps it.
    hpas = await asyncio.to_thread(hpas_of, ctx.kube, sd.metadata.namespace, sd.metadata.name)
    held = ctx.contested.get(sd.metadata.uid)
    contested = replicas.contested(sd) or held is not None
    wants_back = contested and any(tuple(d[1]) in {("spec",), ("spec", "replicas")} for d in diff)
    taken_back = wants_back and not hpas
    keep = not hpas and (taken_back or not contested)
    outcome = await asyncio.to_thread(apply_objects, ctx.kube, ctx.keys, sd, keep,
                                      ctx.config.engine_scrape_interval_seconds, ctx.peers)
    record_changes(body, sd, outcome)
    conditions = status.after_reconcile(sd, outcome.problem, outcome.deployment, utcnow())
    if held is not None and not taken_back and not replicas.contested(sd):
        # announced, but this body predates the status write: keep the condition in the patch
        conditions = status.set_condition(conditions, replicas.CONDITION, True, held.reason, held.message,
                                          sd.metadata.generation, utcnow())  # fmt: skip
    if hpas:
        conditions = left_to_autoscaler(body, sd, conditions, hpas, outcome.deployment, wants_back,
                                        lambda c: ctx.contest_news(sd.metadata.uid, c))  # fmt: skip
    if taken_back:
        ctx.contested.pop(sd.metadata.uid, None)
        conditions = [c for c in conditions if c.type != replicas.CONDITION]
        kopf.event(body, type="Normal", reason="ReplicasTakenBack",
                   message=f"spec.replicas changed: the operator sets the engine Deployment's replicas "
                   f"({sd.spec.replicas}) again")  # fmt: skip
    first = objects.current_setting(sd) if sd.status.threshold is None else None
    patch.status.update(status.patch(sd, first, conditions, outcome.deployment))
    if (wake := ctx.wakes.get(sd.metadata.uid)) is not None:
        wake.set()  # a changed spec (a Fixed edit) reaches the engines now, not next interval
    if outcome.problem is not None:
        RECONCILES.labels("deferred").inc()
        if outcome.problem[0] not in {c.reason for c in sd.status.conditions if c.status == "False"}:
            kopf.event(body, type="Warning", reason=outcome.problem[0], message=outcome.problem[1])
        raise kopf.TemporaryError(outcome.problem[1], delay=ctx.config.retry_delay_seconds)
    RECONCILES.labels("ok").inc()
    logger.info(
        "%s/%s reconciled: %d object(s) changed", sd.metadata.namespace, sd.metadata.name,
        len(outcome.changes),
    )  # fmt: skip


def left_to_autoscaler(
    body: kopf.Body, sd: models.ServingDeployment, conditions: list[models.Condition], hpas: list[str],
    deployment: dict[str, Any] | None, wants_back: bool, news: Callable[[Contest], bool] = lambda c: True,
) -> list[models.Condition]:
    """The conditions with spec.replicas left to the HPAs `hpas` (one AutoscalerFound Event
    when that is news: not in the conditions, and ``news(contest)``, which the drift watch
    may have answered already); a change of spec.replicas meanwhile is not applied, and an
    Event says why (both set: the autoscaler wins, docs/operator.md, "Autoscalers")."""
    if wants_back:
        kopf.event(body, type="Normal", reason="ReplicasLeftToAutoscaler",
                   message=autoscalers.held_message(hpas, sd.spec.replicas))  # fmt: skip
    if autoscalers.held_by(conditions, replicas.CONDITION):
        return conditions
    have = ((deployment or {}).get("spec") or {}).get("replicas")
    message = autoscalers.message(hpas, have, sd.spec.replicas)
    if news(Contest.autoscaler(message)):
        kopf.event(body, type="Normal", reason="AutoscalerFound", message=message)
    return status.set_condition(conditions, replicas.CONDITION, True, autoscalers.REASON, message,
                                sd.metadata.generation, utcnow())  # fmt: skip


def autoscaler_gone(ctx: Context, sd: models.ServingDeployment) -> ApplyOutcome | None:
    """Blocking. When the replicas were left to an HPA that no longer targets the engine
    Deployment: apply the spec (spec.replicas included) and return what that did; else None."""
    if not autoscalers.held_by(sd.status.conditions, replicas.CONDITION):
        return None
    if hpas_of(ctx.kube, sd.metadata.namespace, sd.metadata.name):
        return None
    return apply_objects(ctx.kube, ctx.keys, sd, True, ctx.config.engine_scrape_interval_seconds)


async def refresh(ctx: Context, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """The timer: readiness from the engine Deployment (as the drift watch last saw it)."""
    try:
        sd = models.ServingDeployment.model_validate(dict(body))
    except pydantic.ValidationError:
        return  # reconcile reports it (InvalidSpec)
    if sd.status.observed_generation is None:
        return  # not reconciled yet: reconcile writes the first status
    if (back := await asyncio.to_thread(autoscaler_gone, ctx, sd)) is not None:
        ctx.contested.pop(sd.metadata.uid, None)
        record_changes(body, sd, back)
        kopf.event(body, type="Normal", reason="ReplicasTakenBack",
                   message=f"no HorizontalPodAutoscaler targets the engine Deployment any more: the operator "
                   f"sets its replicas ({sd.spec.replicas}) again")  # fmt: skip
    asked = time.monotonic()
    deployment = ctx.views.get(sd.metadata.namespace, sd.metadata.name, asked)
    if deployment is None:  # not seen by the watch, deleted, or its view too old
        deployment = await asyncio.to_thread(
            ctx.kube.get, "apps/v1", "Deployment", sd.metadata.namespace, sd.metadata.name
        )
        ctx.views.answered(sd.metadata.namespace, sd.metadata.name, deployment, asked)
    conditions = status.with_readiness(sd, sd.status.conditions, deployment, utcnow())
    if back is not None:
        conditions = [c for c in conditions if c.type != replicas.CONDITION]
    if replicas.contested(sd) and deployment is not None and not replicas.writers(deployment, kube_.FIELD_MANAGER):
        # The operator owns spec.replicas alone again (taken back): a condition a stale
        # write put back must not outlive it.
        conditions = [c for c in conditions if c.type != replicas.CONDITION]
    was = next((c.status for c in sd.status.conditions if c.type == status.READY), None)
    now = next(c for c in conditions if c.type == status.READY)
    if was != now.status:
        reason = "EnginesReady" if now.status == "True" else "EnginesNotReady"
        kopf.event(body, type="Normal", reason=reason, message=now.message)
    patch.status.update(status.changed(sd, status.readiness_patch(conditions, deployment)))


async def tuning_loop(ctx: Context, body: kopf.Body, uid: str, stopped: kopf.DaemonStopped, logger: kopf.Logger,
                      **_: Any) -> None:  # fmt: skip
    """The deployment's own tuning loop (see `loop`): observe -> tune -> rollout."""
    memory = loop.Memory()
    wake = ctx.wakes.setdefault(uid, asyncio.Event())
    failed: str | None = None
    try:
        while not stopped:
            wake.clear()
            delay, memory, failed = await step_once(ctx, body, memory, failed, logger)
            early = loop.until_mix_jump(ctx.deps, lambda: step_view(body)[0], memory, delay)
            if await pause(stopped, wake, delay, early):
                MIX_JUMPS.inc()
                logger.info("stepping early: %s", memory.jumped)
    finally:
        ctx.wakes.pop(uid, None)
        ctx.contested.pop(uid, None)  # its status keeps the condition: a resumed one is not news
        meta = body.get("metadata", {})
        with contextlib.suppress(KeyError):  # never stepped
            LAST_STEP.remove(meta.get("namespace"), meta.get("name"))


async def step_once(
    ctx: Context, body: kopf.Body, memory: loop.Memory, failed: str | None, logger: kopf.Logger
) -> tuple[float, loop.Memory, str | None]:
    """One step of a tuning loop: (seconds to the next, the loop's memory, the failure
    last reported). A function of its own so that what a step reads (the model, the
    outcome) is freed when it returns, not held through the pause, where every loop of a
    large fleet would hold one of each."""
    sd, read = step_view(body)
    delay = ctx.config.rollout_poll_seconds
    if sd is None or sd.status.observed_generation is None:  # reconcile writes first
        return delay, memory, failed
    with TUNING_STEP_SECONDS.time():
        try:
            outcome = await loop.step(ctx.deps, sd, memory)
            await asyncio.to_thread(write_status, ctx.kube, read, outcome.patch)
        except Exception as error:  # fail static: nothing moves, say so once
            LAST_STEP.labels(sd.metadata.namespace, sd.metadata.name).set_to_current_time()
            TUNING_STEPS.labels("error").inc()
            problem = f"{type(error).__name__}: {str(error)[:300]}"
            logger.warning("tuning step failed: %s", problem)
            if problem != failed:
                kopf.event(body, type="Warning", reason="TuningStepFailed",
                           message=f"the tuning step failed; nothing was changed: {problem}")  # fmt: skip
            return delay, loop.Memory(), problem  # re-read the persisted state next time
    TUNING_STEPS.labels("ok").inc()
    LAST_STEP.labels(sd.metadata.namespace, sd.metadata.name).set_to_current_time()
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1024])
        if (result := ROLLOUT_ENDS.get(event.reason)) is not None:
            ROLLOUTS.labels(sd.metadata.namespace, result).inc()
    return outcome.delay_s, memory, None


async def reverted(ctx: Context, kind: str, body: kopf.Body, event: str | None, logger: kopf.Logger) -> None:
    """Judge one event of an owned object; apply the spec back over a hand edit, with a Warning."""
    live = dict(body)
    if ctx.judged.unchanged(live, event):  # a status-only event: nothing the operator owns moved
        DRIFT_EVENTS_SKIPPED.labels(kind).inc()
        return
    ctx.judged.forget(live)  # until this judgement ends well
    DRIFT_EVENTS_JUDGED.labels(kind).inc()
    try:
        found = await asyncio.to_thread(revert_drift, ctx.kube, kind, live, ctx.reverts, time.monotonic(),
                                        lambda uid: uid in ctx.contested)  # fmt: skip
        if found is not None and found.contest is not None:
            await asyncio.to_thread(contest_replicas, ctx.kube, found.owner, found.contest)
    except kube_.ApiError as error:  # the next event retries; never a crash loop
        logger.warning("reverting %s drift failed: %s", kind, error)
        return
    if found is None:
        return
    ctx.judged.record(found.settled, found.owner)
    if found.contest is not None:
        uid = str((found.owner.get("metadata") or {}).get("uid") or "")
        if ctx.contest_news(uid, found.contest):
            kind_of_event = "Normal" if found.contest.reason == autoscalers.REASON else "Warning"
            kopf.event(cast(kopf.Body, found.owner), type=kind_of_event, reason=found.contest.event,
                       message=found.contest.message)  # fmt: skip
    if found.paths:
        paths = found.paths
        OBJECT_CHANGES.labels(kind, "reverted").inc()
        listed = "; ".join(paths[:8]) + (f"; and {len(paths) - 8} more" if len(paths) > 8 else "")
        kopf.event(cast(kopf.Body, found.owner), type="Warning", reason="DriftReverted",
                   message=f"Reverted {kind} {body['metadata']['name']} to the spec: {listed} "
                   "(edit the ServingDeployment instead)")  # fmt: skip


async def owner_seen(ctx: Context, body: kopf.Body, type: str | None, **_: Any) -> None:
    shed_managed_fields(body)  # kopf keeps this body while the loop runs: keep it small
    ctx.judged.owner_seen(dict(body), type)


async def recreated(ctx: Context, kind: str, body: kopf.Body, logger: kopf.Logger) -> None:
    """Repair a deleted owned object within this event, with a Warning (`recreate_deleted`)."""
    try:
        owner = await asyncio.to_thread(recreate_deleted, ctx.kube, kind, dict(body))
    except kube_.ApiError as error:  # its namespace going away, say: nothing to repair
        logger.warning("recreating the deleted %s failed: %s", kind, error)
        return
    if owner is None:
        return
    OBJECT_CHANGES.labels(kind, "recreated").inc()
    kopf.event(cast(kopf.Body, owner), type="Warning", reason="Recreated",
               message=f"Recreated {kind} {body['metadata']['name']}, which was deleted while ServingDeployment "
               f"{owner['metadata']['name']} owns it (delete the ServingDeployment to remove what it owns)")  # fmt: skip


async def drift_event(ctx: Context, kind: str, body: kopf.Body, type: str | None, logger: kopf.Logger) -> None:
    if type == "DELETED":
        ctx.judged.forget(dict(body))
        await recreated(ctx, kind, body, logger)
    elif type in (None, "MODIFIED"):
        await reverted(ctx, kind, body, type, logger)


async def deployment_drift(ctx: Context, body: kopf.Body, type: str | None, logger: kopf.Logger, **_: Any) -> None:
    ctx.views.seen(cast(dict[str, Any], body), type, time.monotonic())
    await drift_event(ctx, "Deployment", body, type, logger)


async def service_drift(ctx: Context, body: kopf.Body, type: str | None, logger: kopf.Logger, **_: Any) -> None:
    await drift_event(ctx, "Service", body, type, logger)


async def deleted(name: str, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
    logger.info("%s/%s deleted: its owned objects go with it (owner references)", namespace, name)


def shed_managed_fields(body: kopf.Body) -> None:
    """Drop `metadata.managedFields` from a ServingDeployment's latest body as kopf holds it.

    kopf keeps the body of each object that has a daemon or a timer for as long as they run
    (its "live body", replaced by each watch event's), so the operator holds one body per
    ServingDeployment, and managedFields are over half of it: ~15 of ~27 kB as Python
    objects, ~7 MB for 500 ServingDeployments. Nothing
    reads them: kopf's diffs and its annotations leave metadata out but for labels and
    annotations, and the operator reads managedFields only of the Deployments it owns, from
    their own events. `body["metadata"]` is the watch event's own dict (kopf's body is a
    view of it, replaced as a whole by the next event), and kopf calls an event's event
    handlers before its other handlers: each new body loses them as it arrives."""
    meta = body.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


def step_view(body: kopf.Body) -> tuple[models.ServingDeployment | None, dict[str, Any]]:
    """A tuning step's view of its ServingDeployment: the model (None when the spec is
    invalid), and the metadata its status write is guarded by (the resourceVersion the
    model was read at). Both are taken in one go, nothing awaited in between, from kopf's
    live body, whose nested parts a newer event replaces rather than changes; so no deep
    copy of the body is kept through the step: a loop waiting its turn on the tuner pool
    would hold one (~30 kB), and in a fleet's first round hundreds of loops wait."""
    meta = body.get("metadata") or {}
    read = {"metadata": {k: meta.get(k) for k in ("namespace", "name", "resourceVersion")}}
    try:
        return models.ServingDeployment.model_validate(dict(body)), read
    except pydantic.ValidationError:
        return None, read  # reconcile reports it (InvalidSpec); nothing moves meanwhile


async def pause(stopped: kopf.DaemonStopped, wake: asyncio.Event, delay: float,
                early: Coroutine[Any, Any, bool] | None = None) -> bool:  # fmt: skip
    """Sleep `delay` seconds, or less when the operator stops, the spec changes or `early`
    (`loop.until_mix_jump`) returns True; whether it was `early` that ended the pause."""

    async def until_stopped() -> None:
        await stopped.wait(delay)

    async def until_early(early: Coroutine[Any, Any, bool]) -> bool:
        try:
            if await early:
                return True
        except Exception as error:  # a failed watch leaves the timer, never a busy loop
            log.warning("queue-mix watch failed: %s", error)
        await asyncio.Event().wait()  # the timer or the wake ends the pause
        return False

    jumped = asyncio.ensure_future(until_early(early)) if early is not None else None
    waits = {asyncio.ensure_future(until_stopped()), asyncio.ensure_future(wake.wait())}
    done, pending = await asyncio.wait(waits | ({jumped} if jumped else set()), return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return jumped is not None and jumped in done and jumped.result()
