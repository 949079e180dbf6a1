"""Reflex mode (`--long-prefill-mode reflex`): a round is capped (ceiling with T) while a
short request (uncached need <= T) waits or was seen less than the hold ago, and
allocated as T = 0 otherwise (the twin's `slipstream.sim.admission` "Reflex mode").
Randomized mixes against the twin are in test_conformance.py (`test_reflex_*`); these
are the cases by hand, the flags and the admin call (the gauge: test_server_args_and_metrics.py)."""

from __future__ import annotations

import math
from array import array

import harness as h
import pytest
from sglang.srt.managers import long_prefill as lp
from test_http import client  # noqa: F401 (a fixture)

from slipstream.sim import admission

C = 8192
T = 2048


GIANT = 200_000


def reflex_engine(hold=0.0, policy="fcfs", **kw):
    kw = {"max_reqs": 32, "max_context_len": h.context_for(GIANT), **kw}
    eng = h.make_engine(
        chunked_prefill_size=C, threshold=T, mode="reflex", policy=policy, reflex_hold=hold, **kw
    )
    clock = h.FakeClock()
    eng.s._reflex_clock = clock
    return eng, clock


def test_reflex_constants_are_the_twins():
    assert lp.REFLEX_SCAN == admission.REFLEX_SCAN
    assert lp.DEFAULT_REFLEX_HOLD_S == admission.DEFAULT_REFLEX_HOLD_S
    assert set(lp.LONG_PREFILL_MODES) == set(admission.MODES)


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
def test_reflex_giant_takes_the_whole_budget_until_a_short_request_arrives(policy):
    eng, clock = reflex_engine(hold=0.0, policy=policy)
    eng.add(GIANT, rid="G")
    # No short request waits: uncapped, the giant (in progress from round 2) takes C.
    assert eng.step() == {"G": C}
    clock.advance(1.0)
    assert eng.step() == {"G": C}
    assert eng.s.num_partial_prefills() == 1
    eng.add(100, rid="S")
    clock.advance(1.0)
    got = eng.step()
    # Capped: the giant takes T, the short request is admitted whole in the same round
    # (under srpt in ceiling mode it goes first, by its key).
    assert got == {"G": T, "S": 100}
    assert list(got) == (["S", "G"] if policy == "srpt" else ["G", "S"])
    clock.advance(1.0)
    assert eng.step() == {"G": C}  # no hold: the next round is uncapped again


def test_reflex_a_document_behind_a_giants_remainder_is_short_and_one_behind_a_document_is_not():
    assert lp.REFLEX_RATIO == admission.REFLEX_RATIO
    eng, clock = reflex_engine(hold=0.0)
    eng.add(GIANT, rid="G")
    assert eng.step() == {"G": C}  # uncapped: the giant becomes a partial
    eng.add(12_000, rid="D")  # > T, but under a quarter of the giant's ~192K remainder
    clock.advance(1.0)
    assert eng.step() == {"G": T, "D": T}  # capped: ceiling with T, D a partial beside the giant
    other, clock2 = reflex_engine(hold=0.0)
    other.add(2 * C, rid="A")
    assert other.step() == {"A": C}
    other.add(2 * C, rid="B")  # one document behind another's 8K remainder: not short
    clock2.advance(1.0)
    assert other.step() == {"A": C}  # uncapped: A finishes with the whole budget


def test_reflex_hold_keeps_rounds_capped_for_hold_seconds_of_the_engine_clock():
    eng, clock = reflex_engine(hold=2.5)  # steps of 1 s and 1/8 s: exact in binary
    eng.add(GIANT, rid="G")
    assert eng.step() == {"G": C}  # never saw a short request: no hold running
    eng.add(100, rid="S")
    clock.advance(1.0)  # t = 1: S seen
    assert eng.step() == {"G": T, "S": 100}
    got = []
    for _ in range(4):  # t = 2, 3, 4, 5: 1, 2, 3, 4 s after the sighting
        clock.advance(1.0)
        got.append(eng.step())
    assert got == [{"G": T}, {"G": T}, {"G": C}, {"G": C}]
    # The hold is engine seconds: rounds closer together stay capped for more rounds.
    eng.add(30, rid="S2")
    clock.advance(0.125)
    assert eng.step() == {"G": T, "S2": 30}
    for _ in range(19):  # up to 2.375 s after the sighting: within the 2.5 s hold
        clock.advance(0.125)
        assert eng.step() == {"G": T}
    clock.advance(0.125)  # 2.5 s after it: the hold is over (capped while < 2.5 s)
    assert eng.step() == {"G": C}


