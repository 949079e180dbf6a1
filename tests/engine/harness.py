"""Drive sglang's real scheduler (0.5.18 or 0.5.23) on CPU, round by round, without a model.

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
- `FakeClock`: the clock reflex mode's hold reads (`Scheduler._reflex_clock`,
  `time.monotonic` in the engine), moved by the test so the hold is deterministic.

Run as a script (`python harness.py CASES_JSON`) it prints the allocations of the cases
as JSON; `python harness.py --serve` answers one line of cases per line of stdin. The
tests keep one serving process on the pristine, unpatched sglang to run the same cases
against.
"""

from __future__ import annotations

import collections
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
from sglang.srt.mem_cache.common import release_kv_cache as _release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: F401
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

PATCHED = hasattr(Scheduler, "_get_new_batch_prefill_long")
V0523 = not hasattr(Req, "set_extend_range")
"""sglang 0.5.23's Req: ``prefix_len`` / ``extend_end`` / ``kv`` (0.5.18: ``prefix_indices``,
``extend_range``, ``req_pool_idx``); the helpers below read either."""


def extend_len(req: Req) -> int:
    """Tokens the request computes in the batch just scheduled."""
    return req.extend_len if V0523 else req.extend_range.length


def extend_bounds(req: Req) -> tuple[int, int]:
    """The positions [start, end) the request computes in the batch just scheduled."""
    if V0523:
        return req.prefix_len, req.extend_end
    return req.extend_range.start, req.extend_range.end


def prefix_len(req: Req) -> int:
    """Tokens of the request already computed (its cached prefix included)."""
    return req.prefix_len if V0523 else len(req.prefix_indices)


def pool_idx(req: Req) -> int:
    return req.kv.req_pool_idx if V0523 else req.req_pool_idx


def extend_end(req: Req) -> int | None:
    """Where the request's last scheduled chunk ends (None before its first)."""
    if V0523:
        return req.extend_end
    return req.extend_range.end if req.extend_range is not None else None


def match_prefix(tree_cache: Any, req: Req) -> None:
    """Match the request's tokens in the prefix cache and adopt the hit as its prefix."""
    if V0523:
        from sglang.srt.mem_cache.common import match_kv_cache

        match_kv_cache(req, tree_cache)
    else:
        from sglang.srt.managers.schedule_policy import match_prefix_for_req

        match_prefix_for_req(tree_cache, req)


def set_model_config(server_args: Any, model_config: Any) -> None:
    """The model config resolution attaches to the server args (0.5.23 memoizes it as
    ``_model_config``, see ``arg_groups.model_override_base.model_config_of``)."""
    setattr(server_args, "_model_config" if V0523 else "model_config", model_config)


def server_args_dict(server_args: Any) -> dict[str, Any]:
    """The server args as the info endpoints serialize them."""
    if V0523:
        import msgspec

        return msgspec.structs.asdict(server_args)
    import dataclasses

    return dataclasses.asdict(server_args)


def set_launch_args(server_args: Any, **fields: Any) -> None:
    """Give the server args ``fields`` as if they were launch flags (``--pp-size 2``).

    0.5.23 seals its server args once resolved (a run-time change goes through
    ``get_context().override``, which the resolved config bags read, not the record);
    the launch record itself is written here with msgspec's own setter, as the
    constructor would have."""
    for name, value in fields.items():
        if V0523:
            import msgspec

            msgspec.Struct.__setattr__(server_args, name, value)
        else:
            setattr(server_args, name, value)


def matched_len(match: Any) -> int:
    """Tokens a prefix-cache match found on the device (0.5.23's ``MatchResult`` has
    ``device_prefix_len`` where 0.5.18's had ``device_indices``)."""
    return match.device_prefix_len if V0523 else len(match.device_indices)


def resolved(server_args: Any) -> Any:
    """The server args as resolution left them (0.5.23 keeps its decisions, such as the
    DP division of the chunk size, as declarations beside the launch record)."""
    if V0523:
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(server_args)
    return server_args


