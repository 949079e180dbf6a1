"""The digital twin: one engine simulated round by round (one round = one forward pass).

Two events drive it, taken in time order: a request arrives, or the pass in flight ends.
At the start of every pass the policy decides what runs:

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
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from slipstream.sim.admission import allocate, partials_first, srpt_key
from slipstream.sim.cache import PrefixCache, usable_hit
from slipstream.sim.cost import CostModel, chunk_pairs
from slipstream.sim.policies import EngineConfig, FirstToken, Policy, RoundView, Setting
from slipstream.sim.profiles import Profile
from slipstream.sim.queue import WaitQueue
from slipstream.sim.workload import Request, Workload


class Job:
    """A request's state inside the engine."""

    __slots__ = (
        "req", "rid", "seq", "arrival_s", "need", "cached_est", "offset", "cached",
        "host_tokens", "uncached", "first_token_s", "solo_s", "entry_step",
        "max_itl_s", "finished_s",
    )

    def __init__(self, req: Request, seq: int, cached_est: int) -> None:
        self.req = req
        self.rid = req.rid
        self.seq = seq
        self.arrival_s = req.arrival_s
        self.cached_est = cached_est
        self.need = req.prompt_tokens - usable_hit(req.prompt_tokens, cached_est)
        self.offset = 0
        self.cached = 0
        self.host_tokens = 0
        self.uncached = 0
        self.first_token_s = -1.0
        self.solo_s = 0.0
        self.entry_step = 0
        self.max_itl_s: float | None = None
        self.finished_s = -1.0


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
    cfg = config or EngineConfig()
    start_threshold = policy.rule.threshold
    cost = CostModel(profile)
    cache = PrefixCache(cfg.cache_tokens, cfg.host_cache_tokens)
    queue: WaitQueue[Job] = WaitQueue(policy.order, cfg.srpt_aging_tokens_per_s)
    reqs = workload.requests
    n_reqs = len(reqs)
    jobs: list[Job] = []
    partials: list[Job] = []
    rounds: list[RoundRecord] = []
    settings: list[tuple[float, Setting]] = []
    observed: list[FirstToken] | None = [] if policy.controller is not None else None

    # Decoding streams as aggregates.
    dec_heap: list[tuple[int, int, Job]] = []
    n_dec = 0
    ctx_sum = 0
    dtimes: list[float] = []
    dgaps: list[float] = []

    linear_s, attn_s = cost.linear_s, cost.attn_s
    weights_s, kv_s, overhead_s, host_s = cost.weights_s, cost.kv_s, cost.overhead_s, cost.host_s
    budget_c = cfg.chunked_prefill_size

    t = reqs[0].arrival_s if n_reqs else 0.0
    i = 0
    busy = 0.0
    prefill_tokens = 0
    passes = 0

    def finish_decodes(now: float) -> None:
        nonlocal n_dec, ctx_sum
        step = len(dtimes)
        while dec_heap and dec_heap[0][0] <= step:
            last, _, job = heapq.heappop(dec_heap)
            e = job.entry_step
            first_gap = dtimes[e] - job.first_token_s
            rest = max(dgaps[e + 1 : last], default=0.0)
            job.max_itl_s = first_gap if first_gap > rest else rest
            job.finished_s = dtimes[last - 1]
            n_dec -= 1
            ctx_sum -= job.req.prompt_tokens + job.req.output_tokens

    def decode_step(now: float) -> None:
        nonlocal ctx_sum
        dgaps.append(now - dtimes[-1] if dtimes else 0.0)
        dtimes.append(now)
        ctx_sum += n_dec
        finish_decodes(now)

    while i < n_reqs or queue.items or partials or n_dec:
        while i < n_reqs and reqs[i].arrival_s <= t:
            req = reqs[i]
            if req.warm_blocks:
                cache.insert(req.blocks[: req.warm_blocks], req.block_sizes[: req.warm_blocks])
            job = Job(req, i, cache.peek(req.blocks, req.block_sizes))
            jobs.append(job)
            queue.push(job)
            i += 1
            if progress is not None and not i % 1024:
                progress(i)
        if not queue.items and not partials and not n_dec:
            t = reqs[i].arrival_s
            continue

        if policy.controller is not None and t >= policy.next_control_s:
            assert observed is not None
            view = RoundView(t, tuple(j.need for j in queue.items),
                             tuple(j.need for j in partials), n_dec, tuple(observed))
            observed.clear()
            setting = policy.controller(view)
            policy.next_control_s = t + policy.interval_s
            if setting is not None:
                policy.apply(setting)
                queue.set_order(policy.order)
                settings.append((t, setting))

        rule = policy.rule
        alloc: dict[str, int] = {}
        if queue.items or partials:
            budget = rule.chunked_prefill_size - (n_dec if policy.decodes_in_budget else 0)
            if budget > 0:
                head = _refresh_head(queue, cache, rule.threshold, budget)
                if partials_first(rule, policy.order):
                    alloc = allocate(rule, partials, queue.items, budget)
                else:
                    alloc = allocate(rule, (), _srpt_merge(queue, head, partials), budget)

        if not alloc:
            # A decode-only pass; with nothing waiting, run decode steps back to back
            # until the next arrival (no per-stream work in this loop).
            if not n_dec:
                raise RuntimeError(f"engine stalled at t={t:.3f}s with no admissible prefill")
            next_arrival = reqs[i].arrival_s if i < n_reqs else float("inf")
            while True:
                compute = n_dec * linear_s + ctx_sum * attn_s
                memory = weights_s + ctx_sum * kv_s
                dt = overhead_s + (compute if compute > memory else memory)
                if record_rounds:
                    rounds.append(RoundRecord(t, t + dt, (), n_dec))
                t += dt
                passes += 1
                decode_step(t)
                if queue.items or partials or not n_dec or t >= next_arrival:
                    break
            continue

        # A prefill pass (with the decodes riding along in mixed mode).
        tokens = pairs = kv = host = 0
        done: list[Job] = []
        still: list[Job] = []
        n_new = len(alloc) - sum(1 for job in partials if job.rid in alloc)
        admitted = queue.items[:n_new]
        queue.pop_front(n_new)
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
        partials = still
        prefill_tokens += tokens

        decoding_here = policy.mixed and n_dec > 0
        if decoding_here:
            tokens += n_dec
            pairs += ctx_sum
            kv += ctx_sum
        compute = tokens * linear_s + pairs * attn_s
        memory = weights_s + kv * kv_s
        dt = overhead_s + (compute if compute > memory else memory) + host * host_s
        if record_rounds:
            rounds.append(RoundRecord(t, t + dt, tuple(alloc.items()), n_dec if decoding_here else 0))
        t += dt
        busy += dt
        passes += 1
        if decoding_here:
            decode_step(t)
        step = len(dtimes)
        for job in done:
            job.first_token_s = t
            req = job.req
            if observed is not None:
                observed.append(FirstToken(req.tenant, job.arrival_s, t, req.prompt_tokens, job.uncached))
            cache.insert(req.blocks, req.block_sizes)
            if req.output_tokens > 1:
                job.entry_step = step
                heapq.heappush(dec_heap, (step + req.output_tokens - 1, job.seq, job))
                n_dec += 1
                ctx_sum += req.prompt_tokens + 1
            else:
                job.finished_s = t

    makespan = t - (reqs[0].arrival_s if n_reqs else 0.0)
    return SimResult(workload, policy.name, start_threshold, cfg, profile, jobs, makespan, busy, prefill_tokens,
                     passes, rounds, settings)


def _admit(job: Job, cache: PrefixCache, cost: CostModel, budget: int) -> int:
    """First allocation of a request: match its prefix for real; returns host tokens to load."""
    req = job.req
    cached, job.host_tokens = cache.admit(req.blocks, req.block_sizes, req.prompt_tokens)
    job.cached = job.offset = cached
    job.uncached = job.need = req.prompt_tokens - cached
    job.solo_s = cost.solo_prefill_s(cached, job.need, budget, job.host_tokens)
    return job.host_tokens


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
