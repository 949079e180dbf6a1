"""Drive sglang 0.5.18's real scheduler code on CPU, round by round, without a model.

Real objects: `Req`, `ReqToTokenPool`, `MHATokenToKVPool` (1 layer, 1 head, head_dim 1),
`TokenToKVPoolAllocator` / `PagedTokenToKVPoolAllocator`, `RadixCache`, `SchedulePolicy`,
`PrefillAdder`, `ScheduleBatch` and `Scheduler.get_next_batch_to_run` /
`_get_new_batch_prefill_raw` / `abort_request` / `set_internal_state` on a
`Scheduler.__new__` object given the attributes those methods read.

Stand-ins (no GPU, no model, so no forward pass runs):
- `_StandInWorker`: the tp_worker; only `model_runner.attn_backend` and
  `prefill_aware_swa` are read by the prefill path.
- `_StandInTokenizerChannel`: records what the scheduler sends to the tokenizer (aborts).
- `finish_prefill_round`: stands in for `process_batch_result_prefill` after the
  forward pass: it does what that method does with the scheduler state (a middle
  chunk decrements `inflight_middle_chunks`; a finished prefill appends its one output
  token, finishes on length and releases its KV with `release_kv_cache`).
- `_NaivePagedKernel`: the paged allocator's Triton kernel, replaced by sglang's own
  pure-torch `alloc_extend_naive` (page_size > 1 only); `_NaivePagedDecodeKernel` the
  same for decode (a few lines of Python: sglang has no pure-torch one).
- `finish_decode_round`: stands in for `process_batch_result_decode`; decode passes
  otherwise run the real `update_running_batch` (decode memory check, retraction with
  SGLang's new-token-ratio tracker, `prepare_for_decode` allocation).
- `write_and_check_kv`: the forward pass's KV writes (each slot gets its token id).
- `_Passthrough`: dp-attention adapter and n-gram manager (both no-ops here).

Run as a script (`python harness.py CASES_JSON`) it prints the allocations of the cases
as JSON: tests use that to run the same cases against the pristine, unpatched sglang in a
subprocess.
"""

from __future__ import annotations

import json
import sys
import time
from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.io_struct import AbortReq, SetInternalStateReq
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import (
    NewTokenRatioTracker,
)
from sglang.srt.mem_cache.allocator import (
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    paged,
)
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams  # noqa: F401 (tests)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.chunk_cache import ChunkCache
from sglang.srt.mem_cache.common import release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: F401
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

PATCHED = hasattr(Scheduler, "_get_new_batch_prefill_long")


class _NaivePagedKernel:
    """Stand-in for the Triton `alloc_extend_kernel` of the paged allocator (Triton has
    no CPU driver): sglang's own pure-torch `alloc_extend_naive`, same arguments."""

    def __getitem__(self, grid: Any) -> Any:
        def launch(prefix_lens, seq_lens, last_loc, free_pages, out_indices, _bs_pow2, page):
            paged.alloc_extend_naive(
                prefix_lens, seq_lens, last_loc, free_pages, out_indices, page, out_indices.device
            )

        return launch


class _NaivePagedDecodeKernel:
    """Stand-in for the Triton `alloc_decode_kernel`: the token of a sequence whose new
    length starts a page takes the next free page; any other continues its last page."""

    def __getitem__(self, grid: Any) -> Any:
        def launch(seq_lens, last_loc, free_pages, out_indices, _bs_pow2, page):
            k = 0
            for i, n in enumerate(seq_lens.tolist()):
                if (n - 1) % page == 0:
                    out_indices[i] = free_pages[k] * page
                    k += 1
                else:
                    out_indices[i] = last_loc[i] + 1

        return launch


paged.alloc_extend_kernel = _NaivePagedKernel()
paged.alloc_decode_kernel = _NaivePagedDecodeKernel()


