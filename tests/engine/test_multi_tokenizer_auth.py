"""Admin auth with --tokenizer-worker-num > 1 (multi-tokenizer mode).

Each worker process serves the module-level `http_server.app` and starts it through the
real `lifespan`, whose multi-tokenizer branch calls `init_multi_tokenizer` (reads the
server args from shared memory, builds the worker's tokenizer manager). The launcher's
`add_api_key_middleware` runs only in single-tokenizer mode, so without the fix
`/set_internal_state` took a change from any client there.

Here the real lifespan runs on the real app with `init_multi_tokenizer` replaced by a
stand-in that sets what the real one sets (the global state, with a stand-in tokenizer
manager forwarding to a harness scheduler, and returns the server args). The lifespan
then stops where it builds the OpenAI serving handlers on the stand-in (they need a
tokenizer); what it configured before that is what a worker serves with.
"""

from __future__ import annotations

import asyncio
import contextlib

import harness as h
import pytest
from sglang.srt.entrypoints import http_server
from sglang.srt.utils.secrets_redaction import ADMIN_KEY_ENV
from starlette.testclient import TestClient
from test_http import _StandInTokenizerManager

KEY = "multi-tokenizer-admin-key-42"


class _StandInTokenizerWorker(_StandInTokenizerManager):
    """test_http.py's stand-in, as one of several tokenizer workers."""

    worker_id = 0


def _start_worker(monkeypatch, eng: h.Engine) -> None:
    """The real lifespan of a multi-tokenizer worker, up to the serving handlers."""

    async def init_multi_tokenizer():
        http_server.set_global_state(
            http_server._GlobalState(
                tokenizer_manager=_StandInTokenizerWorker(eng),
                template_manager=None,
                scheduler_info={},
            )
        )
        return eng.s.server_args

    monkeypatch.setattr(http_server, "init_multi_tokenizer", init_multi_tokenizer)
    app = http_server.app
    assert not getattr(app, "is_single_tokenizer_mode", False)  # the worker's app

    async def run():
        ctx = http_server.lifespan(app)
        try:
            await ctx.__aenter__()
        except Exception:
            return  # the OpenAI handlers cannot be built on the stand-in
        await ctx.__aexit__(None, None, None)  # pragma: no cover

    asyncio.run(run())


@pytest.fixture()
def worker(monkeypatch):
    yield lambda eng: _start_worker(monkeypatch, eng)
    # The module app is shared with test_http.py: leave it as a fresh import has it.
    with contextlib.suppress(AttributeError):
        del http_server.app.state.multi_tokenizer_auth


BODY = {"server_args": {"long_prefill_token_threshold": 4096}}


def test_multi_tokenizer_set_internal_state_needs_the_admin_key(monkeypatch, worker):
    monkeypatch.setenv(ADMIN_KEY_ENV, KEY)
    eng = h.make_engine(chunked_prefill_size=8192, page_size=16)
    assert eng.s.server_args.admin_api_key == KEY
    worker(eng)
    c = TestClient(http_server.app)
    assert c.post("/set_internal_state", json=BODY).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert c.post("/set_internal_state", json=BODY, headers=wrong).status_code == 401
    assert eng.s.long_prefill_token_threshold == 0
    right = {"Authorization": f"Bearer {KEY}"}
    r = c.post("/set_internal_state", json=BODY, headers=right)
    assert r.status_code == 200, r.text
    assert eng.s.long_prefill_token_threshold == 4096
    # Normal endpoints stay open (no --api-key: multi-tokenizer mode refuses one).
    info = c.get("/get_server_info")
    assert info.status_code == 200 and KEY not in info.text


def test_multi_tokenizer_without_an_admin_key_refuses_every_change(monkeypatch, worker):
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    eng = h.make_engine(chunked_prefill_size=8192, page_size=16)
    assert eng.s.server_args.admin_api_key is None
    worker(eng)
    c = TestClient(http_server.app)
    anyone = {"Authorization": "Bearer anything"}
    assert c.post("/set_internal_state", json=BODY).status_code == 403
    assert c.post("/set_internal_state", json=BODY, headers=anyone).status_code == 403
    assert eng.s.long_prefill_token_threshold == 0
