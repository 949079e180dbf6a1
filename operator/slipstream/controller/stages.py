"""The loop's stages wired to the real packages: `slipstream.observe` and `slipstream.tune`.

- `FleetObserver`: one `observe.Observer` per (Prometheus URL, window); each read covers
  every deployment that uses that Prometheus with that window, so the number of queries
  per interval does not grow with the number of deployments. Deployments on the same
  Prometheus share a read (one in flight per URL and window, run in a worker thread and
  bounded by a timeout); one on another Prometheus is never held up by it.
- `TwinRecommender`: `tune.tuner.tune_once` (gate, twin-backed recommendation,
  guardrails) with the deployment's spec, its tuner state from status, and the time scale.
- `ObserveLatency`: the canary analysis' per-tenant p99 TTFT of some pods over a window
  ending at any time, with observe's query and assembly.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import prometheus_client

from slipstream.api import models, snapshot
from slipstream.controller import settings as settings_
from slipstream.controller import tuning
from slipstream.observe import assemble, queries
from slipstream.observe.observer import Observer, ObserveSettings
from slipstream.rollout import machine
from slipstream.sim import policies, profiles
from slipstream.tune import candidates, guardrails
from slipstream.tune import memo as memo_
from slipstream.tune import tuner as tuner_

TUNER_SECONDS = prometheus_client.Histogram(
    "slipstream_tuner_seconds", "Wall time of one tuner run (gate, twin, guardrails) of one deployment.",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TUNER_CPU_SECONDS = prometheus_client.Counter(
    "slipstream_tuner_cpu_seconds", "CPU seconds of the tuner runs (their worker thread's own time)."
)


def prometheus_url(sd: models.ServingDeployment, config: settings_.ControllerSettings) -> str | None:
    """Where this deployment's metrics are read: the operator's override, else the spec's."""
    return config.prometheus_url or sd.spec.prometheus.url


@dataclass
class FleetObserver:
    """`loop.Observer` over `observe.Observer`, shared by every deployment's loop."""

    config: settings_.ControllerSettings
    observers: dict[tuple[str, float], Observer] = field(default_factory=dict)
    members: dict[tuple[str, float], set[str]] = field(default_factory=dict)
    cache: dict[tuple[str, float], tuple[float, dict[str, snapshot.WorkloadSnapshot]]] = field(default_factory=dict)
    locks: dict[tuple[str, float], asyncio.Lock] = field(default_factory=dict)

    def observer(self, key: tuple[str, float]) -> Observer:
        if key not in self.observers:
            self.observers[key] = Observer(key[0], ObserveSettings(
                window_s=key[1], min_samples=self.config.observe_min_samples,
                max_staleness_s=self.config.observe_max_staleness_seconds,
                query_timeout_s=self.config.prometheus_timeout_seconds,
                # The backoff is about one control interval: scaled as the intervals are, so
                # a time-scaled loop (tests, the demo) backs off in its own seconds too.
                backoff_initial_s=tuning.scale(ObserveSettings().backoff_initial_s, self.config),
                backoff_max_s=tuning.scale(ObserveSettings().backoff_max_s, self.config),
            ))  # fmt: skip
        return self.observers[key]

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float) -> snapshot.WorkloadSnapshot:
        name = f"{sd.metadata.namespace}/{sd.metadata.name}"
        url = prometheus_url(sd, self.config)
        if url is None:
            return snapshot.invalid(name, now, window_s, snapshot.UNREACHABLE, "no Prometheus URL (spec.prometheus.url)")
        key = (url, round(window_s, 3))
        members = self.members.setdefault(key, set())
        members.add(name)
        async with self.locks.setdefault(key, asyncio.Lock()):
            taken, snaps = self.cache.get(key, (-math.inf, {}))
            # A read younger than half the window serves every member's step of this interval.
            if name not in snaps or now - taken >= window_s / 2:
                snaps = await asyncio.to_thread(self.observer(key).read, sorted(members))
                self.cache[key] = (now, snaps)
        return snaps.get(name) or snapshot.invalid(name, now, window_s, snapshot.NO_SERIES, "not in the fleet's read")

    def latency(self, sd: models.ServingDeployment) -> ObserveLatency:
        """Where the canary figures of `sd` are read (its Prometheus, the fleet's client)."""
        url = prometheus_url(sd, self.config) or "http://prometheus.invalid:9090"
        return ObserveLatency(self.observer((url, tuning.interval(sd, self.config))), self.config.canary_min_samples)

    def forget(self, namespace: str, name_: str) -> None:
        """A deployment whose loop ended leaves the fleet's reads."""
        name = f"{namespace}/{name_}"
        for members in self.members.values():
            members.discard(name)