def test_reflex_a_prefix_cache_hit_makes_a_request_short():
    """Short is judged on the uncached need: a 5,000-token prompt whose first 4,000
    tokens are cached needs 1,000 (<= T) and caps the round; the same prompt cold does
    not."""
    eng, clock = reflex_engine(hold=0.0)
    prefix = list(range(1, 4001))
    eng.add(4000, rid="warm", prefix=[])
    eng.s.waiting_queue[-1].origin_input_ids = array("q", prefix)
    eng.run_to_completion()
    eng.add(GIANT, rid="G")
    assert eng.step() == {"G": C}
    eng.add(1000, rid="hit", prefix=prefix)
    eng.add(5000, rid="cold")
    clock.advance(1.0)
    # Capped: G takes T, "hit" its 1,000 uncached tokens, "cold" (5,000 > T) T.
    assert eng.step() == {"G": T, "hit": 1000, "cold": T}
    clock.advance(1.0)
    # Only "cold" (2,952 left) and G wait or run: nothing short, uncapped, oldest first.
    assert eng.step() == {"G": C}


def test_reflex_with_threshold_zero_is_stock(pristine):
    case = {
        "requests": [{"rid": f"L{i}", "need": 500_000} for i in range(3)]
        + [{"rid": "s", "need": 10}],
        "rounds": 3,
        "engine": {"chunked_prefill_size": C},
    }
    stock = pristine({"c": case})["c"]
    reflex = h.run_case({**case, "engine": {**case["engine"], "mode": "reflex"}})
    assert reflex == stock
    assert stock[0] == {"L0": C}


def test_reflex_partials_keep_their_kv_reservation_in_uncapped_rounds():
    """Three 30,000-token prompts in a 40,000-token pool: capped rounds start partials,
    the uncapped rounds after them give the budget to the oldest first; no allocation
    fails and everything finishes with nothing leaked."""
    eng, clock = reflex_engine(hold=0.0, kv_tokens=40_000, max_context_len=h.context_for(31_000))
    eng.check_kv = True
    eng.add(100, rid="s")
    for i in range(3):
        eng.add(30_000, rid=f"L{i}")
    rounds = []
    while eng.busy():
        clock.advance(1.0)
        rounds.append(eng.step())
        assert len(rounds) < 200
    # Round 1 is capped (s waits): s whole, then L0 up to T, and L1 is refused (the
    # reservation of L0's remainder leaves no room for its 30,000), so the budget left
    # goes to L0 (admission step 3's fill on refusal). Then uncapped: L0 whole budget.
    assert rounds[0] == {"s": 100, "L0": C - 100}
    assert rounds[1] == {"L0": C}
    assert sum(r.get("L0", 0) for r in rounds) == 30_000
    assert eng.kv_free() == eng.kv_free_at_start
    assert eng.slots_free() == eng.slots_free_at_start


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
@pytest.mark.parametrize("refusal", ["memory", "partials bound"])
def test_reflex_a_capped_round_that_refuses_a_document_gives_the_giant_the_budget_left(
    policy, refusal
):
    """Admission step 3 in a capped round (the twin's ``fill_on_refusal``): a giant in
    progress, a short request and a 20,000-token document waiting. The document is refused
    (memory: it does not fit beside the giant's reserved remainder in a 210,000-token pool;
    or the partials bound, --max-partial-prefills 1: it would be a second partial), so the
    short one is served whole and the giant takes the whole budget left, not T: a cap that
    idles the pass only slows the prefill holding the memory the document waits for. The
    document stays short (under a quarter of the giant's remainder), so every round until
    the giant finishes is capped and filled: the giant takes as many rounds as in stock."""
    memory = refusal == "memory"
    eng, clock = reflex_engine(
        hold=0.0, policy=policy, kv_tokens=210_000 if memory else 400_000,
        max_partials=8 if memory else 1,
    )  # fmt: skip
    eng.check_kv = True
    eng.add(GIANT, rid="G")
    assert eng.step() == {"G": C}  # uncapped: nothing short waits
    eng.add(100, rid="S")
    eng.add(20_000, rid="D")
    clock.advance(1.0)
    got = eng.step()
    assert got == {"G": C - 100, "S": 100}, got
    # Under srpt in ceiling mode the short request goes first, by its key.
    assert list(got) == (["S", "G"] if policy == "srpt" else ["G", "S"])
    rounds = []
    while eng.busy():
        clock.advance(1.0)
        rounds.append(eng.step())
        assert len(rounds) < 200
    giant = [r["G"] for r in rounds if "G" in r]
    assert giant[:-1] == [C] * (len(giant) - 1), giant  # capped, filled: the whole budget
    assert sum(giant) == GIANT - 2 * C + 100
    assert all("D" not in r for r in rounds[: len(giant) - 1])  # refused while the giant runs
    assert sum(r.get("D", 0) for r in rounds) == 20_000
    assert eng.kv_free() == eng.kv_free_at_start
    assert eng.slots_free() == eng.slots_free_at_start


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
def test_reflex_a_capped_round_with_room_or_a_plain_ceiling_round_is_not_filled(policy):
    """The fill needs a refusal and a reflex: with room the document is admitted at T
    beside the giant (the ceiling's split, budget idle); ceiling mode, refusing it for
    memory, never fills."""
    roomy, clock = reflex_engine(hold=0.0, policy=policy, kv_tokens=400_000)
    roomy.add(GIANT, rid="G")
    assert roomy.step() == {"G": C}
    roomy.add(100, rid="S")
    roomy.add(20_000, rid="D")
    clock.advance(1.0)
    assert roomy.step() == {"G": T, "S": 100, "D": T}
    ceiling = h.make_engine(
        chunked_prefill_size=C, threshold=T, policy=policy, kv_tokens=210_000,
        max_reqs=32, max_context_len=h.context_for(GIANT),
    )  # fmt: skip
    ceiling.add(GIANT, rid="G")
    assert ceiling.step() == {"G": T}
    ceiling.add(100, rid="S")
    ceiling.add(20_000, rid="D")
    assert ceiling.step() == {"G": T, "S": 100}  # D refused for memory, nothing filled