class _Passthrough:
    def maybe_prepare_mlp_sync_batch(self, batch: Any, need_sync: bool = False) -> Any:
        return batch

    def prepare_for_forward(self, batch: Any, chunked_req: Any = None) -> Any:
        return batch


class _StandInTokenizerChannel:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_output(self, obj: Any, req: Any = None) -> None:
        self.sent.append(obj)


class _StandInWorker:
    def __init__(self) -> None:
        self.model_runner = SimpleNamespace(attn_backend=SimpleNamespace(), prefill_aware_swa=False)


@dataclass
class Engine:
    """One scheduler on CPU plus the pools it allocates from."""

    scheduler: Scheduler
    kv_free_at_start: int
    slots_free_at_start: int
    next_id: int = 0
    rounds: list[dict[str, int]] = field(default_factory=list)
    check_kv: bool = False
    """Write each computed token's id into its KV slot and check every pass that a
    request's KV holds exactly its own tokens (see write_and_check_kv)."""
    decode_passes: int = 0

    @property
    def s(self) -> Scheduler:
        return self.scheduler

    def add(
        self,
        need: int,
        rid: str | None = None,
        prefix: list[int] | None = None,
        arrival: float | None = None,
        max_new_tokens: int = 1,
        ignore_eos: bool = False,
    ) -> Req:
        """Queue a request of `need` fresh tokens after an optional shared `prefix`."""
        self.next_id += 1
        rid = rid or f"r{self.next_id}"
        base = 1_000_000 + self.next_id * 10_000_000  # token ids unique to this request
        ids = array("q", (prefix or []) + list(range(base, base + need)))
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=ignore_eos
        )
        params.normalize(None)
        req = Req(rid, "", ids, params, vocab_size=1 << 40)
        req.time_stats.wait_queue_entry_time = time.perf_counter() if arrival is None else arrival
        self.s.waiting_queue.append(req)
        return req

    def step(self) -> dict[str, int]:
        """One scheduling round: the prefill allocation {rid: tokens} (may be empty;
        a decode pass, when requests decode, shows as {})."""
        plan = self.s.get_next_batch_to_run(self.s.running_batch, self.s.last_batch)
        self.s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        alloc: dict[str, int] = {}
        if batch is not None and batch.forward_mode.is_extend():
            alloc = {r.rid: r.extend_range.length for r in batch.reqs}
            if self.check_kv:
                write_and_check_kv(self.s, batch)
            finish_prefill_round(self.s, batch)
        elif batch is not None and batch.forward_mode.is_decode():
            if self.check_kv:
                write_and_check_kv(self.s, batch)
            finish_decode_round(self.s, batch)
            self.decode_passes += 1
        self.s.last_batch = batch
        self.rounds.append(alloc)
        return alloc

    def run_to_completion(self, max_rounds: int = 10_000) -> int:
        for n in range(max_rounds):
            if not self.busy():
                return n
            self.step()
        raise AssertionError(f"not finished after {max_rounds} rounds")

    def busy(self) -> bool:
        s = self.s
        return bool(
            s.waiting_queue
            or s.chunked_req is not None
            or getattr(s, "partial_reqs", None)
            or any(not r.finished() for r in s.running_batch.reqs)
            or (s.last_batch is not None and any(not r.finished() for r in s.last_batch.reqs))
        )

    def kv_free(self) -> int:
        """Free KV slots, counting what the prefix cache could evict."""
        return (
            self.s.token_to_kv_pool_allocator.available_size() + self.s.tree_cache.evictable_size()
        )

    def slots_free(self) -> int:
        return self.s.req_to_token_pool.available_size()


def finish_prefill_round(s: Scheduler, batch: ScheduleBatch) -> None:
    """Stand-in for `process_batch_result_prefill` after the (absent) forward pass."""
    for req in batch.reqs:
        if req.finished() and req.inflight_middle_chunks <= 0:
            continue
        if req.inflight_middle_chunks > 0:
            req.inflight_middle_chunks -= 1
            continue
        # The k-th output token is 7 + k: what a deterministic model would produce,
        # the same whether or not the request was retracted and re-prefilled.
        req.output_ids.append(len(req.output_ids) + 7)
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, s.tree_cache)


