"""The engines' KV pool from a server-info answer to the twin's engine config, through
`controller.loop.step` over real HTTP (an engine's admin API on loopback, the Kubernetes
API in memory: `loop_helpers`).

A step reads the pods after it observes, so the tuner of a step runs on the pool the step
before read (`loop.Memory.pools`). A missing or garbled value never moves the pool: the
pod's earlier value stays, and with none the profile's is used, and the reason says so."""

from __future__ import annotations

import asyncio
from typing import Any

from loop_helpers import Engine, Key, PodsAndConfigMaps

from slipstream.api import buckets, models, snapshot
from slipstream.controller import loop, stages, tuning
from slipstream.controller import settings as settings_
from slipstream.enginesim import admin as sim_admin
from slipstream.enginesim import flags
from slipstream.sim.policies import EngineConfig

TIGHT = 40_000
GARBLED = "abc"


def busy(now: float) -> snapshot.WorkloadSnapshot:
    chat = snapshot.TenantWindow("chat", 10.0, snapshot.histogram_of([0.3] * 600, buckets.TTFT_BOUNDS_S),
                                 snapshot.histogram_of([2000.0] * 600, buckets.PROMPT_TOKENS))  # fmt: skip
    return snapshot.WorkloadSnapshot("prod/kimi", now, 60.0, (chat,))


class Observer:
    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snapshot.WorkloadSnapshot:
        return busy(now)


class Recorder:
    """A recommender that records the engine config the real stage would give the twin for
    each snapshot it is handed (`stages.TwinRecommender`'s inputs), and the reason's note,
    without running the twin."""

    def __init__(self, config: settings_.ControllerSettings) -> None:
        self.stage = stages.TwinRecommender(config)
        self.configs: list[EngineConfig | None] = []
        self.notes: list[str] = []

    def without_twin(self, sd: models.ServingDeployment, snap: snapshot.WorkloadSnapshot,
                     fleet: models.EngineSetting, now: float, jumped: bool = False) -> tuning.Recommendation:  # fmt: skip
        self.configs.append(self.stage._inputs(sd, fleet, snap.kv_pools, jumped)[2])
        note = stages.tune_deployment.twin_pool(snap.kv_pools).note
        self.notes.append(note)
        return tuning.Recommendation(fleet, False, stages.with_note("AtBest: held", note))

    def recommend(self, *args: Any) -> tuning.Recommendation:
        raise AssertionError("without_twin always answers")


def sim_info() -> dict[str, Any]:
    """What `slipstream engine-sim --max-total-tokens 40000` answers on /get_server_info."""
    cfg = flags.parse(["--max-total-tokens", str(TIGHT)], environ={})
    live = sim_admin.Live(0, "ceiling", "fcfs", cfg.max_partial_prefills)
    return sim_admin.server_info(cfg, live, 0, {}, TIGHT)


def sd(port: int) -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
        "spec": {"replicas": 1, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "port": port},
                 "tuning": {"mode": "Auto", "threshold": 0}, "prometheus": {"url": "http://127.0.0.1:9090"}},
    })  # fmt: skip


def test_the_pool_an_engine_reports_reaches_the_twin_and_garbage_never_moves_it() -> None:
    async def run() -> tuple[Recorder, Recorder, loop.Memory]:
        engine = Engine()
        engine.info = sim_info()
        port = int((await engine.start()).rsplit(":", 1)[1])
        try:
            config = settings_.ControllerSettings(engine_networks="127.0.0.0/8")
            recorder = Recorder(config)
            deps = loop.Deps(kube=PodsAndConfigMaps(port), config=config, keys=Key(),  # type: ignore[arg-type]
                             observer=Observer(), recommender=recorder)  # fmt: skip
            memory = loop.Memory()
            await loop.step(deps, sd(port), memory)  # reads 40,000 after observing
            await loop.step(deps, sd(port), memory)  # the tuner runs with it
            engine.info["max_total_num_tokens"] = GARBLED
            await loop.step(deps, sd(port), memory)
            await loop.step(deps, sd(port), memory)  # garbled now: 40,000 still
            del engine.info["max_total_num_tokens"]
            await loop.step(deps, sd(port), memory)
            await loop.step(deps, sd(port), memory)  # missing now: 40,000 still
            # An operator that never saw a usable value: the profile's pool, said so.
            fresh = Recorder(config)
            deps.recommender = fresh
            memory = loop.Memory()
            engine.info["max_total_num_tokens"] = GARBLED
            await loop.step(deps, sd(port), memory)
            await loop.step(deps, sd(port), memory)
            return recorder, fresh, memory
        finally:
            await engine.runner.cleanup()

    recorder, fresh, memory = asyncio.run(run())
    assert sim_info()["max_total_num_tokens"] == TIGHT
    pools = [c.kv_pool_tokens if c is not None else "none" for c in recorder.configs]
    assert pools == [None, TIGHT, TIGHT, TIGHT, TIGHT, TIGHT], pools
    assert recorder.notes[1] == ""
    assert recorder.notes[3] == ("twin KV pool 40,000 tokens, the smallest reported "
                                 "(kimi-0: max_total_num_tokens is 'abc', not a token count)")  # fmt: skip
    assert "kimi-0: no max_total_num_tokens in its server info" in recorder.notes[5]
    assert [c.kv_pool_tokens if c is not None else "none" for c in fresh.configs] == [None, None]
    assert fresh.notes[1] == "twin KV pool: the profile's (kimi-0: max_total_num_tokens is 'abc', not a token count)"
    assert memory.pools == (snapshot.PodPool("kimi-0", None, "max_total_num_tokens is 'abc', not a token count"),)