# ---- the flags and the admin call ---------------------------------------------------


def test_reflex_cli_flags_parse():
    from sglang.srt.server_args import prepare_server_args

    flags = "--model-path dummy --long-prefill-token-threshold 4096 --long-prefill-mode reflex"
    a = prepare_server_args([*flags.split(), "--long-prefill-reflex-hold-seconds", "0.5"])
    assert (a.long_prefill_mode, a.long_prefill_reflex_hold_seconds) == ("reflex", 0.5)
    default = prepare_server_args(["--model-path", "dummy"])
    assert default.long_prefill_reflex_hold_seconds == lp.DEFAULT_REFLEX_HOLD_S == 3.0


@pytest.mark.parametrize("hold", [-1.0, math.inf, math.nan])
def test_reflex_start_up_refuses_a_bad_hold(hold):
    from sglang.srt.server_args import ServerArgs

    a = ServerArgs(
        model_path="dummy", chunked_prefill_size=C, page_size=16,
        long_prefill_reflex_hold_seconds=hold,
    )  # fmt: skip
    with pytest.raises(ValueError, match="long_prefill_reflex_hold_seconds must be a finite"):
        lp.check_long_prefill_server_args(a)


def lp_settings(eng):
    s = eng.s
    return (
        s.long_prefill_token_threshold,
        s.long_prefill_mode,
        s.schedule_policy,
        s.long_prefill_reflex_hold_seconds,
    )


def test_reflex_set_internal_state_accepts_the_mode_and_the_hold():
    eng = h.make_engine(chunked_prefill_size=C, threshold=T)
    eng.s._reflex_clock = h.FakeClock()
    eng.add(GIANT, rid="G")
    assert eng.step() == {"G": T}  # ceiling
    out = h.set_internal_state(eng, long_prefill_mode="reflex", long_prefill_reflex_hold_seconds=0)
    assert out.updated and out.reason is None
    assert lp_settings(eng) == (T, "reflex", "fcfs", 0.0)
    state = eng.s._long_prefill_state()
    assert (state["long_prefill_mode"], state["long_prefill_reflex_hold_seconds"]) == ("reflex", 0.0)
    assert eng.step() == {"G": C}  # reflex, no short request: uncapped from the next round
    assert h.set_internal_state(eng, long_prefill_reflex_hold_seconds="1.5").updated
    assert eng.s.long_prefill_reflex_hold_seconds == 1.5


@pytest.mark.parametrize(
    "update",
    [
        {"long_prefill_reflex_hold_seconds": -1},
        {"long_prefill_reflex_hold_seconds": "soon"},
        {"long_prefill_reflex_hold_seconds": "nan"},
        {"long_prefill_reflex_hold_seconds": "inf"},
        {"long_prefill_reflex_hold_seconds": True},
        {"long_prefill_reflex_hold_seconds": [1]},
        # All or nothing: the valid mode is not applied beside the bad hold.
        {"long_prefill_mode": "reflex", "long_prefill_reflex_hold_seconds": -0.5},
    ],
    ids=repr,
)
def test_reflex_a_bad_hold_is_refused_naming_the_field_and_changes_nothing(update):
    eng = h.make_engine(chunked_prefill_size=C, threshold=T, mode="floor", reflex_hold=2.0)
    before = lp_settings(eng)
    out = h.set_internal_state(eng, **update)
    assert out.updated is False
    assert "long_prefill_reflex_hold_seconds must be" in out.reason
    assert lp_settings(eng) == before == (T, "floor", "fcfs", 2.0)
    eng.add(100, rid="after")
    assert eng.step() == {"after": 100}  # still serving


def test_reflex_http_update_and_server_info_report_mode_and_hold(client):  # noqa: F811
    c, eng = client
    body = {"long_prefill_token_threshold": T, "long_prefill_mode": "reflex",
            "long_prefill_reflex_hold_seconds": 0.25}  # fmt: skip
    r = c.post("/set_internal_state", json={"server_args": body})
    assert r.status_code == 200 and r.json()["updated"] is True, r.text
    info = c.get("/get_server_info").json()
    assert (info["long_prefill_mode"], info["long_prefill_reflex_hold_seconds"]) == ("reflex", 0.25)
    r = c.post("/set_internal_state", json={"server_args": {"long_prefill_reflex_hold_seconds": -2}})
    assert r.status_code == 400
    assert "long_prefill_reflex_hold_seconds" in r.json()["reason"]
    assert c.get("/get_server_info").json()["long_prefill_reflex_hold_seconds"] == 0.25
