"""SGLang's default event loop (`Scheduler.event_loop_overlap`) with several partial
prefills, through the real result processor (`SchedulerBatchResultProcessor`) and the
real output streamer (`SchedulerOutputStreamer`).

In the overlap loop the next batch is scheduled before the previous batch's result is
processed, so a partial prefill is scheduled again while its last chunk is still in
flight (`inflight_middle_chunks`). Stand-ins: the forward pass (`run_batch` writes each
token's id into its KV slot, as harness.write_and_check_kv, and returns the next token),
request intake (`recv_requests` hands the scripted requests over at their pass), the
detokenizer channel (records what is streamed) and idle-time housekeeping.
"""

from __future__ import annotations

from types import SimpleNamespace

import harness as h
import pytest
import torch
from sglang.srt.managers.scheduler_components.batch_result_processor import (
    SchedulerBatchResultProcessor,
)
from sglang.srt.managers.scheduler_components.logprob_result_processor import (
    SchedulerLogprobResultProcessor,
)
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
from sglang.srt.managers.utils import GenerationBatchResult


class _Detokenizer:
    def __init__(self) -> None:
        self.outputs = []

    def send_output(self, obj, req=None) -> None:
        self.outputs.append(obj)


def overlap_engine(**kw):
    eng = h.make_engine(**kw)
    eng.check_kv = True
    s = eng.s
    s.enable_overlap = True
    s.enable_overlap_mlx = False
    s.is_generation = True
    s.rust_server = None
    s.hisparse_coordinator = None
    s.decode_offload_manager = None
    s.draft_worker = None
    s.model_worker = None
    s.gracefully_exit = False
    s._engine_paused = False
    s.enable_unified_memory = False
    s._prev_step = None
    s.enable_fpm = False
    detok = _Detokenizer()
    s.ipc_channels.send_to_detokenizer = detok
    s.model_config.num_key_value_heads = 1
    s.model_config.think_end_ids = None
    s.model_config.self_opened_think_start_ids = None  # 0.5.23: no reasoning model
    s.ps = SimpleNamespace(pp_size=1, dp_rank=0, attn_tp_rank=0, tp_rank=0)
    # 0.5.23's components read the parallel layout from the published config (no ps)
    # and the result processor takes the beam coordinator instead of server_args.
    since_0523 = {} if h.V0523 else {"ps": s.ps}
    s.output_streamer = SchedulerOutputStreamer(
        send_to_detokenizer=detok,
        tree_cache=s.tree_cache,
        server_args=s.server_args,
        is_generation=True,
        spec_algorithm=s.spec_algorithm,
        disaggregation_mode=s.disaggregation_mode,
        enable_hicache_storage=lambda: False,
        rust_server=None,
        **since_0523,
    )
    s.metrics_reporter = SimpleNamespace(
        num_retracted_reqs=0,
        enable_metrics=False,
        log_batch_result_stats=lambda batch, result: None,
        update_device_timer=lambda: None,
        report_prefill_stats=lambda *a, **k: None,
        report_decode_stats=lambda *a, **k: None,
        num_generated_tokens=0,
        forward_ct_decode=0,
    )
    s.batch_result_processor = SchedulerBatchResultProcessor(
        is_generation=True,
        disaggregation_mode=s.disaggregation_mode,
        enable_overlap=True,
        enable_overlap_mlx=False,
        model_config=s.model_config,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        tree_cache=s.tree_cache,
        hisparse_coordinator=None,
        req_to_token_pool=s.req_to_token_pool,
        decode_offload_manager=None,
        metrics_collector=None,
        metrics_reporter=s.metrics_reporter,
        draft_worker=None,
        model_worker=None,
        logprob_result_processor=SchedulerLogprobResultProcessor(model_config=s.model_config),
        output_streamer=s.output_streamer,
        abort_request=s.abort_request,
        **({"beam_coordinator": s.beam_coordinator} if h.V0523 else {"server_args": s.server_args}),
    )
    return eng, detok


