"""The patched HTTP endpoints (`/set_internal_state`, `/get_server_info`) on the real
FastAPI app, in front of the real scheduler methods.

Stand-in: `_StandInTokenizerManager` forwards what the real TokenizerManager sends over
ZMQ straight to a harness scheduler (`Scheduler.set_internal_state`), and answers
`get_internal_state` with the scheduler's long-prefill state only (the real one also
reports GPU memory, which needs a model runner).
"""

from __future__ import annotations

import time

import harness as h
import pytest
from sglang.srt.entrypoints import http_server
from starlette.testclient import TestClient


class _StandInTokenizerManager:
    def __init__(self, eng: h.Engine) -> None:
        self.eng = eng
        self.server_args = eng.s.server_args
        self.startup_time = time.time()

    async def set_internal_state(self, obj):
        return [self.eng.s.set_internal_state(obj).updated]

    async def set_internal_state_detailed(self, obj):
        return [self.eng.s.set_internal_state(obj)]

    async def get_internal_state(self):
        return [self.eng.s._long_prefill_state()]


@pytest.fixture()
def client():
    eng = h.make_engine(chunked_prefill_size=8192, page_size=16)
    http_server.set_global_state(
        http_server._GlobalState(
            tokenizer_manager=_StandInTokenizerManager(eng),
            template_manager=None,
            scheduler_info={},
        )
    )
    yield TestClient(http_server.app), eng


def test_update_then_server_info_reports_values_in_force(client):
    c, eng = client
    r = c.post(
        "/set_internal_state",
        json={
            "server_args": {
                "long_prefill_token_threshold": 4096,
                "long_prefill_mode": "floor",
                "schedule_policy": "srpt",
            }
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["updated"] is True
    assert eng.s.long_prefill_token_threshold == 4096
    info = c.get("/get_server_info").json()
    assert (
        info["long_prefill_token_threshold"],
        info["long_prefill_mode"],
        info["schedule_policy"],
    ) == (4096, "floor", "srpt")
    assert info["num_partial_prefills"] == 0


def test_refusal_returns_the_reason_and_keeps_old_values(client):
    c, eng = client
    r = c.post("/set_internal_state", json={"server_args": {"long_prefill_token_threshold": 5000}})
    assert r.status_code == 400
    body = r.json()
    assert body["updated"] is False
    assert "multiple of the page size 16" in body["reason"]
    assert eng.s.long_prefill_token_threshold == 0
    assert c.get("/get_server_info").json()["long_prefill_token_threshold"] == 0


def test_the_operator_admin_client_round_trip(client):
    """slipstream.engine.admin.AdminClient against the patched endpoints."""
    from slipstream.api import models
    from slipstream.engine import admin

    c, eng = client
    state = admin.internal_state(
        models.EngineSetting(threshold=2048, mode="ceiling", schedule_policy="fcfs")
    )
    r = c.post("/set_internal_state", json={"server_args": state})
    assert r.status_code == 200
    assert admin.setting_of(c.get("/get_server_info").json()) == models.EngineSetting(
        threshold=2048, mode="ceiling", schedule_policy="fcfs"
    )
