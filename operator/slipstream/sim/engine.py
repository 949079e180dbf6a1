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

from slipstream.sim.admission import allocate, partials_first, srpt_key
from slipstream.sim.cache import PrefixCache, usable_hit
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
        "max_itl_s", "finished_s", "_times",
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
        self.cached = 0
        self.host_tokens = 0
        self.uncached = 0
        self.first_token_s = -1.0
        self.solo_s = 0.0
        self.entry_step = 0
        self.max_itl_s: float | None = None
        self.finished_s = -1.0
        self._times: list[float] | None = None

    def tokens_out(self, at_s: float) -> int:
        """Output tokens produced by twin time ``at_s`` (what a stream has sent so far)."""
        if self.first_token_s < 0 or at_s < self.first_token_s:
            return 0
        times = self._times
        if times is None:
            return 1
        start = self.entry_step
        end = min(start + self.req.output_tokens - 1, len(times))
        return 1 + bisect.bisect_right(times, at_s, start, end) - start


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


# The cache steps of a request's life, shared by the engine and rate.solo_busy_s.

def _arrive(job: Job, cache: PrefixCache) -> None:
    """A request arrives: its warm prefix enters the cache; estimate its uncached need."""
    req = job.req
    if req.warm_blocks:
        cache.insert(req.blocks[: req.warm_blocks], req.block_sizes[: req.warm_blocks])
    job.cached_est = cache.peek(req.blocks, req.block_sizes)
    job.need = req.prompt_tokens - usable_hit(req.prompt_tokens, job.cached_est)


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