def run_overlap_loop(eng, script, max_passes=20_000):
    """Run the real event_loop_overlap until every scripted request has finished.

    ``script``: [(pass, need, rid, max_new)]. Returns per-pass prefill allocations."""
    s = eng.s
    script = sorted(script)
    reqs = {}
    rounds = []
    state = {"pass": 0}

    def recv_requests():
        n = state["pass"]
        while script and script[0][0] <= n:
            _, need, rid, max_new = script.pop(0)
            reqs[rid] = eng.add(need, rid=rid, arrival=n + 1e-3 * len(reqs), max_new_tokens=max_new)
        state["pass"] = n + 1
        done = not script and all(r.finished() for r in reqs.values())
        if (done and s.last_batch is None and not s.result_queue) or n > max_passes:
            s.gracefully_exit = True
        return []

    def run_batch(batch):
        h.write_and_check_kv(s, batch)
        if batch.forward_mode.is_extend():
            rounds.append({r.rid: h.extend_len(r) for r in batch.reqs})
        # The next token, from the position it takes (output_ids lag in this loop).
        if batch.forward_mode.is_extend():
            ends = [h.extend_end(r) for r in batch.reqs]
        else:
            ends = [int(n) for n in batch.seq_lens.tolist()]
        tokens = [h.token_at(r, end) for r, end in zip(batch.reqs, ends, strict=True)]
        return GenerationBatchResult(next_token_ids=torch.tensor(tokens, dtype=torch.int64))

    s.request_receiver = SimpleNamespace(recv_requests=lambda local_reqs=(): recv_requests())
    if h.V0523:  # 0.5.23's loop takes its input through ingest_requests
        s.ingest_requests = lambda stop_at_pause=False: s.request_receiver.recv_requests()
    s.process_input_requests = lambda recv: None
    s.run_batch = run_batch
    s._apply_war_barrier = lambda: None
    s.launch_batch_sample_if_needed = lambda result, batch: None
    s.on_idle = lambda: None
    s.publish_load_snapshot = lambda force=False: None
    s.load_publisher = SimpleNamespace(publish_load_stat=lambda *a, **k: None)  # router gauge
    s.maybe_send_health_check_signal = lambda: None
    s._record_step_counters = lambda batch, result: None  # step-time metrics
    with h.parallel_ranks(dp_rank=None, attn_tp_rank=0, tp_rank=0):
        s.event_loop_overlap()
    assert state["pass"] <= max_passes + 1, "the loop did not finish"
    return reqs, rounds


@pytest.mark.parametrize(
    "policy, mode", [("fcfs", "ceiling"), ("srpt", "ceiling"), ("lpm", "floor")]
)
def test_overlap_loop_with_several_partials(policy, mode):
    eng, detok = overlap_engine(
        chunked_prefill_size=2048, threshold=512, mode=mode, policy=policy, kv_tokens=12_000
    )
    script = [
        (0, 3_000, "L0", 40),
        (0, 2_600, "L1", 40),
        (0, 2_200, "L2", 40),
        (2, 300, "s0", 60),
        (5, 700, "s1", 60),
        (9, 100, "s2", 60),
    ]
    reqs, rounds = run_overlap_loop(eng, script)
    # Every request finished with its whole output, in order (7, 8, 9, ...).
    for _, _need, rid, max_new in script:
        assert list(reqs[rid].output_ids) == [7 + k for k in range(max_new)], rid
    if mode == "ceiling":
        assert max(sum(1 for r in a if r.startswith("L")) for a in rounds) == 3
    # Each prompt was prefilled exactly once, in chunks (no retraction in this pool).
    for _, need, rid, _ in script:
        assert sum(a.get(rid, 0) for a in rounds) == need
    # The streamer never streamed a request mid-prefill: each request's first streamed
    # output came with its first token, after its last chunk.
    streamed = [
        (rid, out.completion_tokens[i]) for out in detok.outputs for i, rid in enumerate(out.rids)
    ]
    assert {rid for rid, _ in streamed} == set(reqs)
    assert all(n >= 1 for _, n in streamed), "a request was streamed before its first token"
    assert eng.kv_free() == eng.kv_free_at_start
    assert eng.slots_free() == eng.slots_free_at_start