def divide_chunk_by_dp(server_args: Any) -> None:
    """SGLang's own division of --chunked-prefill-size by the attention-DP size (the
    resolution step that does it; its later steps need a resolved CUDA-graph config,
    which a CPU run has not)."""
    import contextlib

    if V0523:
        from sglang.srt.arg_groups import parallel_hook

        parallel_hook.handle_deprecated_dp_attention(server_args)
        with contextlib.suppress(AttributeError):
            parallel_hook.handle_data_parallelism(server_args)
    else:
        with contextlib.suppress(AttributeError):
            server_args._handle_data_parallelism()


def parallel_ranks(**ranks: Any) -> Any:
    """A context where this process states its parallel ranks (one engine, no DP
    controller): 0.5.23's components read them from ``get_parallel()``, 0.5.18's from
    the scheduler's ``ps`` (set by the caller)."""
    import contextlib

    if not V0523:
        return contextlib.nullcontext()
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().override(**ranks)


def release_kv_cache(req: Req, tree_cache: Any) -> None:
    """A finished request's KV: into the prefix cache, its slots freed."""
    if V0523:
        _release_kv_cache(req, tree_cache, checkpoint=True)
    else:
        _release_kv_cache(req, tree_cache)


def _disabled_cache(params: CacheInitParams) -> Any:
    """What --disable-radix-cache builds: 0.5.18's ChunkCache, 0.5.23's disabled
    UnifiedRadixCache (mem_cache.registry.default_radix_cache_factory)."""
    if not V0523:
        from sglang.srt.mem_cache.chunk_cache import ChunkCache

        return ChunkCache(params)
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params.tree_components = (ComponentType.FULL,)
    return UnifiedRadixCache(params)


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

    def maybe_convert_decode_to_extend(self, batch: Any) -> Any:  # 0.5.23
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
            alloc = {r.rid: extend_len(r) for r in batch.reqs}
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
            start, end = extend_bounds(req)
        else:  # decode: the new token sits at position seq_len - 1
            end = int(seq_lens[i])
            start = end - 1
        locs = table[pool_idx(req), start:end].to(torch.int64)
        vals = torch.tensor(
            [token_at(req, p) % KV_ID_MOD for p in range(start, end)], dtype=buf.dtype
        )
        buf[locs] = vals.view(-1, 1, 1)
        if seq_lens is not None and end % 64 and not _last_decode(req):
            continue  # the whole context is re-read every 64 tokens and at the end
        ctx = table[pool_idx(req), :end].to(torch.int64)
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


DEFAULT_LONGEST = 65_536
"""The longest request (prompt and output) an engine's request table holds unless its
caller says more: a longer one fails loudly (its token-index write does not fit the row)."""