class Engine:
    """One engine as a steppable object: submit requests, advance the clock, apply settings.

    ``now_s`` is the twin clock. ``advance(until_s)`` runs every pass that starts at or
    before ``until_s`` (the last may end after it); an idle engine's clock moves to
    ``until_s``. Requests may be submitted ahead of time (``simulate`` submits a whole
    workload at once): they join the queue when the clock reaches their arrival.
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
        self.cost = CostModel(profile)
        self.cache = PrefixCache(cfg.cache_tokens, cfg.host_cache_tokens)
        self.queue: WaitQueue[Job] = WaitQueue(policy.order, cfg.srpt_aging_tokens_per_s)
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
        self._pending: deque[Job] = deque()
        self._arrived = 0
        self._partials: list[Job] = []
        self._observed: list[FirstToken] | None = [] if policy.controller is not None else None
        # Decoding streams as aggregates: count, summed context, (last step, seq, job) heap,
        # the end time of every decode step and the gap before it.
        self.decoding = 0
        self._ctx_sum = 0
        self._dec_heap: list[tuple[int, int, Job]] = []
        self._dtimes: list[float] = []
        self._dgaps: list[float] = []
        self._dweights: list[int] = []
        self._entered = 0
        """Streams that started decoding since the last decode step."""
        self._entry_gaps: list[float] = []

    # ---- the API ---------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Requests arrived and not yet given any prefill tokens (sglang:num_queue_reqs)."""
        return len(self.queue.items)

    @property
    def partials(self) -> int:
        """Requests part-way through their prefill."""
        return len(self._partials)

    @property
    def busy(self) -> bool:
        """Whether any arrived work is pending (waiting, part-prefilled or decoding)."""
        return bool(self.queue.items or self._partials or self.decoding)

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
            if job.rid == rid:
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
            if not self.busy:
                if pending and pending[0].arrival_s <= until_s:
                    self.now_s = pending[0].arrival_s
                    continue
                if self.now_s < until_s < math.inf:
                    self.now_s = until_s
                return
            if self.now_s > until_s:
                return
            self._control()
            alloc = self._allocation()
            if alloc:
                self._prefill_pass(alloc)
            elif self.decoding:
                self._decode_passes(until_s)
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
                         tuple(j.need for j in self._partials), self.decoding, tuple(observed))
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
        budget = rule.chunked_prefill_size - (self.decoding if policy.decodes_in_budget else 0)
        if budget <= 0:
            return {}
        queue.start_round(self.prefill_tokens)  # hrrn's clock: prefill tokens so far
        head = _refresh_head(queue, self.cache, rule.threshold, budget)
        if partials_first(rule, policy.order):
            return policy.allocator(rule, partials, queue.items, budget)
        return allocate(rule, (), _srpt_merge(queue, head, partials), budget)

    def _decode_passes(self, until_s: float) -> None:
        """Decode-only passes; with nothing waiting, back to back until the next event.

        No per-stream work in this loop: it is the twin's hot path under load.
        """
        pending, queue, policy = self._pending, self.queue, self.policy
        next_event = pending[0].arrival_s if pending else math.inf
        if policy.controller is not None and policy.next_control_s < next_event:
            next_event = policy.next_control_s
        pass_time = self.cost.pass_time
        t = self.now_s
        while True:
            ctx = self._ctx_sum
            dt = pass_time(self.decoding, ctx, ctx, 0, DECODE)
            if self.record_rounds:
                self.rounds.append(RoundRecord(t, t + dt, (), self.decoding))
            t += dt
            self.now_s = t
            self.busy_s += dt
            self.passes += 1
            self._decode_step(t)
            if queue.items or self._partials or not self.decoding or t >= next_event or t > until_s:
                return

    def _prefill_pass(self, alloc: dict[str, int]) -> None:
        """A prefill pass (the running decodes riding along in mixed mode)."""
        tokens = pairs = kv = host = 0
        done: list[Job] = []
        still: list[Job] = []
        partials, queue, cache, cost = self._partials, self.queue, self.cache, self.cost
        n_new = len(alloc) - sum(1 for job in partials if job.rid in alloc)
        admitted = queue.items[:n_new]
        queue.pop_front(n_new)
        budget_c = self.config.chunked_prefill_size
        for job in admitted:
            host += _admit(job, cache, cost, budget_c)
        for job in (*partials, *admitted):
            take = alloc.get(job.rid, 0)
            if take:
                pairs += chunk_pairs(job.offset, take)
                kv += job.offset
                tokens += take
                job.offset += take
                job.need -= take
            (done if job.need == 0 else still).append(job)
        self._partials = still
        self.prefill_tokens += tokens

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

    # ---- decode bookkeeping ----------------------------------------------------------

    def _first_token(self, job: Job, t: float) -> None:
        """A prefill finished at ``t``: cache the prompt, start decoding (or finish)."""
        job.first_token_s = t
        req = job.req
        if self._observed is not None:
            self._observed.append(FirstToken(req.tenant, job.arrival_s, t, req.prompt_tokens,
                                             job.uncached))
        _prefilled(job, self.cache)
        if req.output_tokens > 1:
            step = len(self._dtimes)
            job.entry_step = step
            job._times = self._dtimes
            heapq.heappush(self._dec_heap, (step + req.output_tokens - 1, job.seq, job))
            self.decoding += 1
            self._entered += 1
            self._ctx_sum += req.prompt_tokens + 1
        else:
            job.finished_s = t

    def _decode_step(self, t: float) -> None:
        """Every running stream got one more token at ``t``; retire the finished ones."""
        dtimes = self._dtimes
        self._dgaps.append(t - dtimes[-1] if dtimes else 0.0)
        self._dweights.append(self.decoding - self._entered)
        self._entered = 0
        dtimes.append(t)
        self._ctx_sum += self.decoding
        step = len(dtimes)
        heap = self._dec_heap
        if not heap or heap[0][0] > step:
            return
        dgaps = self._dgaps
        while heap and heap[0][0] <= step:
            last, _, job = heapq.heappop(heap)
            e = job.entry_step
            first_gap = dtimes[e] - job.first_token_s
            self._entry_gaps.append(first_gap)
            rest = max(dgaps[e + 1 : last], default=0.0)
            job.max_itl_s = first_gap if first_gap > rest else rest
            job.finished_s = dtimes[last - 1]
            self.decoding -= 1
            self._ctx_sum -= job.req.prompt_tokens + job.req.output_tokens

    def result(self, workload: Workload) -> SimResult:
        """The run so far as plain data (after ``run``: the whole workload)."""
        reqs = workload.requests
        makespan = self.now_s - (reqs[0].arrival_s if reqs else 0.0)
        return SimResult(workload, self.policy.name, self.start_threshold, self.config,
                         self.profile, self.jobs, makespan, self.prefill_busy_s,
                         self.prefill_tokens, self.passes, self.rounds, self.settings,
                         self.busy_s, self._dgaps, self._dweights, self._entry_gaps)


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


def _refresh_head(queue: WaitQueue[Job], cache: PrefixCache, threshold: int, budget: int) -> int:
    """Re-match the requests at the head of the queue that this round could admit.

    Returns how many there are (the allocator never reaches past them).
    """
    room = budget
    n = 0
    for job in queue.items:
        req = job.req
        job.need = req.prompt_tokens - usable_hit(req.prompt_tokens,
                                                  cache.peek(req.blocks, req.block_sizes))
        n += 1
        room -= min(job.need, threshold) if threshold else job.need
        if room <= 0:
            break
    return n


def _srpt_merge(queue: WaitQueue[Job], head: int, partials: list[Job]) -> list[Job]:
    """Partials and the queue's head in one srpt order (partials keyed by what remains).

    Waiting requests keep their queue keys, so those admitted stay a prefix of the queue.
    """
    keyed = [(queue.keys[k], queue.items[k]) for k in range(head)]
    keyed += [((srpt_key(j.arrival_s, j.need, queue.aging), j.arrival_s, j.seq), j)
              for j in partials]
    keyed.sort(key=lambda kj: kj[0])
    return [j for _, j in keyed]
