"""/set_internal_state value types: each value is coerced to its key's type as pristine
SGLang's pydantic body did ("8" -> 8), and a value of the wrong type answers 400 naming
the key, changes nothing, and leaves the scheduler serving.

The calls go through the real FastAPI app (`http_server.app`, the patched and the
pristine one) to the real scheduler method (`Scheduler.set_internal_state`, on 0.5.23
the real `SchedulerInternalStateController`). The stand-in tokenizer manager forwards
the request object as the real one sends it over ZMQ (as in test_http.py). Without the
fix the patched body kept "8" a string, and the scheduler's range check raised
TypeError: the scheduler process died.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness as h
import pytest
from test_http import _StandInTokenizerManager

HERE = Path(__file__).resolve().parent


def _pp_in_force() -> Any:
    """pp_max_micro_batch_size as the scheduler's /get_internal_state reads it back."""
    from sglang.srt.runtime_context import get_context

    return get_context().resolved_server_args_dict()["pp_max_micro_batch_size"]


def post_internal_state(server_args: dict[str, Any]) -> dict[str, Any]:
    """POST ``server_args`` to the real app in front of a harness scheduler; the reply,
    the value in force before and after, and the allocation of a pass run after."""
    from sglang.srt.entrypoints import http_server
    from starlette.testclient import TestClient

    eng = h.make_engine(chunked_prefill_size=8192, page_size=16, max_reqs=64)
    http_server.set_global_state(
        http_server._GlobalState(
            tokenizer_manager=_StandInTokenizerManager(eng),
            template_manager=None,
            scheduler_info={},
        )
    )
    before = _pp_in_force()
    r = TestClient(http_server.app).post("/set_internal_state", json={"server_args": server_args})
    after = _pp_in_force()
    eng.add(100, rid="after")
    return {
        "status": r.status_code,
        "body": r.json(),
        "pp_before": before,
        "pp_after": after,
        "pass_after": eng.step(),
        "engine": eng,
    }


def _pristine(server_args: dict[str, Any]) -> dict[str, Any]:
    """post_internal_state against the unpatched sglang (the env's site-packages)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import json, sys; import test_internal_state_types as t; "
        "out = t.post_internal_state(json.loads(sys.argv[1])); out.pop('engine'); "
        "print(json.dumps(out))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(server_args)],
        cwd=str(HERE),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "_get_new_batch_prefill_long" not in proc.stdout  # it ran pristine code
    return out


def test_internal_state_types_a_numeric_string_is_coerced_as_pristine_does():
    got = post_internal_state({"pp_max_micro_batch_size": "8"})
    got.pop("engine")
    want = _pristine({"pp_max_micro_batch_size": "8"})
    # Pristine: pydantic turned "8" into 8, the scheduler applied it.
    assert want["status"] == 200 and want["body"] == [True], want
    assert (want["pp_before"], want["pp_after"]) == (64, 8)
    assert got == want


@pytest.mark.parametrize(
    "update",
    [
        {"pp_max_micro_batch_size": "abc"},
        {"pp_max_micro_batch_size": [8]},
        {"pp_max_micro_batch_size": True},
        {"pp_max_micro_batch_size": 8.5},
        {"speculative_accept_threshold_single": "high"},
        {"long_prefill_token_threshold": "abc"},
        {"long_prefill_token_threshold": [4096]},
        {"long_prefill_token_threshold": True},
        {"max_partial_prefills": False},
        {"max_partial_prefills": "two"},
        {"long_prefill_mode": 1},
        {"schedule_policy": ["srpt"]},
        {"srpt_aging_tokens_per_s": "fast"},
        {"long_prefill_reflex_hold_seconds": "soon"},
        {"long_prefill_reflex_hold_seconds": "nan"},
        {"long_prefill_reflex_hold_seconds": -1},
    ],
    ids=lambda u: f"{next(iter(u))}={next(iter(u.values()))!r}",
)
def test_internal_state_types_a_bad_value_is_refused_with_400_and_changes_nothing(update):
    got = post_internal_state(update)
    eng = got["engine"]
    key = next(iter(update))
    assert got["status"] == 400, got["body"]
    assert got["body"]["updated"] is False
    assert key in got["body"]["reason"] and "must be" in got["body"]["reason"]
    assert got["pp_after"] == got["pp_before"] == 64  # read back: the old value
    assert (
        eng.s.long_prefill_token_threshold,
        eng.s.long_prefill_mode,
        eng.s.schedule_policy,
        eng.s.max_partial_prefills,
        eng.s.long_prefill_reflex_hold_seconds,
    ) == (0, "ceiling", "fcfs", 8, 3.0)
    assert got["pass_after"] == {"after": 100}  # the scheduler keeps serving


def test_internal_state_types_long_prefill_values_are_coerced_too():
    got = post_internal_state({"long_prefill_token_threshold": "4096"})
    assert got["status"] == 200 and got["body"]["updated"] is True, got["body"]
    assert got["engine"].s.long_prefill_token_threshold == 4096
    got = post_internal_state({"max_partial_prefills": "3", "long_prefill_mode": "floor"})
    assert got["status"] == 200, got["body"]
    assert got["engine"].s.max_partial_prefills == 3
    assert isinstance(got["engine"].s.max_partial_prefills, int)


def test_internal_state_types_the_scheduler_refuses_a_bad_value_sent_directly():
    # What the Engine API (or any ZMQ client) sends reaches the scheduler uncoerced.
    eng = h.make_engine(chunked_prefill_size=8192, page_size=16, max_reqs=64)
    before = _pp_in_force()
    out = h.set_internal_state(eng, pp_max_micro_batch_size="abc")
    assert out.updated is False and "pp_max_micro_batch_size" in out.reason
    assert _pp_in_force() == before
    assert h.set_internal_state(eng, pp_max_micro_batch_size="8").updated
    assert _pp_in_force() == 8
    eng.add(100, rid="after")
    assert eng.step() == {"after": 100}
