"""Overload is named (tune/overload.py): `controller.loop.step` over real HTTP (an engine's
admin API on loopback, the Kubernetes API in memory: `loop_helpers`), one step per interval
on an injected clock. While the waiting queue grows window after window at the same served
rate, `Overloaded` turns True with one Warning Event (not one per interval) and the tuner is
told (the snapshot it is given says why); when the queue drains the condition clears, with
no Event."""

from __future__ import annotations

import asyncio
from typing import Any

from loop_helpers import Engine, Key, PodsAndConfigMaps

from slipstream.api import buckets, models, snapshot
from slipstream.controller import loop, tuning
from slipstream.controller import settings as settings_

T0 = 100_000.0


def window(now: float, backlog: float) -> snapshot.WorkloadSnapshot:
    """A valid 60 s window: 60 documents of 20K tokens served (20,000 tokens/s), ``backlog``
    tokens waiting."""
    classes = {name: snapshot.SizeClassWindow(name) for name in buckets.SIZE_CLASS_NAMES}
    classes["le60k"] = snapshot.SizeClassWindow("le60k", 60.0, 1_200_000.0, 0.0, backlog / 20_000.0, backlog)
    ttft = snapshot.histogram_of([1.0] * 60, buckets.TTFT_BOUNDS_S)
    docs = snapshot.TenantWindow("docs", 1.0, ttft, snapshot.histogram_of([20_000.0] * 60, buckets.PROMPT_TOKENS))
    return snapshot.WorkloadSnapshot("prod/kimi", now, 60.0, (docs,), queue_mix=(snapshot.TenantMix(
        "docs", 1.0, tuple(classes.values())),))  # fmt: skip


class Backlog:
    """Prometheus: the waiting queue at each step, in order."""

    def __init__(self, backlogs: list[float]) -> None:
        self.backlogs = backlogs
        self.step = 0

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snapshot.WorkloadSnapshot:
        return window(now, self.backlogs[self.step])


class Told:
    """A recommender that holds and keeps what each step's snapshot said of an overload."""

    def __init__(self) -> None:
        self.overload: list[str] = []

    def without_twin(self, sd: Any, snap: snapshot.WorkloadSnapshot, fleet: models.EngineSetting, now: float,
                     jumped: bool = False) -> tuning.Recommendation:
        self.overload.append(snap.overload)
        return tuning.Recommendation(fleet, False, "AtBest: hold")

    def recommend(self, *args: Any) -> tuning.Recommendation:
        raise AssertionError("no twin run expected")


def test_a_growing_backlog_is_named_once_and_clears_when_it_drains() -> None:
    backlogs = [100e3, 200e3, 400e3, 800e3, 1600e3, 900e3, 300e3]
    source, told = Backlog(backlogs), Told()

    async def go() -> list[loop.StepOutcome]:
        engine = Engine()
        port = int((await engine.start()).rsplit(":", 1)[1])
        try:
            clock = [T0]
            deps = loop.Deps(kube=PodsAndConfigMaps(port),  # type: ignore[arg-type]
                             config=settings_.ControllerSettings(engine_networks="127.0.0.0/8", mix_poll_seconds=0),
                             keys=Key(), observer=source, recommender=told, clock=lambda: clock[0])  # type: ignore[arg-type]
            dep = models.ServingDeployment.model_validate({
                "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
                "spec": {"replicas": 1, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "port": port},
                         "tuning": {"mode": "Auto", "threshold": 0, "intervalSeconds": 60},
                         "prometheus": {"url": "http://127.0.0.1:9090"}},
            })  # fmt: skip
            memory, out = loop.Memory(), []
            for k in range(len(backlogs)):
                source.step, clock[0] = k, T0 + 60.0 * k
                out.append(await loop.step(deps, dep, memory))
            return out
        finally:
            await engine.runner.cleanup()

    outcomes = asyncio.run(go())

    def condition(outcome: loop.StepOutcome) -> dict[str, Any]:
        return next(c for c in outcome.patch["conditions"] if c["type"] == "Overloaded")

    states = [condition(o)["status"] for o in outcomes]
    assert states == ["False", "False", "False", "True", "True", "False", "False"], states
    events = [(k, e) for k, o in enumerate(outcomes) for e in o.events if e.reason == "Overloaded"]
    assert [(k, e.type) for k, e in events] == [(3, "Warning")], "one Event, when it turns true"
    message = condition(outcomes[3])["message"]
    assert "100,000 to 800,000" in message and "more replicas are needed" in message and "queueing" in message
    assert condition(outcomes[5])["reason"] == "BacklogNotGrowing"
    assert [bool(w) for w in told.overload] == [False, False, False, True, True, False, False], "the tuner is told"
