"""--enable-deterministic-inference with the long-prefill threshold (issue 19, defect 1).

Deterministic inference makes SGLang align every truncated prefill chunk to
``Scheduler.truncation_align_size`` (4096 with the flashinfer prefill backend, and with
0.5.18's triton; ``init_deterministic_inference_config``): stock's ``PrefillAdder`` cuts a
chunk down to a multiple of it and gives a chunk shorter than it nothing
(``AddReqResult.OTHER``). A threshold T below the alignment therefore never prefills a
capped request (the engine hangs), and a T that is not a multiple of it breaks the
determinism guarantee. The patch refuses both, at start and on a hot update, and keeps the
alignment on the partials' later chunks (``add_partial_req``, ``expand_partials_floor``),
which stock's truncation never sees.

The harness builds the scheduler without ``Scheduler.__init__`` (which needs a GPU model
runner), so it sets ``truncation_align_size`` as ``init_deterministic_inference_config``
would, and calls the start-up check that ``__init__`` runs after it.
"""

from __future__ import annotations

import inspect

import harness as h
import pytest
from sglang.srt.managers.scheduler import Scheduler

ALIGN = 4096


def aligned_engine(**kw):
    eng = h.make_engine(**kw)
    eng.s.truncation_align_size = ALIGN  # --enable-deterministic-inference, flashinfer
    return eng


@pytest.mark.parametrize("t", [2048, 6144])
def test_deterministic_hot_update_off_the_alignment_is_refused(t):
    # T = 2048: a capped request would never prefill; T = 6144: chunks of 4096 + 2048.
    eng = aligned_engine(chunked_prefill_size=16_384)
    out = h.set_internal_state(eng, long_prefill_token_threshold=t)
    assert not out.updated
    assert "multiple of the prefill truncation alignment 4096" in out.reason
    assert "--enable-deterministic-inference" in out.reason
    assert eng.s.long_prefill_token_threshold == 0


@pytest.mark.parametrize("t", [4096, 8192])
def test_deterministic_hot_update_on_the_alignment_is_taken(t):
    eng = aligned_engine(chunked_prefill_size=16_384)
    assert h.set_internal_state(eng, long_prefill_token_threshold=t).updated
    assert eng.s.long_prefill_token_threshold == t
    # Turning it off is always allowed.
    assert h.set_internal_state(eng, long_prefill_token_threshold=0).updated


@pytest.mark.parametrize("t", [2048, 6144])
def test_deterministic_start_refuses_a_threshold_off_the_alignment(t):
    eng = aligned_engine(chunked_prefill_size=16_384, threshold=t)
    with pytest.raises(ValueError, match="multiple of the prefill truncation alignment 4096"):
        eng.s.check_long_prefill_alignment()


def test_deterministic_start_accepts_an_aligned_threshold_and_no_alignment():
    aligned_engine(chunked_prefill_size=16_384, threshold=8192).s.check_long_prefill_alignment()
    h.make_engine(chunked_prefill_size=16_384, threshold=2048).s.check_long_prefill_alignment()


def test_deterministic_start_check_runs_after_the_alignment_is_known():
    # Scheduler.__init__ cannot run on CPU (it builds the model runner), so this reads it:
    # the check must come after every step that sets truncation_align_size.
    src = inspect.getsource(Scheduler.__init__)
    assert "self.check_long_prefill_alignment()" in src
    check = src.index("self.check_long_prefill_alignment()")
    for step in (
        "self.init_deterministic_inference_config()",
        "self.init_dsa_kpool_truncation_align()",
        "self.init_mamba_truncation_align()",
    ):
        if step in src:  # the last two are 0.5.23's
            assert src.index(step) < check, step


NEEDS = [5_000, 9_000, 13_000, 6_000, 20_000, 2_500, 11_000]
SHORT = [300, 700, 150, 900]


@pytest.mark.parametrize("policy", ["fcfs", "srpt", "lpm"])
@pytest.mark.parametrize("mode", ["ceiling", "floor"])
def test_deterministic_every_truncated_chunk_keeps_the_alignment(mode, policy):
    eng = aligned_engine(chunked_prefill_size=12_288, threshold=ALIGN, mode=mode, policy=policy)
    need = {}
    for i, n in enumerate(NEEDS):
        need[eng.add(n, rid=f"L{i}", arrival=float(i)).rid] = n
    done = dict.fromkeys(need, 0)
    shorts = list(SHORT)
    for step in range(400):
        if step % 2 == 1 and shorts:  # short prompts keep arriving among the long ones
            n = shorts.pop(0)
            rid = eng.add(n, rid=f"s{step}", arrival=100.0 + step).rid
            need[rid], done[rid] = n, 0
        if not eng.busy() and not shorts:
            break
        for rid, n in eng.step().items():
            done[rid] += n
            if done[rid] < need[rid]:  # a truncated chunk: the request stays partial
                assert n % ALIGN == 0, (step, rid, n, dict(done))
    assert done == need, "every request prefilled completely"
    assert eng.kv_free() == eng.kv_free_at_start


def test_deterministic_a_partial_behind_a_short_prompt_keeps_the_alignment():
    # srpt in ceiling mode orders the partials among the waiting requests: a short prompt
    # that arrived early goes first, and the last partial gets what is left of the
    # budget (12288 - 300 - 2 * 4096 = 3796): not a multiple of 4096, so nothing.
    eng = aligned_engine(chunked_prefill_size=12_288, threshold=ALIGN, policy="srpt")
    for i in range(3):
        eng.add(20_000, rid=f"L{i}", arrival=float(i))
    assert eng.step() == {"L0": ALIGN, "L1": ALIGN, "L2": ALIGN}
    eng.add(300, rid="s", arrival=0.5)
    alloc = eng.step()
    assert alloc.get("s") == 300, alloc
    assert sorted(alloc.values()) == [300, ALIGN, ALIGN], alloc
    eng.run_to_completion()
    assert eng.kv_free() == eng.kv_free_at_start