KV_ID_MOD = 1_000_003
"""Token ids are stored in the one-element KV slots modulo this prime (exact in float32)."""


def token_at(req: Req, pos: int) -> int:
    """The token at position ``pos`` of a request: its prompt, then the outputs of the
    deterministic stand-in model (the k-th output is 7 + k). Known without the output
    list, which lags one token behind the scheduled batch in the overlap loop."""
    n = len(req.origin_input_ids)
    return req.origin_input_ids[pos] if pos < n else 7 + (pos - n)


def write_and_check_kv(s: Scheduler, batch: ScheduleBatch) -> None:
    """Stand-in for the forward pass's KV writes, with a check no real model makes:
    the KV of every position a request attends to holds that request's token there.

    Each computed position's slot gets its token id; then each request's whole context
    [0, seq_len) is read back through req_to_token. A slot handed to two requests, a
    chunk skipped, or a decode over KV never written fails here."""
    kv = s.token_to_kv_pool_allocator.get_kvcache()
    buf = kv.k_buffer[0]
    table = s.req_to_token_pool.req_to_token
    seq_lens = batch.seq_lens.tolist() if batch.forward_mode.is_decode() else None
    for i, req in enumerate(batch.reqs):
        if seq_lens is None:
            start, end = req.extend_range.start, req.extend_range.end
        else:  # decode: the new token sits at position seq_len - 1
            end = int(seq_lens[i])
            start = end - 1
        locs = table[req.req_pool_idx, start:end].to(torch.int64)
        vals = torch.tensor(
            [token_at(req, p) % KV_ID_MOD for p in range(start, end)], dtype=buf.dtype
        )
        buf[locs] = vals.view(-1, 1, 1)
        if seq_lens is not None and end % 64 and not _last_decode(req):
            continue  # the whole context is re-read every 64 tokens and at the end
        ctx = table[req.req_pool_idx, :end].to(torch.int64)
        got = buf[ctx].view(-1).to(torch.int64).tolist()
        want = [token_at(req, p) % KV_ID_MOD for p in range(end)]
        if got != want:
            bad = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
            raise AssertionError(
                f"{req.rid}: KV at position {bad} holds {got[bad]}, not {want[bad]}"
            )


def _last_decode(req: Req) -> bool:
    return len(req.output_ids) + 1 >= req.sampling_params.max_new_tokens


def finish_decode_round(s: Scheduler, batch: ScheduleBatch) -> None:
    """Stand-in for `process_batch_result_decode`: one output token per request; a
    finished request releases its KV with `release_kv_cache`."""
    for req in batch.reqs:
        if req.finished():
            continue
        req.output_ids.append(len(req.output_ids) + 7)
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, s.tree_cache)


