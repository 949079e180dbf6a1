"""Issue 19 (defects 4-6 and the tight-pool measurement), on the real scheduler:

- srpt's per-pass prefix matching is bounded (``long_prefill.SRPT_REMATCH_MAX``), counted
  by wrapping the real match function the policy calls; the milliseconds are printed by
  ``tests/engine/bench_srpt_cost.py``, not asserted here;
- n-gram-embedding models (LongCat-Flash) are refused with T > 0 or srpt;
- priority preemption counts the partials' KV reservation (``partial_reserve``): it
  preempts nothing when the reservation leaves no room, and still preempts (no more
  than it must) when there is room;
- a tight KV pool: prefill passes of ceiling, floor and pristine."""

from __future__ import annotations

from types import SimpleNamespace

import harness as h
import pytest
from sglang.srt.configs import LongcatFlashConfig
from sglang.srt.managers import long_prefill as lp
from sglang.srt.managers import schedule_policy as sp
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.server_args import ServerArgs

MATCH_NAME = "match_kv_cache" if h.V0523 else "match_prefix_for_req"
"""The prefix-match function schedule_policy's calc_priority calls, per version."""
TUNED = {"long_prefill_token_threshold": 2048}


def counted_matches(monkeypatch, eng):
    """Wrap the real match function and the real calc_priority: the number of prefix
    matches of each calc_priority call (one per scheduling pass)."""
    real_match = getattr(sp, MATCH_NAME)
    count = {"n": 0}
    per_pass: list[int] = []

    def match(*a, **kw):
        count["n"] += 1
        return real_match(*a, **kw)

    monkeypatch.setattr(sp, MATCH_NAME, match)
    policy = eng.s.policy
    real_calc = policy.calc_priority

    def calc(*a, **kw):
        before = count["n"]
        out = real_calc(*a, **kw)
        per_pass.append(count["n"] - before)
        return out

    monkeypatch.setattr(policy, "calc_priority", calc)
    return per_pass


@pytest.mark.parametrize("mode", ["ceiling", "floor"])
def test_srpt_cost_prefix_matches_per_pass_are_bounded(monkeypatch, mode):
    k = lp.SRPT_REMATCH_MAX
    eng = h.make_engine(
        chunked_prefill_size=8192, threshold=2048, mode=mode, policy="srpt", kv_tokens=400_000
    )
    for i in range(3 * k):
        eng.add(512, rid=f"long{i}", arrival=0.0)
    per_pass = counted_matches(monkeypatch, eng)
    eng.step()
    # A short request arriving behind 3K waiting ones (never matched yet, beyond K):
    # ordered by its key all the same, so it is admitted on the next pass.
    eng.add(16, rid="short", arrival=1e-3)
    alloc = eng.step()
    for _ in range(3):
        eng.step()
    print(f"\nsrpt_cost: {len(eng.s.waiting_queue)} waiting, matches per pass {per_pass}")
    assert len(per_pass) == 5 and all(n == k for n in per_pass), per_pass
    assert "short" in alloc


def test_srpt_cost_below_the_bound_every_request_is_rematched(monkeypatch):
    eng = h.make_engine(threshold=2048, policy="srpt")
    for i in range(20):
        eng.add(512 + i, arrival=float(i))
    per_pass = counted_matches(monkeypatch, eng)
    eng.step()
    assert per_pass == [20]


def longcat(**kw):
    """A LongCat-Flash model config (sglang's own LongcatFlashConfig) as server args
    resolve it; its n-gram embedding is on when ``ngram_vocab_size_ratio`` is set."""
    hf = LongcatFlashConfig(**kw)
    hf.architectures = ["LongcatFlashForCausalLM"]
    return SimpleNamespace(is_hybrid_swa=False, hf_config=hf, is_draft_model=False)


@pytest.mark.parametrize("kw", [TUNED, {"schedule_policy": "srpt"}])
def test_ngram_embedding_models_are_refused_at_start(kw):
    a = ServerArgs(model_path="dummy", chunked_prefill_size=8192, page_size=16, **kw)
    model = longcat(ngram_vocab_size_ratio=78)
    assert model.hf_config.use_ngram_embedding  # what ModelConfig.use_ngram_embedding reads
    h.set_model_config(a, model)
    with pytest.raises(ValueError) as e:
        lp.check_long_prefill_server_args(a)
    msg = str(e.value)
    assert "n-gram-embedding" in msg and "LongcatFlashForCausalLM" in msg
    assert "--long-prefill-token-threshold 0" in msg


def test_ngram_stock_settings_and_plain_longcat_start():
    a = ServerArgs(model_path="dummy", chunked_prefill_size=8192, page_size=16)
    h.set_model_config(a, longcat(ngram_vocab_size_ratio=78))
    lp.check_long_prefill_server_args(a)  # T = 0, fcfs: stock, not refused
    assert lp.model_family_reason(longcat()) is None  # no n-gram embedding


