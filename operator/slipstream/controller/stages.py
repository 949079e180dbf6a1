"""The loop's stages wired to the real packages: `slipstream.observe` and `slipstream.tune`.

- `fleet_observer`: observe's `FleetObserver` (one read per Prometheus, window and tenant
  label serves every deployment on it, so the query count does not grow with the number
  of deployments; reads on worker threads, one lock per key: a deployment on another
  Prometheus is never held up).
- `TwinRecommender`: `tune.tuner` (gate, twin-backed recommendation or a reused one,
  guardrails) with the deployment's spec, its engine's C, page size and KV pool (the
  smallest the pods report: `tune.deployment.engine_config`), its tuner state from status,
  and the time scale.
- `ObserveLatency`: the canary analysis' per-tenant p99 TTFT of some pods over a window
  ending at any time, with observe's query and assembly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import prometheus_client

from slipstream.api import buckets, models, snapshot
from slipstream.controller import settings as settings_
from slipstream.controller import tuning
from slipstream.controller.clients import kube as kube_
from slipstream.engine import metrics
from slipstream.observe import assemble, parse, queries
from slipstream.observe import fleet as fleet_
from slipstream.observe.observer import Observer, ObserveSettings
from slipstream.rollout import sequential
from slipstream.sim import policies, profiles
from slipstream.tune import candidates, codec, guardrails, modelcheck
from slipstream.tune import deployment as tune_deployment
from slipstream.tune import memo as memo_
from slipstream.tune import recommend as recommend_
from slipstream.tune import tuner as tuner_

log = logging.getLogger(__name__)

TUNER_SECONDS = prometheus_client.Histogram(
    "slipstream_tuner_seconds", "Wall time of one twin run (a recommendation computed on the tuner pool: the "
    "twin's candidates, then the guardrails) of one deployment; reuses and holds are not counted.",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TUNER_CPU_SECONDS = prometheus_client.Counter(
    "slipstream_tuner_cpu_seconds", "CPU seconds of the twin runs (their tuner pool thread's own time)."
)
PREDICTION_ERROR = prometheus_client.Gauge(
    "slipstream_twin_prediction_error_ratio", "The twin's p99 TTFT over the observed one, per tenant, for the "
    "last window replayed under the running setting (tune/modelcheck.py; 1 is exact; outside the band the tuner "
    "holds ModelMismatch).", ["namespace", "deployment", "tenant"],
)
HETEROGENEITY = prometheus_client.Gauge(
    "slipstream_heterogeneity", "The heterogeneity of the last window's queue mix that the tuner decided on "
    "(tune/heterogeneity.py; 0 is uniform traffic).", ["namespace", "deployment"],
)
DECISIONS = prometheus_client.Counter(
    "slipstream_tuner_decisions", "Tuner decisions by outcome (Move, Hold, Infeasible) and, for holds and "
    "infeasible ones, their reason (a condition-style word: ModelMismatch, Cooldown, AtBest, ...); a move's "
    "reason is a sentence and is counted as Move.", ["outcome", "reason"],
)
TUNER_REUSES = prometheus_client.Counter(
    "slipstream_tuner_reuses", "Recommendations reused without a twin run (the deployment's workload had not "
    "moved since its last run, tune/memo.py), judged by the guardrails on the event loop."
)


@dataclass
class PrometheusTokens:
    """Bearer tokens of the deployments' Prometheus (spec.prometheus.bearerTokenSecretRef).

    `refresh` reads a deployment's token Secret on a worker thread before its observe step;
    the fleet observer then takes it from here without blocking the event loop. A token
    that cannot be read is None: the query goes without and fails as Prometheus answers
    (PrometheusUnreachable, HTTP 401), never as zero traffic.
    """

    kube: kube_.Kube
    tokens: dict[str, str | None] = field(default_factory=dict)

    async def refresh(self, sd: models.ServingDeployment) -> None:
        ref = sd.spec.prometheus.bearer_token_secret_ref
        key = f"{sd.metadata.namespace}/{sd.metadata.name}"
        if ref is None:
            self.tokens.pop(key, None)
            return
        try:
            self.tokens[key] = await asyncio.to_thread(self.kube.secret_value, sd.metadata.namespace, ref.name, ref.key)
        except kube_.ApiError:
            self.tokens[key] = None

    def __call__(self, sd: models.ServingDeployment) -> str | None:
        return self.tokens.get(f"{sd.metadata.namespace}/{sd.metadata.name}")


def fleet_observer(config: settings_.ControllerSettings, tokens: PrometheusTokens | None = None) -> fleet_.FleetObserver:
    """observe's fleet reads with the operator's settings (`loop.SnapshotSource`)."""
    return fleet_.FleetObserver(ObserveSettings(
        min_samples=config.observe_min_samples,
        max_staleness_s=config.observe_max_staleness_seconds,
        query_timeout_s=config.prometheus_timeout_seconds,
        # Every worker thread may be reading one deployment's canary figures at once.
        connections=config.worker_threads,
        # The backoff is about one control interval: scaled as the intervals are, so a
        # time-scaled loop (tests, the demo) backs off in its own seconds too.
        backoff_initial_s=tuning.scale(ObserveSettings().backoff_initial_s, config),
        backoff_max_s=tuning.scale(ObserveSettings().backoff_max_s, config),
    ), reuse_s=fleet_reuse_s(config), token_for=tokens)  # fmt: skip


FLEET_REUSE_S = 5.0
"""Seconds a fleet read answers later steps and mix polls (``FleetObserver.reuse_s``): a
fraction of a 60 s interval, and half a 10 s mix poll."""


def fleet_reuse_s(config: settings_.ControllerSettings) -> float:
    """`FLEET_REUSE_S`, scaled as the intervals and polls are: unscaled, a time x8 stack
    reused one read for 40 of its seconds, four mix polls, and a queue-mix jump showed up
    to 40 s late."""
    return tuning.scale(FLEET_REUSE_S, config)


def latency_for(
    fleet: fleet_.FleetObserver, config: settings_.ControllerSettings, tokens: PrometheusTokens | None = None
) -> Callable[[models.ServingDeployment], ObserveLatency]:
    """Where each deployment's canary figures are read: its Prometheus, through the fleet's
    Observer of the same key (one client and backoff per Prometheus and window)."""

    def latency(sd: models.ServingDeployment) -> ObserveLatency:
        url = sd.spec.prometheus.url or "http://prometheus.invalid:9090"
        label = sd.spec.tuning.objective.tenant_label
        token = (tokens(sd) if tokens is not None else None) or ""
        return ObserveLatency(fleet.observer(url, float(tuning.interval(sd, config)), label, token),
                              config.canary_min_samples, label)  # fmt: skip

    return latency


engine_setting = tune_deployment.engine_setting
twin_setting = tune_deployment.setting_of


def in_engine_time(snap: snapshot.WorkloadSnapshot, scale: float) -> snapshot.WorkloadSnapshot:
    """The snapshot on the engines' clock: rates / scale, window x scale (pure).

    Prometheus rates count per wall second; engine simulators run ``scale`` engine seconds
    per wall second and report TTFT in engine seconds. The twin runs in engine seconds, so
    its traffic must too. ``scale`` 1 (real engines) returns the snapshot unchanged.
    """
    if scale == 1.0:
        return snap
    tenants = tuple(replace(t, requests_per_s=t.requests_per_s / scale) for t in snap.tenants)
    mixes = tuple(replace(m, arrivals_per_s=m.arrivals_per_s / scale) for m in snap.queue_mix)
    return replace(snap, tenants=tenants, queue_mix=mixes, window_s=snap.window_s * scale)


@dataclass
class TwinRecommender:
    """`loop.Recommender` over `tune.tuner` (pure): `without_twin` (cheap: the guardrails'
    gate, a reused run) on the event loop, `recommend` (a twin run, CPU-bound) on a thread
    of the tuner pool. Split so that a deployment whose workload has not moved never waits
    behind other deployments' twin runs for a pool thread."""

    config: settings_.ControllerSettings
    profile: profiles.Profile | None = None
    memo: memo_.Memo | None = None
    """Each deployment's last twin run, reused while its workload has not moved; read on
    the event loop, written from the pool's threads (`tune.memo.Memo.lock`)."""

    def __post_init__(self) -> None:
        reuse = tuning.scale(self.config.tuner_reuse_seconds, self.config)
        if self.memo is None and reuse > 0:
            self.memo = memo_.Memo(max_age_s=reuse)

    def without_twin(
        self, sd: models.ServingDeployment, snap: snapshot.WorkloadSnapshot, fleet: models.EngineSetting, now: float,
        jumped: bool = False,
    ) -> tuning.Recommendation | None:
        """The recommendation when it needs no twin run (`tune.tuner.without_twin`: a
        guardrail holds, or the memo's run for this workload is reused); None: call
        `recommend`. The profile is loaded by the first twin run, never here (file I/O):
        until then, and without a memo, only the guardrails' gate is checked."""
        state, settings, config = self._inputs(sd, fleet, snap.kv_pools, jumped, snap.overload)
        engine_snap = in_engine_time(snap, self.config.engine_time_scale)
        decision = tuner_.without_twin(engine_snap, state, settings, self.profile, config, now, self.memo)
        if decision is None:
            return None
        if decision.recommendation is not None:  # a reused run (a gate's Hold carries none)
            TUNER_REUSES.inc()
        return self._summary(decision, fleet, sd, snap, self._mix(engine_snap, settings))

    def recommend(
        self, sd: models.ServingDeployment, snap: snapshot.WorkloadSnapshot, fleet: models.EngineSetting, now: float,
        jumped: bool = False,
    ) -> tuning.Recommendation:
        """The recommendation with a fresh twin run (`tune.tuner.with_twin`), stored in the
        memo; the loop calls it on the tuner pool when `without_twin` returned None."""
        cpu0 = time.thread_time()
        with TUNER_SECONDS.time():
            try:
                profile = self.profile = self.profile or profiles.load(self.config.twin_profile)
                state, settings, config = self._inputs(sd, fleet, snap.kv_pools, jumped, snap.overload)
                engine_snap = in_engine_time(snap, self.config.engine_time_scale)
                decision = tuner_.with_twin(engine_snap, state, settings, profile, config, now, self.memo)
                if not isinstance(decision, guardrails.Move) and decision.reason == modelcheck.MODEL_MISMATCH:
                    log_mismatch(sd, engine_snap, state.current, decision.message, self.config.twin_profile)
                return self._summary(decision, fleet, sd, snap, self._mix(engine_snap, settings))
            finally:
                TUNER_CPU_SECONDS.inc(time.thread_time() - cpu0)

    def _mix(self, snap: snapshot.WorkloadSnapshot, settings: tuner_.TunerSettings) -> float:
        """The window's heterogeneity, for every step (a gate's Hold too: status.mixedAt)."""
        return recommend_.window_heterogeneity(snap, self.profile, settings.spec.chunked_prefill_size)

    def _inputs(
        self, sd: models.ServingDeployment, fleet: models.EngineSetting, pools: Sequence[snapshot.PodPool] = (),
        jumped: bool = False, overload: str = "",
    ) -> tuple[guardrails.TunerState, tuner_.TunerSettings, policies.EngineConfig | None]:
        """The tuner's state (from status; ``jumped``: the queue mix brought this step
        forward), settings (from the spec) and engine config (the spec's, with the pods' KV
        pools the loop put in the snapshot)."""
        rollout = sd.status.rollout
        state = guardrails.TunerState(
            current=twin_setting(fleet),
            last_step_at=tune_deployment.last_step_at(sd.status),  # cooldown from promotion/rollback
            rollout_in_progress=rollout is not None and rollout.phase != "Idle",
            left=tune_deployment.left_of(sd.status),
            mixed_at=tune_deployment.unix_seconds(sd.status.mixed_at),
            mix_jumped=jumped,
            overloaded=overload,
        )
        settings = tuner_.TunerSettings(
            spec=candidates.from_spec(sd.spec),
            guardrails=guardrails.GuardrailSettings(
                min_samples=self.config.observe_min_samples,
                cooldown_s=tuning.scale(sd.spec.tuning.cooldown_seconds, self.config),
                interval_s=tuning.interval(sd, self.config) * 0.9,  # a step's jitter is not an interval
                dwell_cooldowns=self.config.tuner_dwell_cooldowns,
            ),
        )
        return state, settings, tune_deployment.engine_config(sd.spec, pools)

    @staticmethod
    def _summary(decision: guardrails.Decision, fleet: models.EngineSetting,
                 sd: models.ServingDeployment | None = None, snap: snapshot.WorkloadSnapshot | None = None,
                 window_mix: float | None = None) -> tuning.Recommendation:  # fmt: skip
        rec = decision.recommendation
        # Said with every twin-backed reason: the pool its candidates ran with was not the
        # engines' own (a pod reported none usable), so a reader knows what it rests on.
        pool = tune_deployment.twin_pool(snap.kv_pools).note if snap is not None and rec is not None else ""
        mix = rec.heterogeneity if rec is not None else window_mix
        mix = mix if mix is not None and math.isfinite(mix) else None
        model = rec.model if rec is not None else None
        prediction = tuple((t.name, t.predicted_s, t.observed_s) for t in model.tenants) if model is not None else ()
        if sd is not None:
            for name, predicted, observed in prediction:
                PREDICTION_ERROR.labels(sd.metadata.namespace, sd.metadata.name, name).set(
                    max(predicted, 1e-3) / observed)
        if sd is not None and mix is not None:
            HETEROGENEITY.labels(sd.metadata.namespace, sd.metadata.name).set(mix)
        outcome = type(decision).__name__
        DECISIONS.labels(outcome, outcome if isinstance(decision, guardrails.Move) else decision.reason).inc()
        if isinstance(decision, guardrails.Move):
            return tuning.Recommendation(engine_setting(decision.to), True, with_note(decision.reason, pool), mix,
                                         prediction, gain=rec.sure_gain if rec is not None else 0.0)  # fmt: skip
        mismatch = decision.message if decision.reason == modelcheck.MODEL_MISMATCH else ""
        best = engine_setting(rec.best.setting) if rec is not None else fleet
        other_way = sd is not None and guardrails.other_way(decision, sd.spec.engine.chunked_prefill_size)
        return tuning.Recommendation(best, False, with_note(f"{decision.reason}: {decision.message}", pool), mix,
                                     prediction, mismatch, judged=rec is not None, other_way=other_way)  # fmt: skip