def make_engine(
    chunked_prefill_size: int = 8192,
    threshold: int = 0,
    mode: str = "ceiling",
    policy: str = "fcfs",
    page_size: int = 1,
    kv_tokens: int = 1_700_000,
    max_reqs: int = 256,
    max_prefill_tokens: int = 16384,
    aging: float = 4096.0,
    max_partials: int = 8,
    radix_cache: bool = True,
) -> Engine:
    extra: dict[str, Any] = {}
    if PATCHED:
        extra = dict(
            long_prefill_token_threshold=threshold,
            long_prefill_mode=mode,
            srpt_aging_tokens_per_s=aging,
            max_partial_prefills=max_partials,
        )
    elif threshold:
        raise ValueError("a threshold needs the patched sglang")
    args = ServerArgs(
        model_path="dummy",
        chunked_prefill_size=chunked_prefill_size,
        page_size=page_size,
        max_prefill_tokens=max_prefill_tokens,
        schedule_policy=policy,
        attention_backend="torch_native",
        disable_overlap_schedule=True,
        pp_max_micro_batch_size=max_reqs,
        device="cpu",
        **extra,
    )
    set_global_server_args_for_scheduler(args)

    # A prompt never exceeds the pool; a smaller table keeps small-pool engines cheap.
    max_ctx = min(700_000, kv_tokens + 1024)
    req_pool = ReqToTokenPool(
        size=max_reqs, max_context_len=max_ctx, device="cpu", enable_memory_saver=False
    )
    kv = MHATokenToKVPool(
        size=kv_tokens,
        page_size=page_size,
        dtype=torch.float32,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(kv_tokens, torch.float32, "cpu", kv, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(
            kv_tokens, page_size, torch.float32, "cpu", kv, need_sort=False
        )
    params = CacheInitParams(
        disable=not radix_cache,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        chunked_prefill_size=chunked_prefill_size,
    )
    # --disable-radix-cache: the scheduler builds a ChunkCache, as here.
    tree = RadixCache(params) if radix_cache else ChunkCache(params)

    s = Scheduler.__new__(Scheduler)
    s.server_args = args
    s.page_size = page_size
    s.chunked_prefill_size = chunked_prefill_size
    s.max_prefill_tokens = max_prefill_tokens
    s.schedule_policy = policy
    s.enable_priority_scheduling = False
    s.schedule_low_priority_values_first = False
    s.enable_hierarchical_cache = False
    s.enable_hicache_storage = False
    s.enable_priority_preemption = False
    s.priority_scheduling_preemption_threshold = 0
    s.is_hybrid_swa = False
    s.enable_lora = False
    s.enable_overlap = False
    s.enable_hisparse = False
    s.enable_fpm = False
    s.enable_dynamic_chunking = False
    s.is_mixed_chunk = False
    s.dllm_config = None
    s.require_mlp_sync = False
    s.truncation_align_size = None
    s.min_free_slots_delayer = None
    s.prefill_delayer = None
    s.max_prefill_bs = 0
    s.max_running_requests = max_reqs
    s.req_to_token_pool = req_pool
    s.token_to_kv_pool_allocator = allocator
    s.tree_cache = tree
    s.waiting_queue = []
    s.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
    s.last_batch = None
    s.chunked_req = None
    s._pending_chunked_abort_req = None
    s.tp_worker = _StandInWorker()
    s.model_config = SimpleNamespace(
        vocab_size=1 << 40, is_multimodal=False, is_encoder_decoder=False
    )
    s.spec_algorithm = SimpleNamespace(is_none=lambda: True)
    s.dp_attn_adapter = _Passthrough()
    s.ngram_embedding_manager = _Passthrough()
    s.ipc_channels = SimpleNamespace(send_to_tokenizer=_StandInTokenizerChannel())
    # The real tracker (SGLang's defaults: starts at 0.7, decays to 0.1 per decode
    # pass, re-estimated on retraction): it sizes the decode reservation.
    s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
    s.metrics_reporter = SimpleNamespace(num_retracted_reqs=0, enable_metrics=False)
    s.forward_ct = 0
    s.max_queued_requests = None
    s.grammar_manager = SimpleNamespace(
        has_waiting_grammars=lambda: False, abort_requests=lambda recv_req: None
    )
    s.load_inquirer = SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
    s.device = "cpu"
    s.ps = SimpleNamespace(pp_size=1)
    s.disaggregation_mode = DisaggregationMode.NULL
    if PATCHED:
        s.partial_reqs = []
        s._pending_partial_aborts = []
        s.long_prefill_token_threshold = threshold
        s.long_prefill_mode = mode
        s.srpt_aging_tokens_per_s = aging
        s.max_partial_prefills = max_partials
        s.metrics_collector = None
    s.policy = SchedulePolicy(policy, tree, False, False, False)
    if PATCHED:
        s.policy.srpt_aging_tokens_per_s = aging
    eng = Engine(s, 0, 0)
    eng.kv_free_at_start = eng.kv_free()
    eng.slots_free_at_start = eng.slots_free()
    return eng


def abort(eng: Engine, rid: str) -> None:
    eng.s.abort_request(AbortReq(rid=rid))


def set_internal_state(eng: Engine, **server_args: Any) -> Any:
    return eng.s.set_internal_state(SetInternalStateReq(server_args=server_args))


# ---- cases shared by the patched (in-process) and pristine (subprocess) runs -----------


def run_case(case: dict[str, Any]) -> list[dict[str, int]]:
    """A case: engine kwargs, requests [{need, prefix_len?, rid}], rounds to record."""
    eng = make_engine(**case.get("engine", {}))
    prefix = list(range(1, 1 + case.get("shared_prefix", 0)))
    if case.get("warm_prefix"):
        # Put the shared prefix in the radix cache first, as a finished request would.
        eng.add(len(prefix), rid="warm", prefix=[])
        eng.s.waiting_queue[-1].origin_input_ids = array("q", prefix)
        eng.run_to_completion()
        eng.rounds.clear()
    for i, r in enumerate(case["requests"]):
        eng.add(
            r["need"],
            rid=r["rid"],
            prefix=prefix if r.get("cached") else None,
            arrival=float(r.get("arrival", i)),
        )
    rounds = case.get("rounds")
    if rounds is None:
        eng.run_to_completion()
    else:
        for _ in range(rounds):
            eng.step()
    return eng.rounds


def run_pressure(case: dict[str, Any]) -> dict[str, Any]:
    """A KV-pressure case: requests [{rid, need, max_new, round}] join the queue at
    their round; runs until every request has finished, checking the KV content of
    every pass (write_and_check_kv), progress on every pass that has work, and no leak.

    Returns each request's output tokens, the retractions and the pass counts."""
    eng = make_engine(**case.get("engine", {}))
    eng.check_kv = True
    pending = sorted(case["requests"], key=lambda r: r.get("round", 0))
    reqs: dict[str, Req] = {}
    retractions = max_partials_seen = idle_run = 0
    n = 0
    while pending or eng.busy():
        while pending and pending[0].get("round", 0) <= n:
            r = pending.pop(0)
            reqs[r["rid"]] = eng.add(
                r["need"],
                rid=r["rid"],
                arrival=float(n) + len(reqs) * 1e-3,
                max_new_tokens=r["max_new"],
            )
        busy = eng.busy()
        eng.s.metrics_reporter.num_retracted_reqs = 0
        before = eng.decode_passes
        alloc = eng.step()
        retractions += eng.s.metrics_reporter.num_retracted_reqs
        idle_run = idle_run + 1 if busy and not alloc and eng.decode_passes == before else 0
        # Stock itself spends one empty pass when the last decode leaves a full batch
        # (batch_is_full is reset by that pass); two in a row is a stall.
        if idle_run >= 2:
            raise AssertionError(f"pass {n}: work pending but nothing ran twice in a row")
        max_partials_seen = max(max_partials_seen, len(getattr(eng.s, "partial_reqs", [])))
        n += 1
        if n > 50_000:
            raise AssertionError("not finished")
    # The last pass's finished requests leave the running batch on the next round.
    eng.s.get_next_batch_to_run(eng.s.running_batch, eng.s.last_batch)
    leak = (eng.kv_free_at_start - eng.kv_free(), eng.slots_free_at_start - eng.slots_free())
    return {
        "outputs": {rid: list(r.output_ids) for rid, r in reqs.items()},
        "retractions": retractions,
        "prefill_passes": sum(1 for a in eng.rounds if a),
        "decode_passes": eng.decode_passes,
        "max_partials": max_partials_seen,
        "leak": list(leak),
    }


if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    out: dict[str, Any] = {
        name: run_pressure(c) if c.get("kind") == "pressure" else run_case(c)
        for name, c in cases.items()
    }
    out["_patched"] = PATCHED
    print(json.dumps(out))
