"""A step never waits behind other deployments' twin runs (`controller.loop.TwinRuns`).

At 500 deployments a fleet's first round of twin runs takes minutes on one tuner thread;
a step that queued behind it would not step again for many intervals. These run
`loop.observe` with the operator's own recommender (`stages.TwinRecommender`, real twin
runs and its memo) behind a gate that holds the first run on the pool's one thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import Counter
from typing import Any

from slipstream.api import buckets, models, snapshot
from slipstream.controller import loop, stages, tuning
from slipstream.controller import settings as settings_

OFF = models.EngineSetting(threshold=0)
NOW = 100_000.0


def sd(name: str) -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": name, "namespace": "prod", "uid": name, "generation": 1},
        "spec": {"replicas": 2, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192},
                 "tuning": {"mode": "Auto", "threshold": 0, "cooldownSeconds": 600, "intervalSeconds": 60},
                 "prometheus": {"url": "http://127.0.0.1:9090"}},
    })  # fmt: skip


class Observer:
    """A valid window of 600 first tokens, mixed sizes, for whichever deployment asks."""

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snapshot.WorkloadSnapshot:  # fmt: skip
        prompts = [2000.0] * 590 + [60_000.0] * 10
        chat = snapshot.TenantWindow("chat", 10.0, snapshot.histogram_of([0.3] * 600, buckets.TTFT_BOUNDS_S),
                                     snapshot.histogram_of(prompts, buckets.PROMPT_TOKENS))  # fmt: skip
        return snapshot.WorkloadSnapshot(f"{sd.metadata.namespace}/{sd.metadata.name}", now, 60.0, (chat,))


class Gated:
    """The operator's recommender; its twin runs wait for ``gate`` and are counted."""

    def __init__(self, config: settings_.ControllerSettings) -> None:
        self.real = stages.TwinRecommender(config)
        self.gate, self.started = threading.Event(), threading.Event()
        self.runs: Counter[str] = Counter()

    def without_twin(self, *args: Any) -> tuning.Recommendation | None:
        return self.real.without_twin(*args)

    def recommend(self, sd: models.ServingDeployment, *args: Any) -> tuning.Recommendation:
        self.runs[sd.metadata.name] += 1
        self.started.set()
        assert self.gate.wait(40), "the test never opened the gate"
        return self.real.recommend(sd, *args)


def deps(recommender: Gated, pool: concurrent.futures.Executor, runs: loop.TwinRuns) -> loop.Deps:
    return loop.Deps(kube=None, config=recommender.real.config, keys=None,  # type: ignore[arg-type]
                     observer=Observer(), recommender=recommender, tuner=pool, twin_runs=runs)  # fmt: skip


def test_a_step_on_a_full_pool_holds_and_a_later_step_decides_on_its_run() -> None:
    config = settings_.ControllerSettings()
    twin = Gated(config)
    assert twin.real.memo is not None  # the chart's default keeps runs for reuse

    async def run() -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            d = deps(twin, pool, loop.TwinRuns(1, memo=True))
            first = asyncio.create_task(loop.observe(d, sd("a"), OFF, NOW))
            await asyncio.to_thread(twin.started.wait, 60)  # a's run holds the pool's one thread
            # Not behind a's run: it answers while a's run still holds the thread.
            _, held = await asyncio.wait_for(loop.observe(d, sd("b"), OFF, NOW), 20)
            assert held is not None and not held.judged and held.reason.startswith(loop.TWIN_QUEUED), held
            assert "every tuner thread is busy" in held.reason
            _, again = await loop.observe(d, sd("b"), OFF, NOW + 1)
            assert again is not None and again.reason.startswith(loop.TWIN_QUEUED) and "still queued" in again.reason
            assert twin.runs["b"] <= 1  # a step whose run is queued queues no second one
            twin.gate.set()
            _, decided = await first
            assert decided is not None and decided.judged
            await d.twin_runs.pending["prod/b"]  # b's queued run ends and stores its result
            _, later = await loop.observe(d, sd("b"), OFF, NOW + 2)
            assert later is not None and later.judged and not later.reason.startswith(loop.TWIN_QUEUED), later
            assert twin.runs == Counter(a=1, b=1)  # decided on the queued run, not a new one
            assert "prod/b" not in d.twin_runs.pending

    asyncio.run(run())


def test_without_a_memo_a_step_waits_for_its_own_run() -> None:
    # tuner_reuse_seconds 0: nothing would carry a queued run's result to a later step.
    config = settings_.ControllerSettings(tuner_reuse_seconds=0)
    twin = Gated(config)
    assert twin.real.memo is None

    async def run() -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            d = deps(twin, pool, loop.TwinRuns(1, memo=twin.real.memo is not None))
            first = asyncio.create_task(loop.observe(d, sd("a"), OFF, NOW))
            await asyncio.to_thread(twin.started.wait, 60)
            second = asyncio.create_task(loop.observe(d, sd("b"), OFF, NOW))
            twin.gate.set()
            for task in (first, second):
                _, rec = await task
                assert rec is not None and rec.judged and not rec.reason.startswith(loop.TWIN_QUEUED), rec

    asyncio.run(run())
