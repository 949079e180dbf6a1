"""/set_internal_state: valid updates take effect next round; invalid ones change nothing."""

from __future__ import annotations

import harness as h
import pytest


def settings(eng):
    s = eng.s
    return (s.long_prefill_token_threshold, s.long_prefill_mode, s.schedule_policy)


def test_valid_update_takes_effect_next_round():
    eng = h.make_engine(chunked_prefill_size=8192)
    for i in range(3):
        eng.add(500_000, rid=f"L{i}")
    assert eng.step() == {"L0": 8192}
    out = h.set_internal_state(
        eng, long_prefill_token_threshold=4096, long_prefill_mode="ceiling", schedule_policy="srpt"
    )
    assert out.updated and out.reason is None
    assert settings(eng) == (4096, "ceiling", "srpt")
    assert eng.step() == {"L0": 4096, "L1": 4096}
    assert h.set_internal_state(eng, long_prefill_mode="floor").updated
    assert h.set_internal_state(eng, schedule_policy="fcfs").updated
    assert eng.step() == {"L0": 4096, "L1": 4096}
    assert eng.s.num_partial_prefills() == 2


@pytest.mark.parametrize(
    "update, reason",
    [
        ({"long_prefill_token_threshold": 5000}, "multiple of the page size"),
        ({"long_prefill_token_threshold": 16384}, "<= chunked_prefill_size 8192"),
        ({"long_prefill_token_threshold": -1}, "0 (off) or positive"),
        ({"long_prefill_token_threshold": "40x6"}, "must be an integer"),
        ({"long_prefill_mode": "median"}, "long_prefill_mode must be one of"),
        ({"schedule_policy": "lof"}, "schedule_policy can be switched"),
        ({"long_prefill_token_threshold": 4096, "long_prefill_mode": "bogus"}, "long_prefill_mode"),
        (
            {"long_prefill_token_threshold": 4096, "pp_max_micro_batch_size": 8},
            "cannot be combined",
        ),
    ],
)
def test_invalid_update_is_refused_with_reason_and_changes_nothing(update, reason):
    eng = h.make_engine(chunked_prefill_size=8192, page_size=16, threshold=2048)
    before = settings(eng)
    out = h.set_internal_state(eng, **update)
    assert out.updated is False
    assert reason in out.reason
    assert settings(eng) == before


def test_unsupported_deployment_refuses_the_threshold():
    eng = h.make_engine(chunked_prefill_size=8192)
    h.set_launch_args(eng.s.server_args, pp_size=2)
    out = h.set_internal_state(eng, long_prefill_token_threshold=4096)
    assert not out.updated and "pipeline parallelism" in out.reason
    assert eng.s.long_prefill_token_threshold == 0


def test_internal_state_reports_the_values_in_force():
    eng = h.make_engine(chunked_prefill_size=8192, threshold=1024, mode="floor", policy="srpt")
    state = eng.s._long_prefill_state()
    assert state["long_prefill_token_threshold"] == 1024
    assert state["long_prefill_mode"] == "floor"
    assert state["schedule_policy"] == "srpt"
