"""The tuning loop given garbage (issue 10, "Bad input"): a step of `controller.loop` whose
Prometheus answers garbage (real HTTP, `FakePrometheus`) and whose engine's admin API answers
garbage (a real aiohttp server on loopback) returns, raises nothing, moves no threshold (a pod it cannot read is only re-sent the fleet's setting), says
why in its conditions, warns once (not once per interval), and the next step goes on.

The layers below are fuzzed on their own (tests/integration/test_observe_faults.py,
tests/integration/test_admin_client_answers.py); this is the controller's view of both at
once, through the same stages the operator wires (`stages.fleet_observer`,
`stages.TwinRecommender`, `engines` over `admin.AdminClient`). Only the Kubernetes API is a
stand-in (`PodsAndConfigMaps`: one pod on 127.0.0.1 and the ConfigMap it writes), because a
pod IP the loop may contact must be loopback on a test machine.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_helpers import Engine, Key, PodsAndConfigMaps
from observe_helpers import FakePrometheus

from slipstream.api import models, snapshot
from slipstream.controller import loop, stages, tuning
from slipstream.controller import settings as settings_

Answer = tuple[int, bytes]

GARBAGE: st.SearchStrategy[Answer] = st.one_of(
    st.tuples(st.sampled_from([400, 404, 500, 502, 503]), st.binary(max_size=64)),
    st.tuples(st.just(200), st.sampled_from([
        b"", b"<html>not json</html>", b"null", b"[]", b"{}", b'{"status": "error"}', b"NaN",
        b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, "NaN"]}]}}',
        b'{"status": "success", "data": {"resultType": "scalar", "result": [0, "1"]}}',
        b'{"status": "success", "data": null}', b'{"long_prefill_token_threshold": "lots"}',
        b'{"long_prefill_token_threshold": -1, "schedule_policy": "fifo"}', b"\xff\xfe",
    ])),  # fmt: skip
)
"""Answers no Prometheus query and no /get_server_info may be read as data."""

SPEC = {
    "metadata": {"name": "kimi", "namespace": "prod", "uid": "u-1", "generation": 1},
    "spec": {"replicas": 1, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 64},
             "tuning": {"mode": "Auto", "threshold": 4096, "intervalSeconds": 10, "cooldownSeconds": 0},
             "prometheus": {"url": "set per test"}},
    "status": {"observedGeneration": 1, "threshold": 4096, "mode": "ceiling", "schedulePolicy": "fcfs"},
}  # fmt: skip


@pytest.fixture(scope="module")
def prometheus() -> Any:
    fake = FakePrometheus(lambda q: (500, b"", 0.0))
    yield fake
    fake.stop()


def conditions(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in patch.get("conditions", [])}


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(metrics=GARBAGE, admin=GARBAGE)
def test_a_step_given_garbage_raises_nothing_moves_nothing_and_warns_once(
    prometheus: FakePrometheus, metrics: Answer, admin: Answer
) -> None:
    prometheus.responder = lambda q: (metrics[0], metrics[1], 0.0)

    async def run() -> None:
        engine = Engine()
        engine.answer = admin
        url = await engine.start()
        try:
            port = int(url.rsplit(":", 1)[1])
            doc = copy.deepcopy(SPEC)
            doc["spec"]["prometheus"]["url"] = prometheus.url
            doc["spec"]["engine"]["port"] = port
            sd = models.ServingDeployment.model_validate(doc)
            config = settings_.ControllerSettings(engine_networks="127.0.0.0/8", tuning_time_scale=0.01)
            kube = PodsAndConfigMaps(port)
            fleet = stages.fleet_observer(config)  # as controller.handlers.register wires them
            deps = loop.Deps(kube=kube, config=config, keys=Key(), observer=fleet,  # type: ignore[arg-type]
                             recommender=stages.TwinRecommender(config),
                             latency=stages.latency_for(fleet, config))  # fmt: skip
            memory = loop.Memory()
            first = await loop.step(deps, sd, memory)
            second = await loop.step(deps, sd, memory)
        finally:
            await engine.runner.cleanup()

        for outcome in (first, second):
            conds = conditions(outcome.patch)
            metrics_ = conds[tuning.METRICS_AVAILABLE]
            assert metrics_["status"] == "False" and metrics_["reason"] in snapshot.REASONS, metrics_
            in_sync = conds[tuning.ENGINES_IN_SYNC]
            assert in_sync["status"] == "False" and in_sync["reason"] == tuning.PODS_UNREACHABLE, in_sync
            assert "kimi-0" in in_sync["message"]
            assert not outcome.decision.in_flight, outcome.decision
        # A pod whose setting cannot be read is only ever re-sent the fleet's (the spec's)
        # setting, which is idempotent: garbage never moves a threshold.
        fleet = {"long_prefill_token_threshold": 4096, "long_prefill_mode": "ceiling", "schedule_policy": "fcfs"}
        assert all(sent == fleet for sent in engine.sets), engine.sets
        for cm in kube.configmaps.values():
            assert json.dumps(cm["data"]).count("4096") >= 1, cm["data"]  # the spec's T, kept
        warned = [e.reason for e in first.events if e.type == "Warning"]
        assert tuning.METRICS_AVAILABLE not in warned  # the reason is the Event's, not the type
        assert {metrics_["reason"], tuning.PODS_UNREACHABLE} <= set(warned), first.events
        assert not [e for e in second.events if e.type == "Warning"], "warned again on the same problem"

    asyncio.run(run())
