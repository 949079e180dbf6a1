"""The tuning loop of one ServingDeployment: observe -> tune -> rollout, one step per interval.

Each ServingDeployment has its own loop (a kopf daemon) with its own timer, and every
network call in a step has a timeout: one deployment's slow Prometheus or dead engines
never delay another's loop, and there is no lock shared between loops. A step:

1. observe: a `WorkloadSnapshot` of the last interval (Auto and Recommend only);
2. tune: the recommendation, when the snapshot is valid (fail-static otherwise), with the
   engines' KV pool as the last step read it (`Memory.pools`);
3. read: what every ready engine pod runs and its KV pool (`/get_server_info`, all pods
   at once);
4. analyse: the canary figures, when an analysis window has ended;
5. decide: `rollout.machine.advance` (pure);
6. act: the ConfigMap first (a pod starting now gets the new value), then each pod's
   `/set_internal_state`, then read back and decide once more to acknowledge what took;
7. record: status (what the engines run, read back), conditions and Events.

While a rollout is in flight the loop steps every `rollout_poll_seconds`; otherwise every
`spec.tuning.intervalSeconds` (times `tuning_time_scale`), or at once when the spec changes,
or early when the queue mix jumps: between steps `until_mix_jump` polls the snapshot every
`mix_poll_seconds` (from the shared fleet read) and `tune.mixjump` judges it against the
mix the last step decided on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import ipaddress
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import prometheus_client

from slipstream.api import models
from slipstream.api import snapshot as snapshot_
from slipstream.controller import objects, status, tuning
from slipstream.controller import settings as settings_
from slipstream.controller.clients import adminkeys
from slipstream.controller.clients import kube as kube_
from slipstream.controller.watch import drift
from slipstream.engine import admin, metrics
from slipstream.rollout import analysis, engines, machine, sequential
from slipstream.tune import deployment as tune_deployment
from slipstream.tune import guardrails, mixjump, overload, pooling

log = logging.getLogger(__name__)


JUMP_MIN_SAMPLES = guardrails.GuardrailSettings().jump_min_samples
"""First tokens a step the queue mix brought forward needs in its shorter window."""


class SnapshotSource(Protocol):
    """`slipstream.observe` as the loop uses it: never raises, says why a snapshot is invalid."""

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snapshot_.WorkloadSnapshot: ...


class Recommender(Protocol):
    """`slipstream.tune` (recommender + guardrails) as the loop uses it: pure, in two parts.

    `without_twin` is cheap (the guardrails' gate, a reused twin run) and runs on the event
    loop; it returns None when the twin must run, and only then does `recommend` (the twin
    run, ~0.75 CPU s) go to the tuner pool. Both give the same Recommendation for the same
    inputs whichever answers."""

    def without_twin(
        self, sd: models.ServingDeployment, snap: snapshot_.WorkloadSnapshot, fleet: models.EngineSetting, now: float,
        jumped: bool = False,
    ) -> tuning.Recommendation | None: ...

    def recommend(
        self, sd: models.ServingDeployment, snap: snapshot_.WorkloadSnapshot, fleet: models.EngineSetting, now: float,
        jumped: bool = False,
    ) -> tuning.Recommendation: ...


@dataclass(frozen=True)
class NotBuilt:
    """Stands in for a stage that is not wired yet: metrics unavailable, so nothing moves."""

    what: str = "the observe stage is not built into this operator yet"

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snapshot_.WorkloadSnapshot:
        name = f"{sd.metadata.namespace}/{sd.metadata.name}"
        return snapshot_.invalid(name, now, window_s, snapshot_.UNREACHABLE, self.what)

    def without_twin(
        self, sd: models.ServingDeployment, snap: snapshot_.WorkloadSnapshot, fleet: models.EngineSetting, now: float,
        jumped: bool = False,
    ) -> tuning.Recommendation | None:
        return self.recommend(sd, snap, fleet, now)

    def recommend(
        self, sd: models.ServingDeployment, snap: snapshot_.WorkloadSnapshot, fleet: models.EngineSetting, now: float,
        jumped: bool = False,
    ) -> tuning.Recommendation:
        return tuning.Recommendation(fleet, False, "the tuner is not built into this operator yet")


LatencyFor = Callable[[models.ServingDeployment], analysis.PodLatency]
"""A deployment -> where its canary figures are read."""


@dataclass
class Deps:
    """Everything a step talks to; tests swap any of them."""

    kube: kube_.Kube
    config: settings_.ControllerSettings
    keys: adminkeys.AdminKeys
    observer: SnapshotSource = field(default_factory=NotBuilt)
    recommender: Recommender = field(default_factory=NotBuilt)
    latency: LatencyFor | None = None
    tokens: Callable[[models.ServingDeployment], Awaitable[None]] | None = None
    """Refreshes a deployment's Prometheus bearer token before its observe step."""
    clock: Callable[[], float] = time.time
    tuner: concurrent.futures.Executor | None = None
    """Where the twin runs (`Recommender.recommend`): a pool of `tuner_concurrency()` threads
    apart from the I/O threads (`settings.tuner_threads`); None: the default executor."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """How `until_mix_jump` waits between polls (tests pair it with `clock`)."""
    twin_runs: TwinRuns = field(default_factory=lambda: TwinRuns())
    """Each deployment's twin run on the tuner pool (`TwinRuns`): the default waits for
    every run, as a recommender without a memo must."""


TWIN_QUEUED = "TwinQueued"
"""The hold of a step whose twin run waits on a full tuner pool (`TwinRuns`)."""
TUNER_QUEUED = prometheus_client.Counter(
    "slipstream_tuner_queued_steps", "Steps that held TwinQueued: every tuner thread was busy, so the step "
    "submitted its twin run (or found it still queued) and did not wait behind the queue.",
)


@dataclass
class TwinRuns:
    """The twin runs submitted to the tuner pool, one per deployment at most.

    A step whose run would start at once waits for it, as a step always did. A step that
    finds every pool thread busy submits its run and holds (`TWIN_QUEUED`) instead of
    waiting behind the queue: the loop keeps stepping every interval (engines read,
    rollouts analysed, status written) while hundreds of deployments wait their turn on a
    fleet's first round, and a step whose run is still queued holds again without queuing
    a second. The run stores its result in the tuner memo when it ends, and a later step
    finds it there (`Recommender.without_twin`) if the workload has not moved since. So
    without a memo (`tuner_reuse_seconds` 0) every step waits for its run, however long."""

    capacity: int = 1
    """Runs that can execute at once (the tuner pool's threads)."""
    memo: bool = False
    """Whether a finished run's result reaches a later step (the recommender has a memo);
    False: every step waits for its own run."""
    pending: dict[str, asyncio.Future[Any]] = field(default_factory=dict)

    def busy(self) -> int:
        """Runs submitted and not finished (running or queued)."""
        return len(self.pending)

    def queued(self, name: str) -> bool:
        """Whether `name`'s last run is still waiting or running."""
        return name in self.pending

    def submit(self, name: str, run: asyncio.Future[Any], waited: bool) -> asyncio.Future[Any]:
        """Track ``run`` until it ends (then it is dropped: its result is in the memo, or
        went to the step that waited for it). A queued run that fails is logged here, as no
        step waits for it."""

        def done(future: asyncio.Future[Any]) -> None:
            if self.pending.get(name) is future:
                del self.pending[name]
            if not waited and not future.cancelled() and future.exception() is not None:
                log.warning("%s: a queued twin run failed: %r", name, future.exception())

        self.pending[name] = run
        run.add_done_callback(done)
        return run


@dataclass
class Memory:
    """What the loop wrote last (the watch may not have delivered it back yet)."""

    rollout: models.RolloutStatus | None = None
    fleet: models.EngineSetting | None = None
    conditions: list[models.Condition] | None = None
    refusals: dict[str, str] = field(default_factory=dict)
    """Pod -> why its last change failed (a later read shows only the setting it kept)."""
    mix: mixjump.MixWatch = field(default_factory=mixjump.MixWatch)
    """The queue mix the last step decided on, and whether a jump from it may fire."""
    jumped: str = ""
    """Why the next step comes before its timer (the mix jump), for its Event; "" if not."""
    moved: str = ""
    """How the mix of that jump moved (`from -> to`), for a canary it voids; "" if none."""
    jump_retry: bool = False
    """The jump that brought the next step was already announced: a retry of a step on it
    that held (``tune.mixjump.RETRIES``) is logged, not posted as another Event."""
    pools: tuple[snapshot_.PodPool, ...] = ()
    """Each engine pod's KV pool as the last step read it (`tuning.kv_pools`): the tuner runs
    on the pods' pool of the step before, since a step reads the pods after it observes."""

    backlog: tuple[overload.Reading, ...] = ()
    """The waiting queue and served prefill rate of the last few windows (`tune.overload`)."""
    first_look: float | None = None
    """When this loop first observed (`since`): no window reaches back before it."""

    def since(self, sd: models.ServingDeployment, now: float) -> float:
        """How far back a step's window may be widened (`tune.pooling`): the last change of
        the fleet's setting (`tune.deployment.last_step_at`), and never before this loop's
        first look (a range reaching before the engines' series began would count idle
        time and lower the rates, as the twin's auto bounds its window by its first call)."""
        if self.first_look is None:
            self.first_look = now
        last = tune_deployment.last_step_at(sd.status)
        return max(self.first_look, last) if last is not None else self.first_look

    def fired(self, mix: mixjump.Mix, before: mixjump.MixWatch, then: str) -> None:
        """The watch (as it was, ``before``) fired on ``mix``: the next step is a jump's."""
        self.jump_retry = before.announced
        self.jumped, self.moved = jump_message(mix, before, then)


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: the status patch, the Events to record, when to step again."""

    patch: dict[str, Any]
    events: list[machine.Event]
    delay_s: float
    decision: machine.RolloutDecision


def ready_pods(items: list[dict[str, Any]]) -> dict[str, str]:
    """{pod name: pod IP} of the engine pods that are Ready, have an IP and are not going."""
    out = {}
    for pod in items:
        meta, st = pod["metadata"], pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if ready and st.get("podIP") and not meta.get("deletionTimestamp"):
            out[meta["name"]] = st["podIP"]
    return out


def address(sd: models.ServingDeployment, ip: str) -> str:
    """An engine pod's admin API: its pod IP and the engine port."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{sd.spec.engine.port}"


def allowed(url: str, networks: str) -> bool:
    """Whether the operator may contact this engine address (settings.engine_networks)."""
    if not networks.strip():
        return True
    try:
        ip = ipaddress.ip_address((urllib.parse.urlsplit(url).hostname or "").strip("[]"))
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(n.strip(), strict=False) for n in networks.split(",") if n.strip())


async def read_window(deps: Deps, sd: models.ServingDeployment, window: float, now: float) -> snapshot_.WorkloadSnapshot:
    """The snapshot of the last ``window`` seconds; a failed read is a reason, never zero traffic."""
    try:
        return await asyncio.wait_for(deps.observer.snapshot(sd, window, now),
                                      timeout=2 * deps.config.prometheus_timeout_seconds)  # fmt: skip
    except Exception as error:
        name = f"{sd.metadata.namespace}/{sd.metadata.name}"
        return snapshot_.invalid(name, now, window, snapshot_.UNREACHABLE, f"reading metrics failed: {type(error).__name__}")


WIDENS = (snapshot_.TOO_FEW_SAMPLES, snapshot_.NO_TRAFFIC)
"""Why a window is read again wider (`tune.pooling`): it holds too little, not bad data."""


async def read_pooled(deps: Deps, sd: models.ServingDeployment, now: float, jumped: bool,
                      since: float | None) -> snapshot_.WorkloadSnapshot:  # fmt: skip
    """The step's snapshot under `tune.pooling`'s rule: the interval's window (a jump's own,
    ``jumped``), read again at twice the range while it holds fewer samples than the floor,
    never past ``since`` (the last change of the fleet's setting, or this loop's first look)
    nor 16 intervals; the first that holds enough is the step's (valid), else the widest
    read (TooFewSamples). Each range is one fleet read, shared by every deployment with the
    same interval on the same Prometheus (`observe.fleet`). The mix polls read the interval
    alone: a jump is judged on the mix of now."""
    interval = tuning.interval(sd, deps.config)
    if jumped:  # the traffic since the jump, not the interval's mostly older mix (tune.mixjump)
        own = mixjump.window_s(tuning.scale(deps.config.mix_poll_seconds, deps.config), interval)
        windows = pooling.jump_ladder(own, interval, now, since)
        need: float = min(deps.config.observe_min_samples, JUMP_MIN_SAMPLES)
    else:
        windows, need = pooling.ladder(interval, now, since), deps.config.observe_min_samples
    snap = None
    for window in windows:
        snap = await read_window(deps, sd, window, now)
        if snap.valid or snap.invalid not in WIDENS:
            return snap
        if snap.invalid == snapshot_.TOO_FEW_SAMPLES and (have := pooling.evidence(snap, jumped)) >= need:
            return dataclasses.replace(snap, invalid=None, detail=f"{have:.0f} samples (first tokens"
                                       f"{' and requests waiting' if jumped else ''}) in {window:.0f} s")  # fmt: skip
    assert snap is not None
    if snap.invalid == snapshot_.TOO_FEW_SAMPLES and len(windows) > 1:
        snap = dataclasses.replace(snap, detail=f"{snap.detail} (widened from {windows[0]:.0f} s: the widest "
                                   "window since the fleet's setting last changed, at most 16 intervals)")  # fmt: skip
    return snap


async def observe(deps: Deps, sd: models.ServingDeployment, fleet: models.EngineSetting, now: float,
                  pools: tuple[snapshot_.PodPool, ...] = (), jumped: bool = False, since: float | None = None,
                  backlog: tuple[overload.Reading, ...] = (),
                  ) -> tuple[snapshot_.WorkloadSnapshot | None, tuning.Recommendation | None]:  # fmt: skip
    """The window's snapshot and, when it is valid, the tuner's recommendation on it, with
    the pods' KV pools (`Memory.pools`) added to the snapshot for the twin (``jumped``: the
    queue mix brought this step forward: a shorter window, and a harder cap may skip the
    cooldown, tune.guardrails; ``since``: how far back a window may be widened,
    `read_pooled`; ``backlog``: the readings of the windows before, `Memory.backlog`, with
    which the snapshot's own says whether the fleet is overloaded, `tune.overload`)."""
    if not tuning.observes(sd):
        return None, None
    name = f"{sd.metadata.namespace}/{sd.metadata.name}"
    if deps.tokens is not None:
        await deps.tokens(sd)
    snap = await read_pooled(deps, sd, now, jumped, since)
    snap = dataclasses.replace(snap, overload=overload.overloaded(overload.remember(backlog, overload.reading(snap),
                                                                                  backlog_gap_s(sd, deps.config))))
    if not snap.valid:
        return snap, None
    snap = dataclasses.replace(snap, kv_pools=pools)
    # Reuse (or a guardrail's hold) is decided here on the event loop: it costs a dict
    # look-up and the guardrails, and must not queue behind other deployments' twin runs.
    if (quick := deps.recommender.without_twin(sd, snap, fleet, now, jumped)) is not None:
        return snap, quick
    # A twin run goes to a thread of the tuner pool: it must not stall the event loop that
    # every other deployment's loop shares, nor hold the worker threads their Kubernetes and
    # Prometheus calls wait for. Runs beyond the pool's size queue (in order): CPU-bound
    # under the GIL, more at once would only hold more memory. The call runs in a copy of
    # this task's context, as `asyncio.to_thread` does (kopf's context vars, e.g.
    # the Event queue `kopf.event` posts to, stay visible there).
    runs = deps.twin_runs
    if runs.queued(name):
        return snap, queued_hold(fleet, f"this deployment's twin run is still queued or running ({runs.busy()} "
                                 f"runs on a pool of {runs.capacity})")  # fmt: skip
    call = functools.partial(contextvars.copy_context().run, deps.recommender.recommend, sd, snap, fleet, now, jumped)
    full = runs.memo and runs.busy() >= runs.capacity
    run = asyncio.get_running_loop().run_in_executor(deps.tuner, call)
    if full:  # wait for it at a later step, through the memo, not here behind the queue
        runs.submit(name, run, waited=False)
        return snap, queued_hold(fleet, f"every tuner thread is busy ({runs.busy()} runs on a pool of "
                                 f"{runs.capacity}): the twin runs this window when its turn comes, and a later "
                                 "step decides on it while the traffic has not moved")  # fmt: skip
    return snap, await runs.submit(name, run, waited=True)


def queued_hold(fleet: models.EngineSetting, why: str) -> tuning.Recommendation:
    """A step that judged nothing because its twin run waits on the tuner pool (`TwinRuns`)."""
    TUNER_QUEUED.inc()
    return tuning.Recommendation(fleet, False, f"{TWIN_QUEUED}: {why}", judged=False)


async def analyse(deps: Deps, sd: models.ServingDeployment, state: models.RolloutStatus,
                  pods: dict[str, str], now: float) -> analysis.Verdict:  # fmt: skip
    """The sequential rule on same-size requests (with baseline pods and the rule on);
    otherwise canary vs baseline per-tenant p99 over the analysis window, and without a
    baseline pod the canaries over the window before the canary started. Engines that
    export no size-class TTFT at all are judged by the p99 comparison too, and the verdict
    says so: the sequential rule would find nothing to judge by and roll every move back."""
    window = tuning.policy(sd, deps.config).analysis_window_s
    if deps.latency is None:
        return analysis.failed_read("no source of canary figures is configured")
    source = deps.latency(sd)
    ns, name = sd.metadata.namespace, sd.metadata.name
    canaries = sorted(state.canary_pods)
    others = sorted(set(pods) - set(canaries))
    fallback = ""
    if deps.config.canary_sub_window_seconds > 0 and others:
        verdict = await analyse_sequential(deps, sd, state, source, canaries, others, now)
        if verdict is not None:
            return verdict
        fallback = (f" (by one window's p99: the engines export no {metrics.TTFT_BY_SIZE_CLASS_SECONDS}, "
                    "which the sequential rule compares)")  # fmt: skip
    try:
        canary = await source.tenant_p99(ns, name, canaries, now - window, now)
        if others:
            baseline = await source.tenant_p99(ns, name, others, now - window, now)
        else:
            started = machine.seconds(state.started_at) or now - window
            baseline = await source.tenant_p99(ns, name, canaries, started - window, started)
    except Exception as error:
        return analysis.failed_read(error)
    objective = sd.spec.tuning.objective
    targets = {t.name: t.ttft_p99_seconds for t in objective.tenants}
    floors = {t: deps.config.canary_noise_floor * targets.get(t, objective.ttft_p99_seconds) for t in canary}
    verdict = analysis.compare(canary, baseline, sd.spec.tuning.rollout.max_regression_percent, floors)
    return dataclasses.replace(verdict, summary=verdict.summary + fallback) if fallback else verdict


EXPORT_LOOKBACK_S = 3600.0
"""How far back (wall seconds) `analyse_sequential` looks for the pods' size-class series
when every sub-window came back empty: any sample in that hour means the engines export
it, so the empty analysis is a scrape gap, not an engine without the patch's histogram."""


def sub_window_s(config: settings_.ControllerSettings) -> float:
    """The canary's sub-window in wall seconds: the configured one (scaled as spec durations
    are), never under two scrapes of the engines (else ``increase`` has one sample and no
    cell; see `ControllerSettings.canary_sub_window_seconds`)."""
    return max(tuning.scale(config.canary_sub_window_seconds, config), 2 * config.engine_scrape_interval_seconds)


async def analyse_sequential(deps: Deps, sd: models.ServingDeployment, state: models.RolloutStatus,
                             source: analysis.PodLatency, canaries: list[str], others: list[str],
                             now: float) -> analysis.Verdict | None:  # fmt: skip
    """The sequential rule over the sub-windows since the analysis started; it must decide
    once the analysis reaches its limit (`machine.analysis_final`). None when no sub-window
    has a size-class cell on either side and the engines do not export the histogram (none
    of the pods had the series in the last `EXPORT_LOOKBACK_S`): then the one-window p99
    decides. When every sub-window is blind but the pods did export it, that is a gap in
    Prometheus' samples, and the rule holds (the limit moves out by the blind time, and at
    the limit nothing to judge by rolls back): the one-window p99 of a gapped window would
    judge on what the gap left."""
    pol = tuning.policy(sd, deps.config)
    sub_s = sub_window_s(deps.config)
    started = machine.seconds(state.started_at) or now - pol.analysis_window_s
    try:
        windows = await source.sub_windows(sd.metadata.namespace, sd.metadata.name, canaries, others,
                                           started, now, sub_s)  # fmt: skip
    except Exception as error:
        return analysis.failed_read(error)
    if windows and not any(w.canary or w.baseline for w in windows):
        if any(w.scraped for w in windows):
            return None
        try:  # every sub-window missed: a scrape gap, or engines without the histogram?
            exported = await source.exports_size_classes(sd.metadata.namespace, sd.metadata.name,
                                                         [*canaries, *others], now, EXPORT_LOOKBACK_S)  # fmt: skip
        except Exception as error:
            return analysis.failed_read(error)
        if not exported:
            return None
    rule = sequential.SequentialRule(tolerance_percent=sd.spec.tuning.rollout.max_regression_percent)
    blind = sequential.blind_s(windows)
    final = machine.analysis_final(state, pol, now, blind)
    return analysis.from_sequential(sequential.evaluate(windows, rule, final, pods=(len(canaries), len(others))), blind)


async def sync_configmap(deps: Deps, sd: models.ServingDeployment, setting: models.EngineSetting) -> machine.Event | None:
    """Keep the ConfigMap (what new pods start with) at `setting`. A value someone else
    wrote (another field manager owns a data key: `kubectl edit`, `kubectl patch`) is
    reverted with a Warning naming what was reverted; the loop's own moves are a Normal
    Updated."""
    desired = objects.configmap(sd, setting)
    name = desired["metadata"]["name"]
    current = await asyncio.to_thread(deps.kube.get, "v1", "ConfigMap", sd.metadata.namespace, name)
    if current is not None and current.get("data") == desired["data"]:
        return None
    await asyncio.to_thread(deps.kube.apply, desired)
    if current is not None and (who := drift.managers_of(current, kube_.FIELD_MANAGER, "f:data")):
        paths = drift.drift(desired["data"], current.get("data") or {}, "data")
        return machine.Event("Warning", "DriftReverted", f"Reverted ConfigMap {name} to the fleet's setting: "
                             f"{'; '.join(paths[:8])} (written by {', '.join(who)}; edit the ServingDeployment "
                             "instead)")  # fmt: skip
    return machine.Event("Normal", "Updated", f"Updated ConfigMap {name}: new pods start with {machine.show(setting)}")


@dataclass(frozen=True)
class PodsRead:
    """Stage 3 of a step: the engine pods and what each runs, read all at once."""

    items: list[dict[str, Any]]
    """The pods of the deployment's selector, Ready or not (none: nothing to run on)."""
    pods: dict[str, str]
    """{pod: IP} of the Ready pods (`ready_pods`)."""
    blocked: frozenset[str]
    """Ready pods whose IP is outside ``SLIPSTREAM_ENGINE_NETWORKS``: never called."""
    views: list[machine.Pod]
    """What each Ready pod reports (or why it could not), by name."""
    client: Callable[[str], admin.AdminClient]
    """The admin client of a Ready pod, with the deployment's admin key."""


async def read_fleet(deps: Deps, sd: models.ServingDeployment, memory: Memory) -> PodsRead:
    """Every Ready engine pod's setting and KV pool (`/get_server_info`, all at once); a pod
    whose last change was refused shows that refusal until a change takes."""
    config = deps.config
    items = await asyncio.to_thread(deps.kube.pods, sd.metadata.namespace, objects.label_selector(sd))
    pods = ready_pods(items)
    try:
        key: str | None = await asyncio.to_thread(deps.keys.key, sd)
    except adminkeys.KeyUnavailable as error:  # reads may still work; changes are refused (401)
        log.warning("%s/%s: no admin key: %s", sd.metadata.namespace, sd.metadata.name, error)
        key = None
    urls = {pod: address(sd, ip) for pod, ip in pods.items()}
    blocked = frozenset(pod for pod, url in urls.items() if not allowed(url, config.engine_networks))

    def client(pod: str) -> admin.AdminClient:
        return admin.AdminClient(urls[pod], key, config.admin_timeout_seconds)

    views = await engines.read(sorted(set(pods) - blocked), client)
    views += [machine.Pod(p, None, f"pod IP {pods[p]} is outside SLIPSTREAM_ENGINE_NETWORKS") for p in sorted(blocked)]
    views = sorted(
        (dataclasses.replace(p, error=memory.refusals[p.name]) if p.setting is not None and p.name in memory.refusals
         else p for p in views),
        key=lambda p: p.name,
    )  # fmt: skip
    return PodsRead(items, pods, blocked, views, client)


async def observe_step(deps: Deps, sd: models.ServingDeployment, fleet: models.EngineSetting,
                       voidable: models.RolloutStatus | None, now: float, memory: Memory,
                       ) -> tuple[snapshot_.WorkloadSnapshot | None, tuning.Recommendation | None, mixjump.Mix | None]:  # fmt: skip
    """Stages 1-2 of a step (`observe`), and the mix it saw: (snapshot, recommendation, mix).

    ``voidable`` is the rollout in flight when a queue-mix jump would void its canary
    (`machine.voidable`), else None. A jump voids it in this step (`machine.advance`), so
    the tuner then judges the new mix as if the rollout were over (`tuning.as_voided`), and
    a harder cap goes out in this same step rather than a poll later. While such a canary
    runs, each step is also a look for the mix watch (steps come every rollout poll, sooner
    than the mix polls, which watch it too: `until_mix_jump`); a step that sees the jump
    itself becomes the jump's step, judged again on the window since the jump."""
    tuned = tuning.as_voided(sd, voidable, now) if memory.jumped and voidable is not None else sd
    snap, recommendation = await observe(deps, tuned, fleet, now, memory.pools, bool(memory.jumped),
                                         memory.since(tuned, now), memory.backlog)  # fmt: skip
    mix = mixjump.mix_of(snap)
    if not memory.jumped and voidable is not None:
        before = memory.mix
        memory.mix, fired = memory.mix.see(mix)
        log_watch(sd, before, memory.mix, "step")
        if fired and mix is not None:
            memory.fired(mix, before, "voiding the canary")
            voided = tuning.as_voided(sd, voidable, now)
            snap, recommendation = await observe(deps, voided, fleet, now, memory.pools, True,
                                                 memory.since(voided, now), memory.backlog)  # fmt: skip
            mix = mixjump.mix_of(snap) or mix
    if snap is not None:
        memory.backlog = overload.remember(memory.backlog, overload.reading(snap), backlog_gap_s(sd, deps.config))
    return snap, recommendation, mix


def backlog_gap_s(sd: models.ServingDeployment, config: settings_.ControllerSettings) -> float:
    """The least time between two backlog readings (`tune.overload.remember`): an interval, less
    a step's jitter; the steps of a rollout (every few seconds) are not windows of their own."""
    return 0.9 * tuning.interval(sd, config)


async def step(deps: Deps, sd: models.ServingDeployment, memory: Memory) -> StepOutcome:
    """One observe -> tune -> rollout step of one ServingDeployment."""
    config, now = deps.config, deps.clock()
    fleet = memory.fleet or tuning.fleet_setting(sd)
    state = memory.rollout or sd.status.rollout
    voidable = machine.voidable(state, sd.spec.engine.chunked_prefill_size)
    snap, recommendation, mix = await observe_step(deps, sd, fleet, state if voidable else None, now, memory)
    if recommendation is not None:  # one line a step: what the tuner saw and why it moved or held
        log.info("%s/%s step: %s %s (%s)", sd.metadata.namespace, sd.metadata.name,
                 "move to" if recommendation.move else "hold on", machine.show(recommendation.setting),
                 recommendation.reason[:300])  # fmt: skip
    pol = tuning.policy(sd, config)
    read = await read_fleet(deps, sd, memory)
    views = read.views
    problem = tuning.engine_problem(sd, views)
    target = tuning.target(sd, recommendation, problem)
    # The machine's clock is read when the pods were read, not when the step began: the
    # observe stage (a twin run queued on the tuner pool) may have taken seconds, and a
    # phase's clock (the analysis window) must start when the pods reported, not before.
    now = deps.clock()
    verdict = None
    if state is not None and machine.analysis_due(state, pol, now):
        verdict = await analyse(deps, sd, state, read.pods, now)
    decision = machine.advance(state, fleet, target, views, pol, now, verdict, memory.moved if memory.jumped else "")
    # A step that judged nothing leaves the mix watch alone; one on a jump that did not move
    # (it held, or it voided a canary and its move needs a canary of its own: the canary
    # pods went back instead) is retried at the next poll (tune.mixjump).
    void_only = bool(memory.jumped) and voidable and decision.action == "RollBack"
    watch = memory.mix
    settled = recommendation is not None and ((recommendation.move and not void_only) or recommendation.other_way)
    memory.mix = memory.mix.stepped(mix, recommendation is not None and recommendation.judged, settled,
                                    bool(memory.jumped))  # fmt: skip
    log_watch(sd, watch, memory.mix, "step")
    started = decision.state.phase != "Idle" and (
        state is None or state.phase == "Idle" or decision.state.candidate != state.candidate)
    events = list(decision.events)
    if memory.jumped and not memory.jump_retry:
        events.append(machine.Event("Normal", "QueueMixChanged", memory.jumped))
    memory.jumped, memory.moved, memory.jump_retry = "", "", False
    if (event := await sync_configmap(deps, sd, decision.configmap)) is not None:
        events.append(event)
    if reachable := {p: s for p, s in decision.apply.items() if p not in read.blocked}:
        results = await engines.apply(reachable, read.client)
        memory.refusals = {p.name: p.error for p in results.values() if p.error}
        views = [results.get(p.name, p) for p in views]
        # Acknowledge what took (canaries verified, promotion complete) in this same step;
        # a step that would call the engines again waits for the next one (spaced retries).
        # Timed at the read-back: the analysis clock starts when every canary reports the
        # candidate, and a promotion or rollback finishes (the cooldown's start) then too.
        now = deps.clock()
        again = machine.advance(decision.state, decision.fleet, target, views, pol, now, verdict)
        if not again.apply:
            decision = again
            events += again.events
            if (event := await sync_configmap(deps, sd, decision.configmap)) is not None:
                events.append(event)
    patch = record(sd, memory, StepFindings(decision, views, snap, recommendation, problem, started, bool(read.items), now),
                   events)
    delay = config.rollout_poll_seconds if decision.in_flight else tuning.interval(sd, config)
    return StepOutcome(patch, events, delay, decision)


@dataclass(frozen=True)
class StepFindings:
    """What a step found and decided, for ``record``: the stages' outputs side by side."""

    decision: machine.RolloutDecision
    views: list[machine.Pod]
    """Every engine pod as read (and as the changes of this step left it)."""
    snap: snapshot_.WorkloadSnapshot | None
    recommendation: tuning.Recommendation | None
    problem: tuple[str, str] | None
    """(reason, message) of what keeps the engines from being tuned (`tuning.engine_problem`)."""
    started: bool
    """A rollout began in this step."""
    has_pods: bool
    now: float
    """When the pods reported last (the time the status is stamped with)."""


def record(sd: models.ServingDeployment, memory: Memory, findings: StepFindings, events: list[machine.Event]) -> dict[str, Any]:
    """Stage 7 of a step: the status patch (conditions merged with the ones this loop last
    wrote, so a patch that has not landed yet is not lost), the Events of conditions that
    turned bad and of a new recommendation (appended to ``events``), and the step's state
    kept in ``memory`` for the next."""
    decision, views, snap, recommendation, problem = (findings.decision, findings.views, findings.snap,
                                                      findings.recommendation, findings.problem)
    stamp = machine.stamp(findings.now)
    before = memory.conditions if memory.conditions is not None else list(sd.status.conditions)
    remembered = {c.type: c for c in before if c.type in tuning.CONDITIONS}
    current = [remembered.pop(c.type, c) for c in sd.status.conditions] + list(remembered.values())
    conds = tuning.conditions(sd, current, decision, views, snap, stamp, recommendation, problem)
    events += tuning.new_warnings(before, conds) + tuning.overload_events(before, conds)
    if (event := tuning.recommended_event(sd, decision.fleet, recommendation, problem)) is not None:
        events.append(event)
    patch = tuning.status_patch(sd, decision, conds, snap, recommendation, findings.started, stamp)
    if status.runs_nothing(conds, findings.has_pods):
        patch.update(status.no_setting())  # refused, no engines: nothing is applied
    memory.rollout, memory.fleet, memory.conditions = decision.state, decision.fleet, conds
    memory.pools = tuning.kv_pools(memory.pools, views)
    return patch


async def until_mix_jump(deps: Deps, current: Callable[[], models.ServingDeployment | None], memory: Memory,
                         delay: float) -> bool:  # fmt: skip
    """Wait out `delay` seconds, polling the queue mix every `mix_poll_seconds`; True as soon
    as it jumped from the mix the last step decided on (`tune.mixjump`): step now.

    Polls while no rollout is in flight, or while a canary runs that a jump would void
    (`rollout.machine.voidable`; other rollouts step every few seconds and take no new
    decision until they end), and in the modes that observe. `current` gives the deployment as it is now (None: an
    invalid spec); it is read at each poll and not held between them. A poll that fails or
    reads an invalid snapshot judges nothing (missing metrics never move the clock either)."""
    poll = tuning.scale(deps.config.mix_poll_seconds, deps.config)
    end = deps.clock() + delay
    first = True
    while (left := end - deps.clock()) > 0:
        rollout = memory.rollout
        in_flight = rollout is not None and rollout.phase != "Idle"
        if poll <= 0 or poll >= left or (in_flight and not voidable_now(current, rollout)):
            await deps.sleep(left)
            return False
        # The timer's step saw a jump and held on its long window: look again at once (once).
        await deps.sleep(0 if first and memory.mix.look_now else poll)
        first = False
        sd = current()
        if sd is None or not tuning.observes(sd):
            continue
        now = deps.clock()
        try:
            snap = await asyncio.wait_for(deps.observer.snapshot(sd, tuning.interval(sd, deps.config), now),
                                          timeout=2 * deps.config.prometheus_timeout_seconds)  # fmt: skip
        except Exception:  # the step reports failed reads; a poll only skips its judgement
            continue
        mix = mixjump.mix_of(snap)
        before = memory.mix
        memory.mix, fired = memory.mix.see(mix)
        log_watch(sd, before, memory.mix, "poll")
        log.debug("%s/%s mix poll: %s (distance %s from the decided mix)", sd.metadata.namespace, sd.metadata.name,
                  mixjump.describe(mix) if mix else "none",
                  f"{mixjump.distance(mix, before.decided):.2f}" if mix and before.decided else "-")  # fmt: skip
        if fired and mix is not None:
            memory.fired(mix, before, f"stepping now, {end - now:.0f} s before the timer")
            return True
    return False


def log_watch(sd: models.ServingDeployment, before: mixjump.MixWatch, after: mixjump.MixWatch, look: str) -> None:
    """One line when a look changed whether the mix watch may fire, or how close it is to
    firing (a jump seen once, a retry granted): rare, and what explains a jump that fired
    late or not at all (every poll's mix is a debug line)."""
    if (before.armed, before.seen, before.retries) == (after.armed, after.seen, after.retries):
        return
    reference = mixjump.describe(after.decided) if after.decided else "none"
    log.info("%s/%s mix watch after a %s: %s, %d look(s) at a jump, %d retry(ies); reference %s",
             sd.metadata.namespace, sd.metadata.name, look, "armed" if after.armed else "disarmed",
             after.seen, after.retries, reference)  # fmt: skip


def voidable_now(current: Callable[[], models.ServingDeployment | None],
                 rollout: models.RolloutStatus | None) -> bool:
    """Whether a jump would void the rollout in flight (the deployment read only then: a
    poll of an idle loop reads it once, after its sleep)."""
    sd = current()
    return sd is not None and machine.voidable(rollout, sd.spec.engine.chunked_prefill_size)


def jump_message(mix: mixjump.Mix, watch: mixjump.MixWatch, then: str) -> tuple[str, str]:
    """(the QueueMixChanged Event's message: which of `tune.mixjump`'s rules fired, from
    what mix to what, and what the loop does about it; the move alone, `from -> to`)."""
    decided = watch.decided
    assert decided is not None
    moved = f"{mixjump.describe(decided)} -> {mixjump.describe(mix)}"
    distance = mixjump.distance(mix, decided)
    why = f"the queue mix moved {distance:.2f} from the one the last step decided on"
    if distance >= mixjump.ENTER:
        why += f" (at least {mixjump.ENTER:g})"
    else:  # the other rule: prompts larger than the references held
        share = mixjump.larger(mix, decided, max(watch.tops, default=-1))
        why += (f", and prompts larger than it held carry {share:.0%} of the work (at least "
                f"{mixjump.NEW_SHARE:.0%})")  # fmt: skip
    return f"{why}: {moved}; {then}", moved