def engine_setting(s: policies.Setting) -> models.EngineSetting:
    return models.EngineSetting.model_validate({"threshold": s.threshold, "mode": s.mode, "schedulePolicy": s.order})


def twin_setting(s: models.EngineSetting) -> policies.Setting:
    return policies.Setting(s.threshold, s.mode, s.schedule_policy)


@dataclass
class TwinRecommender:
    """`loop.Recommender` over `tune.tuner.tune_once` (pure, CPU-bound: called in a thread)."""

    config: settings_.ControllerSettings
    profile: profiles.Profile | None = None
    memo: memo_.Memo | None = None
    """Each deployment's last twin run, reused while its workload has not moved."""

    def __post_init__(self) -> None:
        reuse = tuning.scale(self.config.tuner_reuse_seconds, self.config)
        if self.memo is None and reuse > 0:
            self.memo = memo_.Memo(max_age_s=reuse)

    def recommend(
        self, sd: models.ServingDeployment, snap: snapshot.WorkloadSnapshot, fleet: models.EngineSetting, now: float
    ) -> tuning.Recommendation:
        cpu0 = time.thread_time()
        with TUNER_SECONDS.time():
            try:
                return self._recommend(sd, snap, fleet, now)
            finally:
                TUNER_CPU_SECONDS.inc(time.thread_time() - cpu0)

    def _recommend(
        self, sd: models.ServingDeployment, snap: snapshot.WorkloadSnapshot, fleet: models.EngineSetting, now: float
    ) -> tuning.Recommendation:
        profile = self.profile = self.profile or profiles.load(self.config.twin_profile)
        rollout = sd.status.rollout
        last = sd.status.last_decision
        state = guardrails.TunerState(
            current=twin_setting(fleet),
            last_step_at=machine.seconds(last.time) if last is not None else None,
            rollout_in_progress=rollout is not None and rollout.phase != "Idle",
        )
        settings = tuner_.TunerSettings(
            spec=candidates.from_spec(sd.spec),
            guardrails=guardrails.GuardrailSettings(
                min_samples=self.config.observe_min_samples,
                cooldown_s=tuning.scale(sd.spec.tuning.cooldown_seconds, self.config),
                interval_s=tuning.interval(sd, self.config) * 0.9,  # a step's jitter is not an interval
            ),
        )
        decision = tuner_.tune_once(snap, state, settings, profile, None, now, self.memo)
        rec = decision.recommendation
        mix = rec.heterogeneity if rec is not None else None
        if isinstance(decision, guardrails.Move):
            return tuning.Recommendation(engine_setting(decision.to), True, decision.reason, mix)
        best = engine_setting(rec.best.setting) if rec is not None else fleet
        return tuning.Recommendation(best, False, f"{decision.reason}: {decision.message}", mix)


@dataclass
class ObserveLatency:
    """`rollout.analysis.PodLatency` with observe's pod-subset query, at any end time."""

    observer: Observer
    min_samples: int

    def _p99(self, namespace: str, deployment: str, pods: Sequence[str], start_s: float, end_s: float) -> dict[str, float]:
        window = max(1.0, end_s - start_s)
        promql = queries.pods_ttft(namespace, deployment, pods, window)
        samples = self.observer.client.query(promql, end_s)
        got = assemble.pod_group(samples, name=f"{namespace}/{deployment}", now=end_s, window_s=window,
                                 min_samples=self.min_samples)  # fmt: skip
        if not got.valid:
            raise RuntimeError(f"{got.invalid}: {got.detail}")
        return {t.name: t.ttft_p99_s for t in got.tenants if math.isfinite(t.ttft_p99_s)}

    async def tenant_p99(
        self, namespace: str, deployment: str, pods: Sequence[str], start_s: float, end_s: float
    ) -> dict[str, float]:
        return await asyncio.to_thread(self._p99, namespace, deployment, pods, start_s, end_s)