def log_mismatch(sd: models.ServingDeployment, snap: snapshot.WorkloadSnapshot, current: policies.Setting,
                 message: str, profile: str) -> None:
    """One INFO line with the window the twin could not explain, as the twin read it (engine
    time) and as `slipstream recommend --snapshot` reads it: whoever looks into a
    `ModelMismatch` can replay the check offline on the same numbers. Metrics only: the
    snapshot holds no credential. ``profile`` is the twin's cost profile, named in the
    command so that the replay runs the same cost model."""
    log.info("%s/%s: %s. To replay the check, save the JSON after this sentence as FILE.json and run "
             "`slipstream recommend --snapshot FILE.json --current %s --chunked-prefill-size %d --profile %s`: %s",
             sd.metadata.namespace, sd.metadata.name, message, recommend_.policy_name(current),
             sd.spec.engine.chunked_prefill_size, profile, json.dumps(codec.to_dict(snap), separators=(",", ":")))


def with_note(reason: str, note: str) -> str:
    """A reason with a note after it ("; note"), or as it is without one."""
    return f"{reason}; {note}" if note else reason


@dataclass
class ObserveLatency:
    """`rollout.analysis.PodLatency` with observe's pod-subset query, at any end time."""

    observer: Observer
    min_samples: int
    tenant_label: str = queries.TENANT_LABEL

    def _p99(self, namespace: str, deployment: str, pods: Sequence[str], start_s: float, end_s: float) -> dict[str, float]:
        window = max(1.0, end_s - start_s)
        promql = queries.pods_ttft(namespace, deployment, pods, window, self.tenant_label)
        samples = self.observer.client.query(promql, end_s)
        got = assemble.pod_group(samples, name=f"{namespace}/{deployment}", now=end_s, window_s=window,
                                 min_samples=self.min_samples, tenant_label=self.tenant_label)  # fmt: skip
        if not got.valid:
            raise RuntimeError(f"{got.invalid}: {got.detail}")
        return {t.name: t.ttft_p99_s for t in got.tenants if math.isfinite(t.ttft_p99_s)}

    async def tenant_p99(
        self, namespace: str, deployment: str, pods: Sequence[str], start_s: float, end_s: float
    ) -> dict[str, float]:
        return await asyncio.to_thread(self._p99, namespace, deployment, pods, start_s, end_s)

    def _sub_windows(self, namespace: str, deployment: str, canaries: Sequence[str], baseline: Sequence[str],
                     start_s: float, end_s: float, sub_s: float) -> list[sequential.SubWindow]:  # fmt: skip
        ends = [start_s + (k + 1) * sub_s for k in range(int((end_s - start_s) // sub_s))]
        if not ends:
            return []
        promql = queries.size_class_windows(namespace, deployment, {"canary": canaries, "baseline": baseline},
                                            [end_s - e for e in ends], sub_s, self.tenant_label)  # fmt: skip
        return size_class_cells(self.observer.client.query(promql, end_s), ends, sub_s, self.tenant_label)

    async def sub_windows(
        self, namespace: str, deployment: str, canaries: Sequence[str], baseline: Sequence[str],
        start_s: float, end_s: float, sub_window_s: float,
    ) -> list[sequential.SubWindow]:
        return await asyncio.to_thread(self._sub_windows, namespace, deployment, canaries, baseline,
                                       start_s, end_s, sub_window_s)  # fmt: skip

    def _exports(self, namespace: str, deployment: str, pods: Sequence[str], end_s: float, lookback_s: float) -> bool:
        promql = queries.size_class_exported(namespace, deployment, pods, lookback_s)
        return any(math.isfinite(s.value) and s.value > 0 for s in self.observer.client.query(promql, end_s))

    async def exports_size_classes(
        self, namespace: str, deployment: str, pods: Sequence[str], end_s: float, lookback_s: float,
    ) -> bool:
        return await asyncio.to_thread(self._exports, namespace, deployment, pods, end_s, lookback_s)


def size_class_cells(samples: Sequence[parse.Sample], ends: Sequence[float], sub_s: float,
                     tenant_label: str = queries.TENANT_LABEL) -> list[sequential.SubWindow]:  # fmt: skip
    """`queries.size_class_windows`' answer as sub-windows. A series with no tenant, a size
    class outside `buckets.SIZE_CLASS_NAMES`, a non-finite value or no ``_count`` is left
    out: a missing cell is no observation (the rule then says Continue), never a guess. A
    sub-window no valid series answered for is unscraped (`SubWindow.scraped`): a gap in
    Prometheus' samples, which moves the analysis limit out, not an idle spell (an idle
    series answers a zero increase)."""
    parts: dict[tuple[str, int, sequential.Cell], dict[str, float]] = {}
    answered: set[int] = set()
    for sample in samples:
        side, _, rest = sample.label(queries.PART_LABEL).partition("/")
        index, _, part = rest.partition("/")
        tenant, cls = sample.label(tenant_label), sample.label(metrics.SIZE_CLASS_LABEL)
        if not (tenant and cls in buckets.SIZE_CLASS_NAMES and index.isdigit() and math.isfinite(sample.value)):
            continue
        parts.setdefault((side, int(index), (tenant, cls)), {})[part] = sample.value
        answered.add(int(index))
    sides: dict[str, list[dict[sequential.Cell, sequential.CellHistogram]]] = {
        "canary": [{} for _ in ends], "baseline": [{} for _ in ends]}
    for (side, k, cell), got in parts.items():
        if side in sides and k < len(ends) and got.get("count", 0.0) > 0 and "sum" in got:
            sides[side][k][cell] = sequential.CellHistogram(got["count"], got["sum"])
    return [sequential.SubWindow(end - sub_s, end, sides["canary"][k], sides["baseline"][k], k in answered)
            for k, end in enumerate(ends)]  # fmt: skip
