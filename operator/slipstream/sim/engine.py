"""The digital twin: one engine simulated round by round (one round = one forward pass).

Two events drive it, taken in time order: a request arrives, or the pass in flight ends.
At the start of every pass the policy decides what runs (``Engine.advance`` is the loop):

- prefill-first kinds (stock, ceiling, floor: SGLang's default scheduler): if the
  allocator admits any prefill work the pass is a prefill (extend) batch and the running
  decodes wait; otherwise the pass is one decode step for every running request;
- mixed kinds (sarathi, vllm): every running request decodes one token in every pass and
  the prefill chunks share what is left of the budget.

A request's first token comes at the end of the pass that finishes its prefill; its later
tokens at the end of each decode step it is part of. Decoding requests are kept as
aggregates (count, summed context, a heap of finishing steps) so a pass costs time in the
number of prefills it carries, not in the number of running streams: the twin has to run
the whole Mooncake trace in seconds (``slipstream bench --speed``).

``Engine`` is the twin as a steppable object (submit requests, advance the clock, change
the setting between passes), for the engine simulator and the tuner; ``simulate`` runs a
whole workload through one.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import reduce
from itertools import accumulate, islice, repeat
from operator import add, sub

from slipstream.sim.admission import (
    REFLEX_SCAN,
    ReflexClock,
    allocate,
    partials_first,
    reflex_line,
    reflex_round,
    srpt_key,
)
from slipstream.sim.cache import PrefixCache
from slipstream.sim.cost import DECODE, MIXED, PREFILL, CostModel, chunk_pairs
from slipstream.sim.policies import EngineConfig, FirstToken, Policy, RoundView, Setting
from slipstream.sim.profiles import Profile
from slipstream.sim.queue import WaitQueue
from slipstream.sim.workload import Request, Workload


class Job:
    """A request's state inside the engine."""

    __slots__ = (
        "req", "rid", "seq", "arrival_s", "need", "cached_est", "offset", "cached",
        "host_tokens", "uncached", "first_token_s", "solo_s", "entry_step",
        "_itl", "_itl_ranges", "_gaps", "finished_s", "_times", "out_reserve", "redo", "epoch",
        "seg_start_s", "out_base", "_segs", "retractions", "rejected", "srpt_key",
    )

    def __init__(self, req: Request, seq: int) -> None:
        self.req = req
        self.rid = req.rid
        self.seq = seq
        self.arrival_s = req.arrival_s
        self.cached_est = 0
        """Cached prefix found when the request arrived (lpm's key)."""
        self.need = req.prompt_tokens
        """Uncached prompt tokens still to prefill (re-matched while it waits)."""
        self.offset = 0
        """Tokens of context built so far (cached prefix included): its KV in use."""
        self.cached = 0
        self.host_tokens = 0
        self.uncached = 0
        self.first_token_s = -1.0
        self.solo_s = 0.0
        self.entry_step = 0
        """Index of the decode step of its current decoding segment's first token."""
        self._itl: float | None = None
        """Its longest inter-token gap known so far (``max_itl_s``)..."""
        self._itl_ranges: list[tuple[int, int]] | None = None
        """...and the decode-step gaps (``_gaps[lo:hi]``) still to take the maximum of: read
        only if asked for (``max_itl_s``), which a recommendation's runs never do."""
        self._gaps: list[float] | None = None
        self.finished_s = -1.0
        self._times: list[float] | None = None
        self.out_reserve = 0
        """KV the allocator charges for its output (and its locked prefix) on admission."""
        self.redo = 0
        """Output tokens already produced before a retraction (their KV is recomputed)."""
        self.epoch = 0
        """Bumped at each retraction: heap entries of an older epoch are stale."""
        self.seg_start_s = -1.0
        """Time of the token that opened the current decoding segment."""
        self.out_base = 1
        """Output tokens produced before the current segment's decode steps."""
        self._segs: list[tuple[float, int, int]] | None = None
        """Closed segments (start time, first step, end step) of a retracted request."""
        self.retractions = 0
        self.rejected = False
        """Refused: its prompt cannot fit the KV pool even on an idle engine."""
        self.srpt_key: tuple[float, float, int] | None = None
        """Its srpt key as of its last re-match (``queue.WaitQueue``); None before one."""

    @property
    def max_itl_s(self) -> float | None:
        """Its longest inter-token gap (None: it never had a second token)."""
        ranges = self._itl_ranges
        if ranges is not None:
            gaps = self._gaps
            assert gaps is not None and self._itl is not None
            gap = self._itl
            for lo, hi in ranges:
                gap = max(gap, max(gaps[lo:hi], default=0.0))
            self._itl, self._itl_ranges = gap, None
        return self._itl

    def tokens_out(self, at_s: float) -> int:
        """Output tokens produced by twin time ``at_s`` (what a stream has sent so far)."""
        if self.first_token_s < 0 or at_s < self.first_token_s:
            return 0
        times = self._times
        if times is None:
            return 1
        segs = [*(self._segs or ()), (self.seg_start_s, self.entry_step,
                                      self.entry_step + self.req.output_tokens - self.out_base)]
        total = 0
        for start_s, first, end in segs:
            if at_s >= start_s:
                total += 1 + bisect.bisect_right(times, at_s, first, min(end, len(times))) - first
        return total


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One pass, for timelines: who prefilled how much, and whether decodes ran."""

    start_s: float
    end_s: float
    prefill: tuple[tuple[str, int], ...]
    decodes: int


@dataclass(slots=True)
class SimResult:
    """Per-request outcomes plus engine totals (plain data for metrics and reports)."""

    workload: Workload
    policy: str
    threshold: int
    """T the run started with (the tuner may change it: see ``settings``)."""
    config: EngineConfig
    profile: Profile
    jobs: list[Job]
    makespan_s: float
    prefill_busy_s: float
    prefill_tokens: int
    passes: int
    rounds: list[RoundRecord] = field(default_factory=list)
    settings: list[tuple[float, Setting]] = field(default_factory=list)
    busy_s: float = 0.0
    """Seconds of every pass (prefill, decode and mixed)."""
    step_gaps: list[float] = field(default_factory=list)
    """Time from each decode step to the one before it..."""
    step_weights: list[int] = field(default_factory=list)
    """...and how many streams had that gap (those in both steps): every inter-token gap
    of the run is one of these or one of ``entry_gaps``, without per-stream work."""
    entry_gaps: list[float] = field(default_factory=list)
    """Each stream's gap from its first token to its first decode step."""
    kv_pool_tokens: int | None = None
    """The KV pool the run had (None = unlimited)."""
    peak_kv_tokens: int = 0
    """Most KV tokens in use at once (running requests' context)."""
    retractions: int = 0
    """Decoding requests retracted because the pool ran out."""
    rejected: int = 0
    """Requests refused because their prompt cannot fit the pool."""


