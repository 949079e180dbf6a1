"""An engine on a release Slipstream has no patch for, or on another release than
spec.engine.version says, is never tuned: Auto only recommends, with condition
EngineSupported=False naming the pod and what it reports, and one Warning (issue 19 item 3).

One `controller.loop.step` over real HTTP: the engine's admin API on loopback answers
/get_server_info with a `version` as SGLang does (its `__version__`), the Kubernetes API in
memory (`loop_helpers`), and a recommender that always wants a move."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from loop_helpers import Engine, Key, PodsAndConfigMaps
from test_tuner_clocks import Clock, Observer, SlowTwin, sd

from slipstream.controller import loop, tuning
from slipstream.controller import settings as settings_


def step_with(reported: str | None, spec: dict[str, Any]) -> tuple[loop.StepOutcome, Engine]:
    async def run() -> tuple[loop.StepOutcome, Engine]:
        engine = Engine()
        if reported is not None:
            engine.info["version"] = reported
        port = int((await engine.start()).rsplit(":", 1)[1])
        try:
            clock = Clock(100_000.0)
            deps = loop.Deps(
                kube=PodsAndConfigMaps(port),  # type: ignore[arg-type]
                config=settings_.ControllerSettings(engine_networks="127.0.0.0/8"),
                keys=Key(),  # type: ignore[arg-type]
                observer=Observer(),
                recommender=SlowTwin(clock, 0.0),
                clock=clock,
            )
            memory = loop.Memory()
            first = await loop.step(deps, sd(port=port, **spec), memory)
            return first, engine
        finally:
            await engine.runner.cleanup()

    return asyncio.run(run())


def conditions(outcome: loop.StepOutcome) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in outcome.patch["conditions"]}


@pytest.mark.parametrize(("version", "spec", "reason"), [
    ("0.5.24", {}, "UnpatchedVersion"),
    ("0.4.9", {"version": "0.5.18"}, "UnpatchedVersion"),
    ("0.5.18", {}, "VersionMismatch"),  # spec.engine.version defaults to 0.5.23
    ("0.5.23+slipstream-engine-sim", {"version": "0.5.18"}, "VersionMismatch"),
])  # fmt: skip
def test_auto_only_recommends_on_an_engine_it_may_not_tune(version: str, spec: dict[str, Any], reason: str) -> None:
    outcome, engine = step_with(version, spec)
    assert engine.sets == [], f"a setting was sent to an engine reporting {version}: {engine.sets}"
    assert not outcome.decision.in_flight
    cond = conditions(outcome)[tuning.ENGINE_SUPPORTED]
    assert (cond["status"], cond["reason"]) == ("False", reason), cond
    assert "kimi-0" in cond["message"] and version in cond["message"], cond["message"]
    assert outcome.patch["recommendation"]["threshold"] == 2048, "the recommendation is still reported"
    warnings = [e for e in outcome.events if e.type == "Warning" and e.reason == reason]
    assert len(warnings) == 1, outcome.events
    recommended = [e for e in outcome.events if e.reason == "Recommended"]
    assert len(recommended) == 1 and "not applied" in recommended[0].message, outcome.events


@pytest.mark.parametrize(("version", "spec"), [
    ("0.5.23", {}),
    ("0.5.18", {"version": "0.5.18"}),
    ("0.5.23+slipstream-engine-sim", {}),
    (None, {}),  # an engine that reports no version is judged by the spec alone
])  # fmt: skip
def test_auto_tunes_an_engine_on_the_release_the_spec_names(version: str | None, spec: dict[str, Any]) -> None:
    outcome, engine = step_with(version, spec)
    assert engine.sets and engine.sets[0]["long_prefill_token_threshold"] == 2048, engine.sets
    cond = conditions(outcome)[tuning.ENGINE_SUPPORTED]
    assert (cond["status"], cond["reason"]) == ("True", "PatchedVersion"), cond
