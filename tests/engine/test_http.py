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
        # The real scheduler answers with its resolved server args (secrets included)
        # plus its state; the long-prefill state is the part the harness can compute.
        return [{**h.server_args_dict(self.server_args), **self.eng.s._long_prefill_state()}]


@pytest.fixture()
def client(monkeypatch):
    monkeypatch.delenv("SLIPSTREAM_ADMIN_API_KEY", raising=False)
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
    assert admin.reported_setting(c.get("/get_server_info").json()) == models.EngineSetting(
        threshold=2048, mode="ceiling", schedule_policy="fcfs"
    )


def test_server_info_reports_the_kv_pool_the_operator_tunes_with():
    """`max_total_num_tokens` reaches /get_server_info from the scheduler's own init info
    (`Scheduler.get_init_info`, the handshake the real server keeps as its scheduler info),
    and the operator reads it as the pool its twin runs with (docs/operator.md)."""
    from slipstream.api import models
    from slipstream.controller import tuning
    from slipstream.engine import admin
    from slipstream.rollout import machine
    from slipstream.tune import deployment

    eng = h.make_engine(chunked_prefill_size=8192, page_size=16, kv_tokens=40_000)
    s = eng.s
    # What Scheduler.__init__ takes from its model runner (the harness builds no runner).
    s.max_total_num_tokens = s.token_to_kv_pool_allocator.size
    s.max_req_input_len = s.max_total_num_tokens - 1
    s.startup_time = time.time()
    http_server.set_global_state(
        http_server._GlobalState(
            tokenizer_manager=_StandInTokenizerManager(eng),
            template_manager=None,
            scheduler_info=s.get_init_info(),
        )
    )
    info = TestClient(http_server.app).get("/get_server_info").json()
    assert admin.kv_pool_of(info) == (40_000, "")
    pool, _ = admin.kv_pool_of(info)
    pods = tuning.kv_pools((), [machine.Pod("p", admin.reported_setting(info), kv_pool_tokens=pool)])
    spec = models.ServingDeploymentSpec.model_validate(
        {"engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 16},
         "tuning": {"mode": "Fixed", "threshold": 0}}
    )
    assert deployment.engine_config(spec, pods).kv_pool_tokens == 40_000


ADMIN_KEY = "s3cret-admin-key-0123456789"


def _admin_app(eng):
    """The real app's routes behind SGLang's real API-key middleware (a fresh app: a
    started app takes no new middleware)."""
    from fastapi import FastAPI
    from sglang.srt.utils.auth import add_api_key_middleware

    app = FastAPI()
    app.router.routes.extend(http_server.app.router.routes)
    add_api_key_middleware(app, api_key=None, admin_api_key=eng.s.server_args.admin_api_key)
    return TestClient(app)


@pytest.fixture()
def admin_client(monkeypatch):
    from sglang.srt.utils.secrets_redaction import ADMIN_KEY_ENV

    monkeypatch.setenv(ADMIN_KEY_ENV, ADMIN_KEY)
    eng = h.make_engine(chunked_prefill_size=8192, page_size=16)
    assert eng.s.server_args.admin_api_key == ADMIN_KEY  # read from the environment
    http_server.set_global_state(
        http_server._GlobalState(
            tokenizer_manager=_StandInTokenizerManager(eng),
            template_manager=None,
            scheduler_info={},
        )
    )
    yield _admin_app(eng), eng


def test_set_internal_state_needs_the_admin_key(admin_client):
    c, eng = admin_client
    body = {"server_args": {"long_prefill_token_threshold": 4096}}
    assert c.post("/set_internal_state", json=body).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert c.post("/set_internal_state", json=body, headers=wrong).status_code == 401
    assert eng.s.long_prefill_token_threshold == 0
    right = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = c.post("/set_internal_state", json=body, headers=right)
    assert r.status_code == 200, r.text
    assert eng.s.long_prefill_token_threshold == 4096


@pytest.mark.parametrize("path", ["/get_server_info", "/server_info"])
def test_info_endpoints_never_return_the_admin_key(admin_client, path):
    c, _ = admin_client
    r = c.get(path)
    assert r.status_code == 200, r.text
    assert ADMIN_KEY not in r.text
    info = r.json()
    assert info["admin_api_key"] == "<redacted>"
    assert info["api_key"] is None
    assert info["internal_states"][0]["admin_api_key"] == "<redacted>"
    assert info["long_prefill_token_threshold"] == 0  # the rest is still there


def test_set_internal_state_is_forbidden_when_no_admin_key_is_configured(client):
    # No engine port accepts a setting change without the key, even one started keyless.
    c, eng = client
    app = _admin_app(eng)  # eng has no admin key here
    assert eng.s.server_args.admin_api_key is None
    r = app.post(
        "/set_internal_state", json={"server_args": {"long_prefill_token_threshold": 4096}}
    )
    assert r.status_code == 403
    assert eng.s.long_prefill_token_threshold == 0