# The cache steps of a request's life, shared by the engine and rate.solo_busy_s.

def _arrive(job: Job, cache: PrefixCache) -> None:
    """A request arrives: its warm prefix enters the cache; estimate its uncached need."""
    req = job.req
    if req.warm_blocks:
        cache.insert(req.blocks[: req.warm_blocks], req.block_sizes[: req.warm_blocks])
    _rematch(job, cache)


def _rematch(job: Job, cache: PrefixCache) -> None:
    """Look a waiting request's prefix up in the cache again: its cached and uncached tokens."""
    req = job.req
    job.cached_est = hit = cache.peek(req.blocks, req.block_sizes)
    last = req.prompt_tokens - 1  # usable_hit, inlined: the last token is always computed
    job.need = req.prompt_tokens - (hit if hit < last else last)


def _unmatched(job: Job) -> int:
    """A request's need with no prefix matched: its whole prompt, plus the output a
    retracted request recomputes (the engine's ``req_remaining_need`` before a match)."""
    return job.req.prompt_tokens + job.redo


def _prefix(job: Job) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return job.req.blocks, job.req.block_sizes


def _admit(job: Job, cache: PrefixCache, cost: CostModel, budget: int) -> int:
    """First allocation of a request: match its prefix for real; returns host tokens to load."""
    req = job.req
    cached, job.host_tokens = cache.admit(req.blocks, req.block_sizes, req.prompt_tokens)
    job.cached = job.offset = cached
    job.uncached = job.need = req.prompt_tokens - cached
    job.solo_s = cost.solo_prefill_s(cached, job.need, budget, job.host_tokens)
    return job.host_tokens


def _prefilled(job: Job, cache: PrefixCache) -> None:
    """A prompt is computed: its blocks enter the prefix cache."""
    cache.insert(job.req.blocks, job.req.block_sizes)


def solo_replay(workload: Workload, profile: Profile, config: EngineConfig) -> Iterator[Job]:
    """Each request alone on the engine, in arrival order: the jobs with ``solo_s`` set.

    The same cache steps as ``Engine`` (arrive, admit, cache the prompt), with every
    request finished before the next arrives: ``rate`` sizes the load from it.
    """
    cost = CostModel(profile)
    cache = PrefixCache(config.cache_tokens, config.host_cache_tokens)
    for seq, req in enumerate(workload.requests):
        job = Job(req, seq)
        _arrive(job, cache)
        _admit(job, cache, cost, config.chunked_prefill_size)
        _prefilled(job, cache)
        yield job


CLIP_MAX_NEW_TOKENS = 4096
"""SGLang clips a request's output estimate at this many tokens (schedule_policy.py)."""
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
"""SGLang 0.5.18's defaults (environ.py): SGLANG_INIT_NEW_TOKEN_RATIO 0.7,
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS 600,
SGLANG_RETRACT_DECODE_STEPS 20."""
BATCH_MIN_STEPS = 4
"""Fewest decode steps ``Engine._decode_passes`` computes as one batch (fewer go one by
one, where a batch's set-up costs more than it saves)."""


