"""KV pressure on the real scheduler code: a pool far smaller than the prompts plus
their outputs, decodes running with SGLang's real new_token_ratio (0.7, decaying), three
long prompts and short ones, every order and mode.

`harness.run_pressure` checks on every pass: no allocation failure (it would raise), the
KV of every position a request attends to holds that request's own token (a slot handed
out twice, a skipped chunk or a decode over unwritten KV fails), progress (never two
empty passes in a row while work is pending; stock spends one when its last decode
leaves a full batch), and at the end no KV or request slot leaked. Pristine 0.5.18
(T = 0) runs the same cases in a subprocess: every request gets the same output tokens.
"""

from __future__ import annotations

import harness as h
import pytest

POOL = 6_000  # tokens; the prompts alone are 11,400, with outputs 20,000+
LONGS = [3_000, 2_600, 2_200]


def requests(together: bool) -> list[dict]:
    longs = [
        {"rid": f"L{i}", "need": n, "max_new": 300, "round": 0 if together else 400 * i}
        for i, n in enumerate(LONGS)
    ]
    shorts = [
        {"rid": f"s{i}", "need": 200 + 100 * i, "max_new": 1_200, "round": 150 * i}
        for i in range(8)
    ]
    return longs + shorts


def case(together: bool, **engine) -> dict:
    return {
        "kind": "pressure",
        "engine": {"chunked_prefill_size": 2048, "kv_tokens": POOL, **engine},
        "requests": requests(together),
    }


@pytest.fixture(scope="module")
def stock(pristine):
    return pristine(
        {
            "together": case(True),
            "staggered": case(False),
            "paged": case(True, page_size=16),
        }
    )


@pytest.mark.parametrize("together", [True, False], ids=["together", "staggered"])
@pytest.mark.parametrize("policy", ["fcfs", "lpm", "srpt"])
@pytest.mark.parametrize("mode", ["ceiling", "floor", "reflex"])
def test_every_order_and_mode_under_kv_pressure(stock, together, policy, mode):
    # Reflex with no hold: capped exactly in the rounds that see a short request waiting.
    hold = {"reflex_hold": 0.0} if mode == "reflex" else {}
    out = h.run_pressure(case(together, threshold=512, mode=mode, policy=policy, **hold))
    ref = stock["together" if together else "staggered"]
    assert out["leak"] == [0, 0] and ref["leak"] == [0, 0]
    assert out["outputs"] == ref["outputs"]
    assert all(
        len(v) == r["max_new"]
        for r in requests(together)
        for k, v in out["outputs"].items()
        if k == r["rid"]
    )
    # The pool forces retraction (stock's, unchanged by the patch) in these cases, but
    # reflex under srpt with the long prompts together ran without one (0 on both
    # versions, 2026-12-06): the check that matters there is the outputs and no leak.
    assert ref["retractions"] >= 1
    if (mode, policy, together) != ("reflex", "srpt", True):
        assert out["retractions"] >= 1
    if together and mode == "ceiling":
        # The long prompts were admitted and prefilled side by side (in floor mode the
        # leftover budget finishes one first)...
        assert out["max_partials"] >= 2
    # ...but never more than the pool holds (each partial's remainder is reserved).
    assert out["max_partials"] <= 3


def test_paged_pool_under_kv_pressure(stock):
    out = h.run_pressure(case(True, threshold=512, page_size=16, policy="srpt"))
    assert out["leak"] == [0, 0]
    assert out["outputs"] == stock["paged"]["outputs"]


def test_the_stock_path_under_kv_pressure_is_pristines(stock):
    # T = 0 runs stock's code path: the same passes as pristine, not only the same tokens.
    out = h.run_pressure(case(True))
    assert out == stock["together"]
