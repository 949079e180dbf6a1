"""No API key in the crash dump or in the embedded Rust server's server-args blob.

The crash dump is written by the real `TokenizerManager.dump_requests_before_crash`
(its "server_args", "resolved_config" snapshot and "launch_command"), on a
`TokenizerManager.__new__` object given the attributes that method reads. The Rust
server's blob is built by the real upstream function: 0.5.18's
`RustServer._build_server_args` (a JSON copy of every server arg), 0.5.23's
`rust_server.config._launch_server_info` (the `/server_info` the Rust ingress serves,
through `utils.common.build_server_info`, which the HTTP and gRPC frontends share).
"""

from __future__ import annotations

import asyncio
import collections
import pickle
import sys
from types import SimpleNamespace

import harness as h
import pytest
from sglang.srt.utils.secrets_redaction import ADMIN_KEY_ENV

KEY = "crash-dump-admin-key-77"
USER_KEY = "user-api-key-88"


@pytest.fixture()
def eng(monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, KEY)
    e = h.make_engine(chunked_prefill_size=8192, page_size=16)
    # --api-key as well (it is also a secret), set as a launch flag would.
    h.set_launch_args(e.s.server_args, api_key=USER_KEY)
    assert e.s.server_args.admin_api_key == KEY
    return e


def test_redact_the_crash_dump(eng, tmp_path, monkeypatch):
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    monkeypatch.setattr(
        sys, "argv", ["sglang.launch_server", "--model-path", "m", "--api-key", USER_KEY]
    )
    tm = TokenizerManager.__new__(TokenizerManager)
    tm.server_args = eng.s.server_args
    tm.crash_dump_folder = str(tmp_path)
    tm.crash_dump_performed = False
    tm.crash_dump_request_list = collections.deque([({"text": "hi"}, {}, 0.0, 1.0)])
    tm.rid_to_state = {}
    tm.model_path = tm.served_model_name = "m"

    async def dump():
        tm.dump_requests_before_crash(hostname="host")
        # 0.5.23 writes the file in a thread it starts with asyncio.to_thread.
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            await task

    asyncio.run(dump())
    (path,) = (tmp_path / "host").glob("crash_dump_*.pkl")
    raw = path.read_bytes()
    assert KEY.encode() not in raw and USER_KEY.encode() not in raw
    data = pickle.loads(raw)
    assert data["resolved_config"]["admin_api_key"] == "<redacted>"
    assert data["resolved_config"]["chunked_prefill_size"] == 8192  # the rest is there
    assert data["server_args"]["admin_api_key"] == "<redacted>"
    assert data["requests"]  # the dump still carries the requests
    assert "--api-key <redacted>" in data["launch_command"]


def test_redact_the_rust_server_blob(eng):
    s = eng.s
    s.max_total_num_tokens = 1_000_000
    s.max_req_input_len = 100_000
    if h.V0523:
        from sglang.srt.rust_server.config import _launch_server_info

        blob = _launch_server_info(s)
    else:
        from sglang.srt.managers.rust_server import RustServer

        s.model_config = SimpleNamespace(vocab_size=1 << 10, get_default_sampling_params=lambda: {})
        blob = RustServer._build_server_args(s)
    assert KEY not in blob and USER_KEY not in blob
    assert '"admin_api_key":"<redacted>"' in blob.replace(" ", "")
    assert '"chunked_prefill_size":8192' in blob.replace(" ", "")