class Engine:
    """One engine as a steppable object: submit requests, advance the clock, apply settings.

    ``now_s`` is the twin clock. ``advance(until_s)`` runs every pass that starts at or
    before ``until_s`` (the last may end after it); an idle engine's clock moves to
    ``until_s``. Requests may be submitted ahead of time (``simulate`` submits a whole
    workload at once): they join the queue when the clock reaches their arrival.

    Memory, when the profile (or config) gives a KV pool, as SGLang 0.5.18 manages it:
    the KV in use is every running request's context (partial prefills' built tokens,
    decoding streams' prompt and output so far); admission follows the shared rule of
    ``admission.allocate`` with ``kv_free`` = pool - in use - ``new_token_ratio`` x the
    running decodes' remaining output (clipped at 4096 each); before a decode step, if the
    pool cannot hold one more token per stream beside the partials' unbuilt remainder,
    decodes are retracted (fewest output tokens first, longest prompt on ties; at least
    one kept) and re-queued to recompute their whole context, and ``new_token_ratio`` is
    re-estimated; otherwise it decays toward its floor, and resets when the engine idles.
    Simplifications: a prefix shared by several running requests is counted once per
    request (conservative); the prefix cache lives in the pool's free space and yields to
    it (its capacity is capped at the pool); a retracted request recomputes its context
    without a cache hit (SGLang evicts the cache before it retracts).
    """

    def __init__(
        self,
        policy: Policy,
        profile: Profile,
        config: EngineConfig | None = None,
        record_rounds: bool = False,
        start_s: float = 0.0,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.policy = policy
        self.profile = profile
        self.config = cfg = config or EngineConfig()
        self.cost = CostModel.of(profile)
        pool = profile.kv_pool_tokens if cfg.kv_pool_tokens is None else cfg.kv_pool_tokens
        self.kv_pool_tokens: int | None = pool or None
        """Tokens of KV the engine can hold; None = no memory limit."""
        cache_tokens = cfg.cache_tokens if pool is None or not pool else min(cfg.cache_tokens, pool)
        self.cache = PrefixCache(cache_tokens, cfg.host_cache_tokens)
        # hrrn's ties are drawn at every push when a controller may turn the order to hrrn
        # mid-run, so its runs draw the same ties whatever order they start in
        self.queue: WaitQueue[Job] = WaitQueue(policy.order, cfg.srpt_aging_tokens_per_s,
                                               ties=policy.order == "hrrn" or policy.controller is not None)
        # SGLang 0.5.23's spf and hrrn re-match every waiting request each round
        cache = self.cache
        self.queue.rematch = lambda job: _rematch(job, cache)
        self.queue.prefix = _prefix
        self.queue.unmatched = _unmatched
        self.record_rounds = record_rounds
        self.progress = progress
        """Called with the number of requests arrived so far, every 1024."""
        self.now_s = start_s
        self.start_threshold = policy.rule.threshold
        self.jobs: list[Job] = []
        """Every submitted job, in submission order."""
        self.rounds: list[RoundRecord] = []
        self.settings: list[tuple[float, Setting]] = []
        self.prefill_busy_s = 0.0
        """Seconds of passes that carried prefill work."""
        self.prefill_tokens = 0
        self.passes = 0
        self.busy_s = 0.0
        """Seconds of every pass."""
        self.peak_kv_tokens = 0
        self.retractions = 0
        self.rejected = 0
        self._pending: deque[Job] = deque()
        self._arrived = 0
        self._partials: list[Job] = []
        self._partial_kv = 0
        """KV held by the partial prefills (their built context)."""
        self._observed: list[FirstToken] | None = [] if policy.controller is not None else None
        # Decoding streams as aggregates: count, summed context, (last step, seq, epoch, job)
        # heap, the end time of every decode step and the gap before it.
        self.decoding = 0
        self._ctx_sum = 0
        self._dec_heap: list[tuple[int, int, int, Job]] = []
        self._dtimes: list[float] = []
        self._dgaps: list[float] = []
        self._dweights: list[int] = []
        self._entered = 0
        """Streams that started decoding since the last decode step."""
        self._entry_gaps: list[float] = []
        # Memory bookkeeping (only with a pool): running streams by seq, the clipped
        # remaining-output sum of SGLang's reservation, and when clipped streams unclip.
        self._active: dict[int, Job] = {}
        self._rem_sum = 0
        self._clipped = 0
        self._clip_heap: list[tuple[int, int, int, Job]] = []
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.reflex = ReflexClock(cfg.reflex_hold_s)
        """Reflex mode's last short sighting and hold (admission.py's reflex steps 2-3)."""
        self.long_rounds = 0
        """Prefill passes of the patch's long-prefill path (T > 0, or two or more partials
        left after T was turned off): the engine's ``sglang:long_prefill_rounds_total``."""
        self.capped_rounds = 0
        """Those of them run under the cap T (every ceiling and floor pass; a reflex pass
        when a short request waits or the hold runs): ``{capped="true"}``."""
        self._round = 0
        """The pass being allocated: 0 not on the long path, 1 uncapped, 2 capped."""

    # ---- the API ---------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Requests arrived and not yet given any prefill tokens (sglang:num_queue_reqs)."""
        return len(self.queue.items)

    def partial_needs(self) -> list[tuple[str, int]]:
        """(request id, uncached tokens still to prefill) of each request part-way through
        its prefill."""
        return [(j.rid, j.need) for j in self._partials]

    def unserved(self) -> list[tuple[str, int]]:
        """(request id, uncached tokens) of every request with no first token yet, waiting
        or part-way through its prefill, each whole (a partial's as at its admission): what
        the queue-mix gauges hold. The patched engine counts a request's whole prompt from
        its arrival to its first output, so a giant shows at its full size for the whole
        of its prefill, when it blocks the others, not shrinking as its chunks run."""
        return [(j.rid, j.need) for j in self.queue.items] + [(j.rid, j.uncached) for j in self._partials]

    @property
    def partials(self) -> int:
        """Requests part-way through their prefill."""
        return len(self._partials)

    @property
    def busy(self) -> bool:
        """Whether any arrived work is pending (waiting, part-prefilled or decoding)."""
        return bool(self.queue.items or self._partials or self.decoding)

    @property
    def kv_in_use(self) -> int:
        """KV tokens held by running requests (partial prefills and decoding streams)."""
        return self._partial_kv + self._ctx_sum

    def submit(self, req: Request) -> Job:
        """A request arriving at ``req.arrival_s`` (not before ``now_s``; ids unique)."""
        if not req.arrival_s >= self.now_s:
            raise ValueError(
                f"request {req.rid!r} arrives at {req.arrival_s} s, before the twin clock "
                f"{self.now_s} s: submit it with arrival_s >= now_s"
            )
        job = Job(req, len(self.jobs))
        self.jobs.append(job)
        pending = self._pending
        if req.arrival_s == self.now_s:  # arrived: counted as waiting at once
            if pending and pending[0].arrival_s <= self.now_s:
                self._arrivals()
            pending.appendleft(job)
            self._arrivals()
        elif not pending or req.arrival_s >= pending[-1].arrival_s:
            pending.append(job)
        else:
            items = list(pending)
            at = bisect.bisect_right([j.arrival_s for j in items], req.arrival_s)
            items.insert(at, job)
            self._pending = deque(items)
        return job

    def apply(self, setting: Setting) -> None:
        """Change T, mode and order between passes (what /set_internal_state does)."""
        self.policy.apply(setting)
        self.queue.set_order(self.policy.order)
        self.settings.append((self.now_s, setting))

    def abort(self, rid: str) -> bool:
        """Drop a request that has not been given any tokens yet; False if there is none."""
        for k, job in enumerate(self._pending):
            if job.rid == rid:
                del self._pending[k]
                return True
        queue = self.queue
        for k, job in enumerate(queue.items):
            if job.rid == rid and not job.redo:
                del queue.items[k]
                del queue.keys[k]
                return True
        return False

    def advance(self, until_s: float) -> None:
        """Run every pass that starts at or before ``until_s``: the event loop."""
        pending = self._pending
        while True:
            if pending and pending[0].arrival_s <= self.now_s:
                self._arrivals()
            if not (self.queue.items or self._partials or self.decoding):  # not self.busy
                self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # SGLang resets it when idle
                if pending and pending[0].arrival_s <= until_s:
                    self.now_s = pending[0].arrival_s
                    continue
                if self.now_s < until_s < math.inf:
                    self.now_s = until_s
                return
            if self.now_s > until_s:
                return
            if self.policy.controller is not None:
                self._control()
            if self.policy.mixed and self.decoding and self.kv_pool_tokens is not None:
                self._make_room_for_decodes()
            alloc = self._allocation()
            if alloc:
                if self._round:
                    self.long_rounds += 1
                    self.capped_rounds += self._round - 1
                self._prefill_pass(alloc)
            elif self.decoding:
                self._decode_passes(until_s)
            elif self.kv_pool_tokens is not None and self.queue.items and not self._partials:
                self._reject_head()
            else:
                raise RuntimeError(
                    f"engine stalled at t={self.now_s:.3f}s with no admissible prefill"
                )

    def run(self) -> None:
        """Advance until every submitted request is done."""
        self.advance(math.inf)

    # ---- one pass --------------------------------------------------------------------

    def _arrivals(self) -> None:
        """Move every request whose arrival time has come into the wait queue."""
        pending, now, cache, queue = self._pending, self.now_s, self.cache, self.queue
        while pending and pending[0].arrival_s <= now:
            job = pending.popleft()
            _arrive(job, cache)
            queue.push(job)
            self._arrived += 1
            if self.progress is not None and not self._arrived % 1024:
                self.progress(self._arrived)

    def _control(self) -> None:
        """Call the policy's controller when its interval has elapsed (``auto``)."""
        policy = self.policy
        if policy.controller is None or self.now_s < policy.next_control_s:
            return
        observed = self._observed
        assert observed is not None
        view = RoundView(self.now_s, tuple(j.need for j in self.queue.items),
                         tuple(j.uncached for j in self._partials), self.decoding, tuple(observed))
        observed.clear()
        setting = policy.controller(view)
        policy.next_control_s = self.now_s + policy.interval_s
        if setting is not None:
            self.apply(setting)

    def _allocation(self) -> dict[str, int]:
        """Prefill tokens per request for the pass starting now (admission)."""
        policy, queue, partials = self.policy, self.queue, self._partials
        if not (queue.items or partials):
            return {}
        rule = policy.rule
        if rule.mode == "reflex":
            short = _short_waiting(queue, self.cache, reflex_line(rule.threshold, (j.need for j in partials)))
            self.reflex.hold_s = self.config.reflex_hold_s  # settable in place (the engine's admin call)
            rule = reflex_round(rule, self.reflex.capped(self.now_s, short))
        # The patch's long path runs with T in force, or with two or more partials left.
        self._round = (2 if rule.threshold else 1) if policy.rule.threshold or len(partials) > 1 else 0
        budget = rule.chunked_prefill_size - (self.decoding if policy.decodes_in_budget else 0)
        if budget <= 0:
            return {}
        cfg = self.config
        slots = cfg.max_running_requests - self.decoding - len(partials)
        queue.start_round(self.prefill_tokens)  # hrrn's clock: prefill tokens so far
        max_partials = cfg.max_partial_prefills
        if self.kv_pool_tokens is None:
            head = _refresh_head(queue, self.cache, rule.threshold, budget, max(slots, 0), False)
            if partials_first(rule, policy.order):
                return policy.allocator(rule, partials, queue.items[:head], budget,
                                        max_partials=max_partials)
            return allocate(rule, (), _srpt_merge(queue, head, partials), budget,
                            max_partials=max_partials, partial_rids=tuple(j.rid for j in partials))
        # The reservation rule (admission.py): what the running decodes may still need
        # (SGLang's new_token_ratio estimate, plus this pass's own tokens when mixed).
        reserve = self.new_token_ratio * self._rem_sum + (self.decoding if policy.mixed else 0)
        kv_free = int(self.kv_pool_tokens - (self._partial_kv + self._ctx_sum) - reserve)
        first = partials_first(rule, policy.order)
        if (kv_free <= 1 + rule.page_size and policy.allocator is allocate
                and (first or rule.page_size == 1)):
            # A full pool admits no new request (one needs need + page >= 2 tokens free):
            # the rule's own refusal, decided without re-matching the queue's head.
            if not partials:
                return {}
            head = 0
        else:
            head = _refresh_head(queue, self.cache, rule.threshold, budget, max(slots, 0), True)
        if first:
            alloc = policy.allocator(rule, partials, queue.items[:head], budget,
                                     kv_free=kv_free, max_partials=max_partials)
        else:
            alloc = allocate(rule, (), _srpt_merge(queue, head, partials), budget,
                             kv_free=kv_free, max_partials=max_partials,
                             partial_rids=tuple(j.rid for j in partials))
        return self._fit_pool(alloc, reserve)

    def _fit_pool(self, alloc: dict[str, int], reserve: float) -> dict[str, int]:
        """Drop the last new admissions while the pass would leave the running requests'
        KV plus the partials' unbuilt remainder beyond the pool.

        The shared rule charges a capped new request's cached prefix only when it finishes
        in the round (SGLang locks it at once); this keeps the pool an invariant.
        """
        pool = self.kv_pool_tokens
        assert pool is not None
        new = [j for j in self.queue.items[: len(alloc)] if j.rid in alloc]
        if not new:
            return alloc
        unbuilt = sum(j.need for j in self._partials) if self._partials else 0
        while True:
            after = self._partial_kv + self._ctx_sum + reserve + unbuilt
            for job in new:
                after += job.req.prompt_tokens + job.redo - job.need  # prefix it locks
                after += job.need  # built now or reserved as a partial's remainder
            if after <= pool or not new:
                return alloc
            dropped = new.pop()
            del alloc[dropped.rid]
            assert all(j.rid != dropped.rid for j in self._partials)

    def _reject_head(self) -> None:
        """The head request cannot fit the pool even on an idle engine: refuse it
        (SGLang refuses a prompt longer than its pool when the request comes in)."""
        job = self.queue.items[0]
        self.queue.pop_front(1)
        job.rejected = True
        job.finished_s = self.now_s
        self.rejected += 1

    def _decode_passes(self, until_s: float) -> None:
        """Decode-only passes; with nothing waiting, back to back until the next event.

        No per-stream work in this loop: it is the twin's hot path under load (decode
        steps outnumber prefill passes several times over). ``_decode_step``'s
        bookkeeping is inlined here on local variables, written back before anything
        that reads them (retraction, the return); the steps and their order are
        ``_decode_step``'s, so the results are the same to the bit.
        """
        pending, queue, policy = self._pending, self.queue, self.policy
        next_event = pending[0].arrival_s if pending else math.inf
        if policy.controller is not None and policy.next_control_s < next_event:
            next_event = policy.next_control_s
        pass_time = self.cost.pass_time
        pool = self.kv_pool_tokens
        limited = pool is not None
        # what must stay free beside the streams: the partials' KV and unbuilt remainder
        partial_kv = self._partial_kv
        held = partial_kv + sum(j.need for j in self._partials) if self._partials else partial_kv
        has_partials = bool(self._partials)
        dtimes, dgaps, dweights = self._dtimes, self._dgaps, self._dweights
        entry_gaps = self._entry_gaps
        heap, clip = self._dec_heap, self._clip_heap
        active = self._active
        record = self.record_rounds
        t = self.now_s
        busy, passes = self.busy_s, self.passes
        n, ctx, entered = self.decoding, self._ctx_sum, self._entered
        rem_sum, clipped, peak = self._rem_sum, self._clipped, self.peak_kv_tokens
        ratio = self.new_token_ratio
        last_t = dtimes[-1] if dtimes else None
        step = len(dtimes)
        cost = self.cost
        batch = not record and not has_partials
        weights, weights_s = cost.weights_by_tokens, cost.weights_s
        n_weights = len(weights)
        linear_s, attn_s, kv_s = cost.linear_s, cost.attn_s, cost.kv_s
        dec_ov = cost.overheads[DECODE]
        while True:
            if limited:
                if held + ctx + n > pool:  # type: ignore[operator]
                    self.decoding, self._ctx_sum, self._entered = n, ctx, entered
                    self._rem_sum, self._clipped = rem_sum, clipped
                    self.now_s, self.busy_s, self.passes = t, busy, passes
                    self.peak_kv_tokens, self.new_token_ratio = peak, ratio
                    self._make_room_for_decodes()
                    n, ctx, entered = self.decoding, self._ctx_sum, self._entered
                    rem_sum, clipped = self._rem_sum, self._clipped
                    ratio = self.new_token_ratio
                    if not n:
                        return
                elif ratio > MIN_NEW_TOKEN_RATIO:
                    ratio = max(ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
            batched = False
            if batch and not queue.items:
                # Steps that provably change nothing but the clock and the context: up to
                # the next stream's finish or unclip, the pool's limit and the next event.
                # Each step's time and clock sum are the same floating-point operations as
                # ``pass_time`` and ``t += dt`` below, so the results are the same to the bit.
                k = heap[0][0] - step
                if limited:
                    if clip and clip[0][0] - step < k:
                        k = clip[0][0] - step
                    k_pool = (pool - held - ctx) // n  # type: ignore[operator]
                    if k_pool < k:
                        k = k_pool
                if k >= BATCH_MIN_STEPS:
                    w = weights[n] if n < n_weights else weights_s
                    nl = n * linear_s
                    first = nl + ctx * attn_s
                    mem = w + ctx * kv_s
                    dt0 = dec_ov + (first if first > mem else mem)
                    bound = next_event if next_event < until_s else until_s
                    if bound < math.inf:
                        k_time = int((bound - t) / dt0) + 2
                        if k_time < k:
                            k = k_time
                if k >= BATCH_MIN_STEPS:
                    span = range(ctx, ctx + k * n, n)
                    # Both terms grow with the context, and so do their rounded values: when
                    # the last step's one term is below the first step's other, every step
                    # takes the same branch of ``max``, computed as the mixed form computes it.
                    last_x = span[-1]
                    if nl + last_x * attn_s <= mem:
                        dts = [dec_ov + (w + x * kv_s) for x in span]
                    elif w + last_x * kv_s < first:
                        dts = [dec_ov + (nl + x * attn_s) for x in span]
                    else:
                        dts = [dec_ov + (c if (c := nl + x * attn_s) > (m := w + x * kv_s) else m)
                               for x in span]
                    ts = list(accumulate(dts, initial=t))
                    del ts[0]
                    # the loop below stops after the first step at or past the next event
                    k = min(k, bisect.bisect_left(ts, next_event, 0, k) + 1,
                            bisect.bisect_right(ts, until_s, 0, k) + 1)
                    if k < len(ts):
                        del ts[k:], dts[k:]
                    busy = reduce(add, dts, busy)
                    passes += k
                    dgaps.append(ts[0] - last_t if last_t is not None else 0.0)
                    dgaps.extend(map(sub, islice(ts, 1, None), ts))
                    dweights.append(n - entered)
                    dweights.extend(repeat(n, k - 1))
                    entered = 0
                    dtimes.extend(ts)
                    t = last_t = ts[-1]
                    ctx += k * n
                    step += k
                    batched = True
            if not batched:
                k = 1
                dt = pass_time(n, ctx, ctx, 0, DECODE)
                if record:
                    self.rounds.append(RoundRecord(t, t + dt, (), n))
                t += dt
                busy += dt
                passes += 1
                # _decode_step(t), inlined
                dgaps.append(t - last_t if last_t is not None else 0.0)
                dweights.append(n - entered)
                entered = 0
                dtimes.append(t)
                last_t = t
                ctx += n
                step += 1
            if limited:  # the ``k`` steps just taken: outputs left, unclipped streams, peak
                rem_sum -= k * (n - clipped)
                while clip and clip[0][0] <= step:
                    _, _, epoch, job = heapq.heappop(clip)
                    if epoch == job.epoch:
                        clipped -= 1
                in_use = partial_kv + ctx
                if in_use > peak:
                    peak = in_use
                if k > 1:  # the later steps' checks decay the ratio
                    for _ in range(k - 1):
                        if ratio <= MIN_NEW_TOKEN_RATIO:
                            break
                        ratio = max(ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
            # the streams that finished by this step (``has_partials`` is False when batched)
            while heap and heap[0][0] <= step:
                last, _, epoch, job = heapq.heappop(heap)
                if epoch != job.epoch:
                    continue
                # _close_segment(job, last), inlined
                e = job.entry_step
                gap = job._itl or 0.0
                if last > e:
                    first_gap = dtimes[e] - job.seg_start_s
                    entry_gaps.append(first_gap)
                    if first_gap > gap:
                        gap = first_gap
                    if last > e + 1:
                        job._gaps = dgaps
                        if job._itl_ranges is None:
                            job._itl_ranges = [(e + 1, last)]
                        else:
                            job._itl_ranges.append((e + 1, last))
                job._itl = gap
                job.finished_s = dtimes[last - 1]
                n -= 1
                ctx -= job.req.prompt_tokens + job.req.output_tokens
                active.pop(job.seq, None)
            if queue.items or has_partials or not n or t >= next_event or t > until_s:
                break
        self.decoding, self._ctx_sum, self._entered = n, ctx, entered
        self._rem_sum, self._clipped = rem_sum, clipped
        self.now_s, self.busy_s, self.passes = t, busy, passes
        self.peak_kv_tokens = peak
        self.new_token_ratio = ratio

    def _prefill_pass(self, alloc: dict[str, int]) -> None:
        """A prefill pass (the running decodes riding along in mixed mode)."""
        tokens = pairs = kv = host = 0
        done: list[Job] = []
        still: list[Job] = []
        partials, queue, cache, cost = self._partials, self.queue, self.cache, self.cost
        n_new = len(alloc) - sum(1 for job in partials if job.rid in alloc) if partials else len(alloc)
        admitted = queue.items[:n_new]
        queue.pop_front(n_new)
        budget_c = self.config.chunked_prefill_size
        for job in admitted:
            if job.redo:  # a retracted request recomputes its whole context
                job.offset = 0
                job.need = job.req.prompt_tokens + job.redo
            else:
                host += _admit(job, cache, cost, budget_c)
        for job in (*partials, *admitted) if partials else admitted:
            take = alloc.get(job.rid, 0)
            if take:
                pairs += chunk_pairs(job.offset, take)
                kv += job.offset
                tokens += take
                job.offset += take
                job.need -= take
            (done if job.need == 0 else still).append(job)
        self._partials = still
        self._partial_kv = sum(j.offset for j in still) if still else 0
        self.prefill_tokens += tokens
        # SGLang bumps processed_tokens_counter after each pass: later arrivals snapshot it
        self.queue.processed = self.prefill_tokens

        n_dec = self.decoding
        decoding_here = self.policy.mixed and n_dec > 0
        if decoding_here:
            tokens += n_dec
            pairs += self._ctx_sum
            kv += self._ctx_sum
        t = self.now_s
        dt = cost.pass_time(tokens, pairs, kv, host, MIXED if decoding_here else PREFILL)
        if self.record_rounds:
            self.rounds.append(RoundRecord(t, t + dt, tuple(alloc.items()),
                                           n_dec if decoding_here else 0))
        t += dt
        self.now_s = t
        self.prefill_busy_s += dt
        self.busy_s += dt
        self.passes += 1
        if decoding_here:
            self._decode_step(t)
        for job in done:
            self._first_token(job, t)
        if self.kv_pool_tokens is not None:
            in_use = self._partial_kv + self._ctx_sum
            if in_use > self.peak_kv_tokens:
                self.peak_kv_tokens = in_use

    # ---- memory ----------------------------------------------------------------------

    def _make_room_for_decodes(self) -> None:
        """Before a decode step: retract decodes until one more token per stream fits
        beside the partials' unbuilt remainder (SGLang's check_decode_mem/retract_decode)."""
        pool = self.kv_pool_tokens
        assert pool is not None
        reserved = sum(j.need for j in self._partials)
        if self._partial_kv + self._ctx_sum + self.decoding + reserved <= pool:
            if self.new_token_ratio > MIN_NEW_TOKEN_RATIO:
                self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY,
                                           MIN_NEW_TOKEN_RATIO)
            return
        step = len(self._dtimes)
        # most-preferred to keep first: most output so far, then shortest prompt
        keep = sorted(self._active.values(),
                      key=lambda j: (j.out_base + step - j.entry_step, -j.req.prompt_tokens),
                      reverse=True)
        while len(keep) > 1 and (self._partial_kv + self._ctx_sum + self.decoding + reserved
                                 > pool):
            self._retract(keep.pop(), step)
        if self._partial_kv + self._ctx_sum + self.decoding + reserved > pool and keep:
            # SGLang aborts the last one rather than crash; the twin ends its output here
            job = keep.pop()
            self._stop_stream(job, step)
            job.finished_s = self.now_s
        # SGLang re-estimates the ratio from the streams left
        generated = sum(j.out_base + step - j.entry_step for j in keep)
        max_new = sum(j.req.output_tokens for j in keep)
        self.new_token_ratio = min(1.0, (generated + RETRACT_DECODE_STEPS * len(keep))
                                   / (max_new + 1))

    def _stop_stream(self, job: Job, step: int) -> int:
        """Take a stream out of the decode batch at ``step``; returns its tokens so far."""
        del self._active[job.seq]
        produced = job.out_base + step - job.entry_step
        rem = job.req.output_tokens - produced
        self._rem_sum -= rem if rem < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
        if rem > CLIP_MAX_NEW_TOKENS:
            self._clipped -= 1
        self._close_segment(job, step)
        if job._segs is None:
            job._segs = []
        job._segs.append((job.seg_start_s, job.entry_step, step))
        # from now on seg_start_s is the time of its last token (for the resume gap)
        job.seg_start_s = self._dtimes[step - 1] if step > job.entry_step else job.seg_start_s
        job.epoch += 1  # its heap entries are stale now
        self.decoding -= 1
        self._ctx_sum -= job.req.prompt_tokens + produced
        return produced

    def _retract(self, job: Job, step: int) -> None:
        """Put a decoding stream back in the queue to recompute its context later."""
        produced = self._stop_stream(job, step)
        job.redo = produced
        job.need = job.req.prompt_tokens + produced
        job.cached_est = 0
        job.retractions += 1
        self.retractions += 1
        self.queue.push(job, entry_s=self.now_s)

    def _close_segment(self, job: Job, end: int) -> None:
        """Record a decoding segment's gaps (and keep it for ``tokens_out``).

        ``_decode_passes`` has an inlined copy in its finish loop (the twin's hottest loop):
        change both together. ``scripts/bench-twin-speed.py`` compares the outputs' digests
        with a base commit, so a copy that drifts shows there."""
        e = job.entry_step
        gap = job._itl or 0.0
        if end > e:
            first_gap = self._dtimes[e] - job.seg_start_s
            self._entry_gaps.append(first_gap)
            if first_gap > gap:
                gap = first_gap
            if end > e + 1:  # the maximum of the later gaps is taken when asked for
                job._gaps = self._dgaps
                if job._itl_ranges is None:
                    job._itl_ranges = [(e + 1, end)]
                else:
                    job._itl_ranges.append((e + 1, end))
        job._itl = gap

    # ---- decode bookkeeping ----------------------------------------------------------

    def _first_token(self, job: Job, t: float) -> None:
        """A prefill finished at ``t``: cache the prompt, start decoding (or finish).

        A retracted request's recomputation ends the same way: one more token at ``t``.
        """
        req = job.req
        if job.redo:
            produced = job.redo + 1
            resume_gap = t - job.seg_start_s
            self._entry_gaps.append(resume_gap)
            job._itl = max(job._itl or 0.0, resume_gap)
            job.redo = 0
        else:
            produced = 1
            job.first_token_s = t
            if self._observed is not None:
                self._observed.append(FirstToken(req.tenant, job.arrival_s, t,
                                                 req.prompt_tokens, job.uncached, req.output_tokens))
            _prefilled(job, self.cache)
        rem = req.output_tokens - produced
        step = len(self._dtimes)
        job.entry_step = step  # a segment opened by the token at t: decode steps from step
        job.seg_start_s = t
        job.out_base = produced
        if rem > 0:
            job._times = self._dtimes
            heapq.heappush(self._dec_heap, (step + rem, job.seq, job.epoch, job))
            self.decoding += 1
            self._entered += 1
            self._ctx_sum += req.prompt_tokens + produced
            if self.kv_pool_tokens is not None:
                self._active[job.seq] = job
                if rem > CLIP_MAX_NEW_TOKENS:
                    self._rem_sum += CLIP_MAX_NEW_TOKENS
                    self._clipped += 1
                    heapq.heappush(self._clip_heap,
                                   (step + rem - CLIP_MAX_NEW_TOKENS, job.seq, job.epoch, job))
                else:
                    self._rem_sum += rem
        else:
            job.finished_s = t

    def _decode_step(self, t: float) -> None:
        """Every running stream got one more token at ``t``; retire the finished ones."""
        dtimes = self._dtimes
        self._dgaps.append(t - dtimes[-1] if dtimes else 0.0)
        self._dweights.append(self.decoding - self._entered)
        self._entered = 0
        dtimes.append(t)
        n_dec = self.decoding
        self._ctx_sum += n_dec
        step = len(dtimes)
        if self.kv_pool_tokens is not None:
            self._rem_sum -= n_dec - self._clipped
            clip = self._clip_heap
            while clip and clip[0][0] <= step:
                _, _, epoch, job = heapq.heappop(clip)
                if epoch == job.epoch:
                    self._clipped -= 1
            in_use = self._partial_kv + self._ctx_sum
            if in_use > self.peak_kv_tokens:
                self.peak_kv_tokens = in_use
        heap = self._dec_heap
        if not heap or heap[0][0] > step:
            return
        while heap and heap[0][0] <= step:
            last, _, epoch, job = heapq.heappop(heap)
            if epoch != job.epoch:
                continue
            self._close_segment(job, last)
            job.finished_s = dtimes[last - 1]
            self.decoding -= 1
            self._ctx_sum -= job.req.prompt_tokens + job.req.output_tokens
            self._active.pop(job.seq, None)

    def result(self, workload: Workload) -> SimResult:
        """The run so far as plain data (after ``run``: the whole workload)."""
        reqs = workload.requests
        makespan = self.now_s - (reqs[0].arrival_s if reqs else 0.0)
        return SimResult(workload, self.policy.name, self.start_threshold, self.config,
                         self.profile, self.jobs, makespan, self.prefill_busy_s,
                         self.prefill_tokens, self.passes, self.rounds, self.settings,
                         self.busy_s, self._dgaps, self._dweights, self._entry_gaps,
                         self.kv_pool_tokens, self.peak_kv_tokens, self.retractions,
                         self.rejected)


def simulate(
    workload: Workload,
    policy: Policy,
    profile: Profile,
    config: EngineConfig | None = None,
    record_rounds: bool = False,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Run ``workload`` through one engine under ``policy``; deterministic.

    ``progress`` is called with the number of requests arrived so far, every 1024.
    """
    reqs = workload.requests
    eng = Engine(policy, profile, config, record_rounds,
                 start_s=reqs[0].arrival_s if reqs else 0.0, progress=progress)
    for req in reqs:
        eng.submit(req)
    eng.run()
    return eng.result(workload)


def _refresh_head(queue: WaitQueue[Job], cache: PrefixCache, threshold: int, budget: int,
                  slots: int, limited: bool) -> int:
    """Re-match the requests at the head of the queue that this round could admit.

    Returns how many there are (the allocator never reaches past them), at most ``slots``
    (what ``max_running_requests`` leaves). With a KV pool (``limited``) each also gets
    its ``out_reserve``: its output clipped as SGLang estimates it, and the cached prefix
    it will lock.
    """
    room = budget
    n = 0
    for job in queue.items:
        if n >= slots:
            break
        req = job.req
        if not job.redo:
            hit = cache.peek(req.blocks, req.block_sizes)
            last = req.prompt_tokens - 1  # usable_hit, inlined
            job.need = req.prompt_tokens - (hit if hit < last else last)
        if limited:
            out = req.output_tokens - job.redo
            job.out_reserve = (out if out < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) + (
                req.prompt_tokens + job.redo - job.need)
        n += 1
        room -= min(job.need, threshold) if threshold else job.need
        if room <= 0:
            break
    return n


def _short_waiting(queue: WaitQueue[Job], cache: PrefixCache, line: int) -> bool:
    """Reflex mode's step 1 (admission.py): one of the first ``REFLEX_SCAN`` waiting
    requests, re-matched as ``_refresh_head`` matches them, needs at most ``line``
    (``admission.reflex_line``)."""
    if line <= 0:
        return False
    for job in queue.items[:REFLEX_SCAN]:
        if not job.redo:
            req = job.req
            hit = cache.peek(req.blocks, req.block_sizes)
            last = req.prompt_tokens - 1  # usable_hit, inlined
            job.need = req.prompt_tokens - (hit if hit < last else last)
        if job.need <= line:
            return True
    return False


def _srpt_merge(queue: WaitQueue[Job], head: int, partials: list[Job]) -> list[Job]:
    """Partials and the queue's head in one srpt order (partials keyed by what remains).

    Waiting requests keep their queue keys, so those admitted stay a prefix of the queue.
    """
    keyed = [(queue.keys[k], queue.items[k]) for k in range(head)]
    keyed += [((srpt_key(j.arrival_s, j.need, queue.aging), j.arrival_s, j.seq), j)
              for j in partials]
    keyed.sort(key=lambda kj: kj[0])
    return [j for _, j in keyed]