def test_ngram_run_time_update_is_refused():
    eng = h.make_engine()
    h.set_model_config(eng.s.server_args, longcat(ngram_vocab_size_ratio=78))
    out = h.set_internal_state(eng, **TUNED)
    assert not out.updated and "n-gram-embedding" in out.reason
    assert eng.s.long_prefill_token_threshold == 0


def preempt_case(kv_tokens: int) -> tuple[h.Engine, dict[str, int]]:
    """Four request slots: two low-priority decodes and two partial prefills hold them,
    so a high-priority arrival can only get in by priority preemption (the adder's
    ``preempt_to_schedule``), whose token count the patch extends by the partials'
    reserved remainder (about 24,000 tokens). Returns the engine and the allocation of
    the pass that considers the arrival."""
    eng = h.make_engine(chunked_prefill_size=8192, threshold=2048, kv_tokens=kv_tokens, max_reqs=4)
    s = eng.s
    s.enable_priority_scheduling = True
    s.enable_priority_preemption = True
    s.priority_scheduling_preemption_threshold = 0
    s.policy = SchedulePolicy("fcfs", s.tree_cache, False, True, False)
    low = [eng.add(100, rid=f"dec{i}", max_new_tokens=2000) for i in range(2)]
    for r in low:
        r.priority = 0
    eng.step()  # both prefilled: they decode from now on
    for rid in "AB":
        eng.add(16_000, rid=rid).priority = 0
    eng.step()  # A and B become partial prefills
    assert [r.rid for r in s.partial_reqs] == ["A", "B"]
    high = eng.add(10_000, rid="high")
    high.priority = 10
    return eng, eng.step()


def test_preempt_counts_the_partials_reservation():
    # A 40,000-token pool: the partials' reservation leaves "high" no room even after
    # preempting both decodes, so neither is preempted for nothing.
    eng, alloc = preempt_case(40_000)
    s = eng.s
    running = [r.rid for r in s.running_batch.reqs]
    waiting = [r.rid for r in s.waiting_queue]
    print(f"\npreempt: alloc {alloc}, running {running}, waiting {waiting}")
    assert "high" not in alloc  # the reservation leaves it no room either way
    assert set(running) >= {"dec0", "dec1"}, "running requests were preempted for nothing"
    assert waiting == ["high"]


@pytest.mark.parametrize(
    ("kv_tokens", "preempted"),
    [(43_000, {"dec0", "dec1"}), (60_000, {"dec1"})],
    ids=["room-after-both", "room-after-one"],
)
def test_preempt_still_happens_when_the_reservation_leaves_room(kv_tokens, preempted):
    """The counterpart of the test above: with the same partials in flight, a pool with
    room for "high" once the partials' reservation is held back still preempts, and no
    more than it must. At 43,000 tokens the room is there only after both decodes go
    (a patch that counted the reservation twice, or never preempted, admits nothing);
    at 60,000 one slot is all "high" lacks, and the most recent low-priority decode
    (dec1, sglang's order) is the one preempted. The preempted decodes give back their
    request slots and KV, go back to the waiting queue, and finish after all."""
    eng, alloc = preempt_case(kv_tokens)
    s = eng.s
    running = {r.rid for r in s.running_batch.reqs}
    waiting = {r.rid for r in s.waiting_queue}
    print(f"\npreempt ({kv_tokens}): alloc {alloc}, running {running}, waiting {waiting}")
    assert "high" in alloc, "high was not admitted although preemption leaves it room"
    assert waiting == preempted
    assert running == {"dec0", "dec1"} - preempted
    decodes = {r.rid: r for r in s.running_batch.reqs + s.waiting_queue}
    for rid in preempted:
        assert h.pool_idx(decodes[rid]) is None, f"{rid} kept its request slot"
    eng.run_to_completion()
    for rid in ("dec0", "dec1"):
        assert len(decodes[rid].output_ids) == 2000, rid  # resumed, not dropped
    assert eng.slots_free() == 4 and eng.kv_free() == kv_tokens


def tight_pool_case(mode: str | None) -> dict:
    engine = {"chunked_prefill_size": 8192, "kv_tokens": 40_000}
    if mode:
        engine.update(threshold=2048, mode=mode)
    reqs = [{"rid": r, "need": 30_000, "max_new": 1, "round": 0} for r in "ABC"]
    return {"kind": "pressure", "engine": engine, "requests": reqs}


def test_tight_pool_prefill_passes_floor_not_worse_than_pristine(pristine):
    ceiling = h.run_pressure(tight_pool_case("ceiling"))
    floor = h.run_pressure(tight_pool_case("floor"))
    stock = pristine({"p": tight_pool_case(None)})["p"]
    print(
        f"\ntight_pool (sglang {'0.5.23' if h.V0523 else '0.5.18'}; three 30,000-token "
        f"prompts, 40,000-token pool, C = 8192, T = 2048): prefill passes ceiling "
        f"{ceiling['prefill_passes']}, floor {floor['prefill_passes']}, pristine "
        f"{stock['prefill_passes']}"
    )
    for out in (ceiling, floor):
        assert out["leak"] == [0, 0]
    assert floor["prefill_passes"] <= stock["prefill_passes"]