def context_for(longest: int) -> int:
    """The request table's width for requests of at most `longest` tokens, prompt and
    output, with 1,024 to spare."""
    return longest + 1024


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
    max_context_len: int | None = None,
    reflex_hold: float = 3.0,
) -> Engine:
    """A scheduler on CPU. `max_context_len` is the request table's width: the longest
    request (prompt and output) it holds, by default the pool's size up to
    DEFAULT_LONGEST. The table is `max_reqs` x width int32, zeroed per engine, so its
    width is what an engine costs to make (700K wide, 256 rows: 716 MB):
    callers with longer requests pass `context_for(longest)`."""
    extra: dict[str, Any] = {}
    if PATCHED:
        extra = dict(
            long_prefill_token_threshold=threshold,
            long_prefill_mode=mode,
            srpt_aging_tokens_per_s=aging,
            max_partial_prefills=max_partials,
            long_prefill_reflex_hold_seconds=reflex_hold,
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

    max_ctx = max_context_len or context_for(min(kv_tokens, DEFAULT_LONGEST))
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
    tree = RadixCache(params) if radix_cache else _disabled_cache(params)

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
    s.load_inquirer = SimpleNamespace(
        _get_num_pending_tokens=lambda chunk_deduct=0: 0, get_loads=lambda: None
    )
    s.device = "cpu"
    s.ps = SimpleNamespace(pp_size=1)
    s.disaggregation_mode = DisaggregationMode.NULL
    if V0523:
        # What 0.5.23's round reads beyond 0.5.18's (all off: no HiCache, no beams).
        s.scheduler_stage_metrics = None
        s.enable_unified_cache_external_linker = False
        s.enable_lmcache = False
        s.hisparse_coordinator = None
        s.dynamic_chunk_sizer = None
        s.processed_tokens_counter = 0
        s.prefill_decode_interval = 0
        s._prefill_decode_interval_remaining = 0
        s.beam_coordinator = SimpleNamespace(pending_member_rows=lambda batch: 0)
        s.enable_skip_finishing_decode = False  # set by the overlap loop only
        s.enable_overlap_mlx = False
        s.mm_receiver = None
        s.rust_server = None
        s.decode_offload_manager = None
        s.enable_continuous_input_polling = False
        s._pause_started_at = None  # init_load_inquirer's pause bookkeeping
        s._pause_intervals = collections.deque(
            maxlen=sys.modules[Scheduler.__module__].PAUSE_WINDOWS_MAX
        )
        from sglang.srt.managers.scheduler_components.internal_state import (
            SchedulerInternalStateController,
        )

        s.internal_state = SchedulerInternalStateController(s, record_step_time=False)
    if PATCHED:
        s.partial_reqs = []
        s._pending_partial_aborts = []
        s.long_prefill_token_threshold = threshold
        s.long_prefill_mode = mode
        s.srpt_aging_tokens_per_s = aging
        s.max_partial_prefills = max_partials
        s.long_prefill_reflex_hold_seconds = reflex_hold
        # Reflex mode's hold reads this clock once a round: tests replace it (FakeClock).
        s._reflex_clock = time.monotonic
        s._reflex_last_short = None
        s.metrics_collector = None
    s.policy = SchedulePolicy(policy, tree, False, False, False)
    if PATCHED:
        s.policy.srpt_aging_tokens_per_s = aging
    eng = Engine(s, 0, 0)
    eng.kv_free_at_start = eng.kv_free()
    eng.slots_free_at_start = eng.slots_free()
    return eng


class FakeClock:
    """An engine clock for reflex mode's hold (``Scheduler._reflex_clock``): it reads
    ``now``, which the test moves (``advance``), so the hold is deterministic."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def abort(eng: Engine, rid: str) -> None:
    eng.s.abort_request(AbortReq(rid=rid))


def set_internal_state(eng: Engine, **server_args: Any) -> Any:
    return eng.s.set_internal_state(SetInternalStateReq(server_args=server_args))


# ---- cases shared by the patched (in-process) and pristine (subprocess) runs -----------


def case_engine(case: dict[str, Any]) -> Engine:
    """The engine a harness case runs on: its `engine` kwargs, with a request table sized
    to the case (the width of its longest request; 32 slots, or 4 per request when that
    is more) unless the case sets them. The slots never bind: SGLang counts the round's
    partials against the free slots although they hold theirs, so a table near full
    would refuse admissions; 4 per request leaves room for that."""
    requests = case["requests"]
    longest = case.get("shared_prefix", 0) + max(
        r["need"] + r.get("max_new", 1) for r in requests
    )
    sized = {"max_context_len": context_for(longest), "max_reqs": max(32, 4 * len(requests))}
    return make_engine(**{**sized, **case.get("engine", {})})


def run_case(case: dict[str, Any]) -> list[dict[str, int]]:
    """A case: engine kwargs, requests [{need, prefix_len?, rid}], rounds to record."""
    eng = case_engine(case)
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
    eng = case_engine(case)
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


def run_cases(cases: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: run_pressure(c) if c.get("kind") == "pressure" else run_case(c)
        for name, c in cases.items()
    }
    out["_patched"] = PATCHED
    return out


RESULT = "@@result "
"""What starts the line that carries a served request's answer (sglang may print too)."""


def serve() -> None:
    """Answer one JSON line of cases per line of stdin, until stdin closes: the tests keep
    one such process per session, so sglang's import (~8 s) is paid once, not per call."""
    for line in sys.stdin:
        try:
            answer = {"ok": run_cases(json.loads(line))}
        except Exception:  # noqa: BLE001 - the caller's test fails with it
            import traceback

            answer = {"error": traceback.format_exc()}
        sys.stdout.write(RESULT + json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        print(json.dumps(run_cases(json.loads(sys.argv[1]))))
