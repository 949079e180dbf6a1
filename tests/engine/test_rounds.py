"""Multi-round runs to completion: every request finishes and nothing leaks."""

from __future__ import annotations

import harness as h
import pytest


@pytest.mark.parametrize(
    "engine",
    [
        {},
        {"threshold": 2048},
        {"threshold": 2048, "mode": "floor"},
        {"threshold": 1024, "policy": "srpt"},
        {"threshold": 1024, "mode": "floor", "policy": "srpt"},
        {"threshold": 512, "page_size": 16},
    ],
    ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "stock",
)
def test_runs_to_completion_without_leaks(engine):
    eng = h.make_engine(chunked_prefill_size=4096, **engine)
    reqs = [eng.add(n) for n in (60_000, 70, 9_000, 25_000, 4_096, 1)]
    rounds = eng.run_to_completion()
    assert rounds > 0
    assert all(r.finished() for r in reqs)
    assert sum(sum(a.values()) for a in eng.rounds) == sum(len(r.origin_input_ids) for r in reqs)
    assert eng.slots_free() == eng.slots_free_at_start
    assert eng.kv_free() == eng.kv_free_at_start
    if engine.get("threshold"):
        assert max(len(a) for a in eng.rounds) >= 2, "several prefills never ran together"


@pytest.mark.parametrize(
    "engine",
    [{}, {"threshold": 2048}, {"threshold": 2048, "mode": "floor"}],
    ids=["stock", "ceiling", "floor"],
)
def test_abort_mid_prefill_releases_everything(engine):
    eng = h.make_engine(chunked_prefill_size=4096, **engine)
    long_a = eng.add(50_000, rid="a")
    long_b = eng.add(50_000, rid="b")
    short = eng.add(300, rid="c")
    for _ in range(3):
        eng.step()
    assert not long_a.finished()
    h.abort(eng, "a")
    eng.step()
    assert long_a.finished()
    assert long_a.rid not in {r.rid for r in getattr(eng.s, "partial_reqs", [])}
    assert eng.s.chunked_req is not long_a
    sent = eng.s.ipc_channels.send_to_tokenizer.sent
    assert any(getattr(o, "rid", None) == "a" for o in sent), "the tokenizer was not told"
    eng.run_to_completion()
    assert long_b.finished() and short.finished()
    assert eng.slots_free() == eng.slots_free_at_start
    assert eng.kv_free() == eng.kv_free_at_start


def test_threshold_change_mid_run_drains_partials_and_matches_budget():
    eng = h.make_engine(chunked_prefill_size=4096, threshold=1024)
    for _ in range(4):
        eng.add(20_000)
    eng.step()
    assert len(eng.s.partial_reqs) == 4
    assert h.set_internal_state(eng, long_prefill_token_threshold=0).updated
    alloc = eng.step()
    # T = 0: no cap; the partials in progress still go first, oldest first.
    assert alloc == {"r1": 4096}
    eng.run_to_completion()
    assert eng.slots_free() == eng.slots_free_at_start
    assert eng.kv_free() == eng.kv_free_at_start
    assert eng.s.partial_reqs == [] and eng.s.chunked_req is None


@pytest.mark.parametrize(
    "engine",
    [{}, {"threshold": 1024}, {"threshold": 1024, "mode": "floor"}],
    ids=["stock", "ceiling", "floor"],
)
def test_retraction_of_partial_prefills_then_completion(engine):
    """`pause_generation(mode="retract")` (used around weight updates) retracts every
    partial prefill like stock's chunked request, and they complete after resuming."""
    from types import SimpleNamespace

    from sglang.srt.managers.io_struct import PauseGenerationReqInput

    eng = h.make_engine(chunked_prefill_size=4096, **engine)
    reqs = [eng.add(20_000) for _ in range(3)]
    eng.step()
    eng.step()
    s = eng.s
    # Stand-ins for what pause_generation touches besides the scheduling state.
    s.hisparse_coordinator = None
    s.max_queued_requests = None
    s.kv_events_publisher = SimpleNamespace(publish_kv_events=lambda: None)
    s.metrics_reporter = SimpleNamespace(
        last_gen_throughput=0.0, current_scheduler_metrics_enabled=False
    )
    s.pause_generation(PauseGenerationReqInput(mode="retract"))
    assert len(s.waiting_queue) == 3
    assert s.chunked_req is None and getattr(s, "partial_reqs", []) == []
    assert eng.slots_free() == eng.slots_free_at_start
    assert eng.kv_free() == eng.kv_free_at_start
    s._engine_paused = False
    eng.run_to_completion()
    assert all(r.finished() for r in reqs)
    assert eng.slots_free() == eng.slots_free_at_start
    assert eng.kv_free() == eng.kv_free_at_start


def test_partial_prefills_cache_their_computed_prefix():
    """Each partial's computed chunks go into the radix cache, as stock does for its one
    chunked request: a later request with the same prompt finds them."""
    eng = h.make_engine(chunked_prefill_size=4096, threshold=1024)
    reqs = [eng.add(20_000) for _ in range(3)]
    for _ in range(3):
        eng.step()
    # Rounds 1 and 2 gave each partial 1024 tokens; round 3 stashed round 2's chunk.
    for r in reqs:
        assert h.prefix_len(r) == 2048
        match = eng.s.tree_cache.match_prefix(
            h.MatchPrefixParams(key=h.RadixKey(token_ids=r.origin_input_ids[:5000]))
        )
        assert h.matched_len(match) == 2048
