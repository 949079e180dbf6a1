"""The tuner's two clocks (issue 16, item 5).

- The cooldown runs from the promotion or the rollback, not from the decision (pure: status
  in, the guardrails' gate out).
- The canary analysis window starts when every canary reports the candidate, read back
  from its admin API, not when the step that switched it began (a twin run on the tuner
  pool may take seconds before the canary is set): one `controller.loop.step` over real
  HTTP, an engine's admin API on loopback, the Kubernetes API in memory (`loop_helpers`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from loop_helpers import Engine, Key, PodsAndConfigMaps

from slipstream.api import buckets, models, snapshot
from slipstream.controller import loop, stages, tuning
from slipstream.controller import settings as settings_
from slipstream.rollout import machine
from slipstream.tune import deployment, guardrails


def busy(now: float) -> snapshot.WorkloadSnapshot:
    """A valid window of 600 first tokens."""
    chat = snapshot.TenantWindow(
        "chat",
        10.0,
        snapshot.histogram_of([0.3] * 600, buckets.TTFT_BOUNDS_S),
        snapshot.histogram_of([2000.0] * 600, buckets.PROMPT_TOKENS),
    )
    return snapshot.WorkloadSnapshot("prod/kimi", now, 60.0, (chat,))


OFF = models.EngineSetting(threshold=0)


def sd(status: dict[str, Any] | None = None, **spec: Any) -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
        "spec": {"replicas": 2, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, **spec},
                 "tuning": {"mode": "Auto", "threshold": 0, "cooldownSeconds": 600, "intervalSeconds": 60},
                 "prometheus": {"url": "http://127.0.0.1:9090"}},
        "status": status or {},
    })  # fmt: skip


DECIDED = {"time": "1970-01-01T02:45:00Z", "to": {"threshold": 2048}, "reason": "r"}  # 9900 s


def finished(result: str, at: str) -> dict[str, Any]:
    return {
        "lastDecision": DECIDED,
        "rollout": {
            "phase": "Idle",
            "result": result,
            "finishedAt": at,
            "candidate": {"threshold": 2048},
        },
    }


def test_the_cooldown_runs_from_the_promotion_or_rollback_not_the_decision() -> None:
    # Decided at 9900 s, promoted (or rolled back) at 10_300 s after the canary's analysis.
    for result in ("Promoted", "RolledBack"):
        status = models.ServingDeploymentStatus.model_validate(
            finished(result, "1970-01-01T02:51:40Z")
        )
        assert deployment.last_step_at(status) == 10_300.0
        state = deployment.tuner_state(sd(finished(result, "1970-01-01T02:51:40Z")), OFF)
        guard = guardrails.GuardrailSettings(cooldown_s=600, interval_s=60)
        # 600 s after the decision, 200 s after the promotion: still cooling down.
        held = guardrails.gate(busy(10_500.0), state, guard, 10_500.0)
        assert (
            held is not None and held.reason == guardrails.COOLDOWN and "200 s ago" in held.message
        )
        assert guardrails.gate(busy(10_900.0), state, guard, 10_900.0) is None
    # The operator's stage reads the same state from status.
    config = settings_.ControllerSettings()
    state, _, _ = stages.TwinRecommender(config)._inputs(
        sd(finished("Promoted", "1970-01-01T02:51:40Z")), OFF
    )
    assert state.last_step_at == 10_300.0
    # No finished rollout (in flight, or one that ended before this decision): the decision's time.
    assert (
        deployment.last_step_at(
            models.ServingDeploymentStatus.model_validate({"lastDecision": DECIDED})
        )
        == 9900.0
    )
    older = finished("Promoted", "1970-01-01T02:00:00Z")
    assert deployment.last_step_at(models.ServingDeploymentStatus.model_validate(older)) == 9900.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Observer:
    async def snapshot(
        self, sd: models.ServingDeployment, window_s: float, now: float, min_samples: int | None = None
    ) -> snapshot.WorkloadSnapshot:
        return busy(now)


class SlowTwin:
    """A recommender whose twin run takes ``seconds`` of the clock and moves to T 2048."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def without_twin(self, *args: Any) -> tuning.Recommendation | None:
        return None

    def recommend(
        self, sd: models.ServingDeployment, snap: Any, fleet: Any, now: float, jumped: bool = False
    ) -> tuning.Recommendation:
        self.clock.t += self.seconds
        return tuning.Recommendation(
            models.EngineSetting(threshold=2048, schedule_policy="srpt"), True, "gain"
        )


def test_the_analysis_clock_starts_when_the_canary_reports_the_candidate() -> None:
    async def run() -> models.RolloutStatus:
        engine = Engine()
        port = int((await engine.start()).rsplit(":", 1)[1])
        try:
            clock = Clock(100_000.0)
            deps = loop.Deps(
                kube=PodsAndConfigMaps(port),
                config=settings_.ControllerSettings(engine_networks="127.0.0.0/8"),  # type: ignore[arg-type]
                keys=Key(),
                observer=Observer(),
                recommender=SlowTwin(clock, 7.0),
                clock=clock,
            )  # type: ignore[arg-type]
            outcome = await loop.step(deps, sd(port=port), loop.Memory())
            return models.RolloutStatus.model_validate(outcome.patch["rollout"])
        finally:
            await engine.runner.cleanup()

    rollout = asyncio.run(run())
    # The one pod is the canary; it took the candidate in this same step.
    assert rollout.phase == "Analysis", json.dumps(rollout.to_k8s())
    # The twin ran 7 s; the canary reported after that, and the window counts from then.
    assert machine.seconds(rollout.started_at) == 100_007.0
