"""How one scheduler round splits its prefill token budget among requests.

This is the contract shared by the digital twin and the engine patch
(engine_image/patches/): the patched SGLang ``PrefillAdder`` must make exactly these
allocations, and tests/engine/ checks that it does on randomized request mixes. Keep it
pure and small: it runs once per simulated round, on the twin's hot path.

The rule, with C the round budget (``chunked_prefill_size``), T the long-prefill
threshold (0 = off, SGLang 0.5.18 as shipped), P the page size and M stock's
``max_prefill_tokens`` check:

1. Partial prefills already in progress are served first, oldest first: each takes
   ``min(need, T, budget left)`` (page-floored when it does not finish).
2. Waiting requests, in the order the admission order policy gave them: a request may
   take at most ``want = min(need, T)``; it is admitted whole, capped (it becomes a
   partial prefill) or truncated by what is left of the budget, after which the round is
   full, as in stock SGLang. Stock's ``rem_input_tokens`` check (with chunked prefill
   on) stops admission once an admitted request has used up what is left of M.
   Budgets are charged in whole pages, as SGLang's ``PrefillAdder`` charges them.
3. Floor mode, and a capped reflex round that refused a new request (below): what is
   left of the budget goes to the partial prefills, those in progress oldest first, then
   the ones this round started in admission order, so a lone long request uses the whole
   budget (work-conserving).

Memory (``kv_free`` given; None = unlimited, the rule above unchanged). A NEW request
(one getting tokens for the first time) is admitted only if its whole remaining need fits
beside the unbuilt remainder of every partial prefill: with K = ``kv_free`` (available +
evictable KV tokens less stock's reservation for the running decodes), R = the partials'
remaining uncached tokens, page-rounded, less what this round already gives them, and
``charged`` = what this round's chunks have charged so far (each ``ceil_page(take) + P``,
plus the request's ``out_reserve`` when the chunk finishes its prefill, as SGLang's
``_update_prefill_budget`` charges), the request needs
``need + out_reserve + P + R < K - charged`` (stock's ``total_tokens >= rem_total_tokens``
check, strict, with R added). A refused request ends new admissions for the round (stock's
NO_TOKEN), as does ``K - charged <= 0`` after an admission; partial prefills are never
refused for memory, their remainder being reserved, so no allocation can fail, and under
srpt in ceiling mode a partial sorted after a refused request is still served: no order
starves work that already holds KV. A new request truncated into a partial adds its
unbuilt remainder to R.
Partials (``max_partials`` given): a new request that would be left partial after this
round is refused (ending new admissions) while ``max_partials`` partials are unfinished.

With T = 0 this is exactly stock: one chunked request holds the whole budget until it
finishes.

Reflex mode (``reflex``): the cap applies only in the passes where it matters, so a giant
prompt's arrival is handled by the next pass and uniform traffic pays nothing. Each round:

1. The engine looks at the first ``REFLEX_SCAN`` (128) waiting requests in admission
   order (partial prefills in progress are not waiting), each re-matched against the
   prefix cache as at the round's start, for a *short* one: uncached need <= the line,
   ``max(T, L // REFLEX_RATIO)``, where L is the largest remaining uncached need of the
   partial prefills in progress (0 when there are none).
2. If one is found, the engine notes the round's start time as the last short sighting.
3. The round is *capped* if a short request was found (step 1) or the last sighting was
   less than H seconds ago (the hold, ``--long-prefill-reflex-hold-seconds``, default
   ``DEFAULT_REFLEX_HOLD_S``; 0 = no hold). A capped round is allocated as ceiling mode
   with T (steps 1-2 above, and under srpt the merged order of partials and waiting
   requests); then, if a new request was refused in it (memory, or the partials bound)
   and budget is left, that budget goes to the partial prefills as in floor mode (step 3
   above): the engine cannot take more work this round, so a cap that idles budget only
   slows the prefills that hold the memory the queue waits for.
4. Otherwise the round is *uncapped*: it is allocated as T = 0 (stock): partials in
   progress oldest first, each taking what it needs up to the budget left, then waiting
   requests whole, or truncated by the budget, after which the round is full.

``reflex_round`` turns a reflex rule into the round's rule; ``allocate`` never sees a
reflex rule (it raises). T = 0 in reflex mode is stock. A short request is never capped
(need <= T), so in a capped round it is served whole; the line between short and long
is T, or a quarter of the longest prefill in progress when that is more: a 12K-token
document behind a 190K-token giant's remainder is short, one 16K document behind another
is not (on ``examples/workloads/loopbench-rag.yaml``, twin, ``reflex:4096/srpt``: the
rag phase after the giants 3.65 s with the line at T alone, 2.53 s with the quarter, the
ceiling's; the demo's phases unchanged, ratio 2, 3 and 4 alike, 8 and 16 no better than
none). The hold is why a stream of short requests among
giants is served as ceiling serves it: without it, every gap in the stream lets a giant
take a whole uncapped pass, and the next short arrival waits for that pass (on the demo's
phases, twin, ``reflex:4096/srpt``: the heterogeneous phase's worst-tenant p99 TTFT 1.55 s
at no hold, 1.25 s at 1 s, 1.00 s at 3 s, the ceiling's 1.00 s; the documents phases
0.89 s and 0.94 s at every hold, stock's). The hold is in engine seconds, so an idle
engine forgets it: a giant after a quiet spell takes whole passes. The fill on refusal
(step 3) is what keeps a reflex from costing throughput when the fleet is over capacity:
there the queue is memory-bound, a capped round admits one long prompt at T and idles the
rest of the pass, and the backlog grows (``scripts/sweep-random.py``'s workloads, twin,
``reflex:4096/srpt`` left on, before and after it, 2026-12-07: seed 12's documents
phase 178.8 s and 2.7 s, its whole run 178.7 s and 90.8 s; seed 17's whole run 47.1 s
and 35.5 s; ``scripts/reflex-offline.py random:12 0 --constants``). Filling every capped
round instead (refusal or not) costs the heterogeneous demo phase (1.00 s -> 1.47 s at
720 s phases): longer passes delay the next short arrival. The demo's phases and
``loopbench-rag.yaml`` are unchanged by the fill on refusal (0.94 s and 2.00 s whole).

Precedence of partial prefills (``partials_first``): they are served before any waiting
request under fcfs and lpm (they are the oldest), with T = 0 (stock's chunked request
always goes first) and in floor mode (a partial keeps its guaranteed T, which is what
stops long prompts from starving under srpt). Under srpt in ceiling mode they have no
precedence: the caller passes ``partials=[]`` and one list of every candidate sorted by
``srpt_key`` (a partial keyed by its remaining tokens), naming the partials in it with
``partial_rids``, so a short arrival may take a round's budget from a long prompt in
progress (shortest remaining prefill first), for at most need / aging seconds (the aging
bound of ``srpt_key``), never because of memory.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Protocol

MODES = ("ceiling", "floor", "reflex")

DEFAULT_REFLEX_HOLD_S = 3.0
"""Reflex mode's hold H (step 3): rounds stay capped this long after the last one that
found a short request waiting. Chosen on the demo's phases (240 s and 720 s, the module
docstring's figures): 1 s leaves the heterogeneous phase 1.25x the ceiling, 3 s matches it,
10 s is no better there."""

REFLEX_RATIO = 4
"""Reflex mode's step 1: a waiting request is short when it needs at most T, or at most
1 / REFLEX_RATIO of the largest remaining need among the partial prefills in progress."""

REFLEX_SCAN = 128
"""How many waiting requests (in admission order) reflex mode looks at for a short one:
the bound srpt's re-match has in the engine patch, so a pass's cost stays bounded."""

DEFAULT_SRPT_AGING_TOKENS_PER_S = 1024.0
"""Aging rate of the ``srpt`` order, in uncached tokens per second of waiting.

A waiting request's key is ``arrival_s + need / aging``, so a request needing R tokens is
never overtaken by one that arrived more than R / aging seconds after it: a 4K-token
prompt yields for at most 4 s, a 100K one for 98 s, a 600K cold prompt for ~10 min.
Chosen on the twin (Mooncake conversation + Azure code at 70% load, ceiling:4096/srpt):
worst-tenant p99 slowdown 51 at 4096 tokens/s, 7.8 at 1024, 5.9 at 256, while the
longest decile's p99 slowdown stays 6.5-7.5; 1024 keeps most of the gain with a bound
four times tighter than 256's.
"""


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    """The engine settings that decide a round's prefill allocation."""

    chunked_prefill_size: int
    """C: prefill tokens per round (SGLang ``--chunked-prefill-size``)."""
    threshold: int = 0
    """T: most tokens one request may take per round; 0 = off (stock)."""
    mode: str = "ceiling"
    """``ceiling`` (the seed's patch), ``floor`` (T guaranteed, expands into idle budget)
    or ``reflex`` (ceiling while a short request waits, stock otherwise; ``reflex_round``)."""
    page_size: int = 1
    """KV page size: truncated chunks are floored to a multiple of it, as in SGLang."""
    max_prefill_tokens: int | None = 16384
    """Stock's ``--max-prefill-tokens`` (``rem_input_tokens``) check; None disables it."""
    fill_on_refusal: bool = False
    """A capped reflex round's step 3: when a new request is refused (memory or the partials
    bound), the budget left goes to the partials as in floor mode. Set by ``reflex_round``."""

    def __post_init__(self) -> None:
        if self.chunked_prefill_size <= 0:
            raise ValueError("chunked_prefill_size must be > 0")
        if self.page_size <= 0:
            raise ValueError("page_size must be > 0")
        if self.threshold < 0:
            raise ValueError("threshold must be 0 (off) or a positive token count")
        if self.threshold % self.page_size:
            raise ValueError(
                f"threshold {self.threshold} must be a multiple of page_size {self.page_size}"
            )
        if self.threshold > self.chunked_prefill_size:
            raise ValueError(
                f"threshold {self.threshold} must be <= chunked_prefill_size "
                f"{self.chunked_prefill_size}"
            )
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    @property
    def concurrency(self) -> int:
        """Partial prefills that run at once at full share: C // T (1 when off)."""
        return self.chunked_prefill_size // self.threshold if self.threshold else 1


class HasNeed(Protocol):
    """Anything with an id and remaining uncached tokens (the twin's jobs, the tests' tuples)."""

    @property
    def rid(self) -> str: ...

    @property
    def need(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """A request as the allocator sees it: an id and its remaining uncached tokens."""

    rid: str
    need: int


def reflex_round(rule: AdmissionRule, short_waiting: bool) -> AdmissionRule:
    """The rule one round runs under: a reflex rule becomes ceiling with T when a short
    request waits (step 2 of reflex mode) and stock (T = 0) when none does (step 3); any
    other rule is returned as it is."""
    if rule.mode != "reflex":
        return rule
    return _reflex_resolved(rule, short_waiting)


@functools.lru_cache(maxsize=256)
def _reflex_resolved(rule: AdmissionRule, short_waiting: bool) -> AdmissionRule:
    if not short_waiting:
        return replace(rule, mode="ceiling", threshold=0)
    return replace(rule, mode="ceiling", fill_on_refusal=True)


def reflex_line(threshold: int, partial_needs: Iterable[int] = ()) -> int:
    """Reflex mode's step 1: the most uncached tokens a short request needs,
    ``max(T, L // REFLEX_RATIO)`` with L the largest partial's remaining need; 0 when T is
    0 (stock: nothing is short)."""
    if threshold <= 0:
        return 0
    return max(threshold, max(partial_needs, default=0) // REFLEX_RATIO)


def short_waiting(needs: Iterable[int], threshold: int, partial_needs: Iterable[int] = ()) -> bool:
    """Reflex mode's step 1: one of the first ``REFLEX_SCAN`` waiting needs (admission
    order, freshly matched) is at most ``reflex_line``. T = 0 never finds one."""
    line = reflex_line(threshold, partial_needs)
    return line > 0 and any(n <= line for n in islice(needs, REFLEX_SCAN))


@dataclass(slots=True)
class ReflexClock:
    """Reflex mode's steps 2-3: when a short request was last seen, and whether a round
    starting at ``now_s`` is capped. One per engine; the engine patch keeps the same."""

    hold_s: float = DEFAULT_REFLEX_HOLD_S
    last_short_s: float | None = None

    def capped(self, now_s: float, short: bool) -> bool:
        if short:
            self.last_short_s = now_s
            return True
        last = self.last_short_s
        return last is not None and now_s - last < self.hold_s


def partials_first(rule: AdmissionRule, order: str) -> bool:
    """Whether partial prefills in progress are served before waiting requests."""
    return order != "srpt" or rule.threshold == 0 or rule.mode == "floor"


def srpt_key(arrival_s: float, need: int, aging_tokens_per_s: float) -> float:
    """Sort key of the ``srpt`` order: shortest remaining prefill first, with aging."""
    return arrival_s + need / aging_tokens_per_s


def _ceil(tokens: int, page: int) -> int:
    return -(-tokens // page) * page


def allocate(
    rule: AdmissionRule,
    partials: Sequence[HasNeed],
    waiting: Sequence[HasNeed],
    budget: int | None = None,
    *,
    kv_free: int | None = None,
    max_partials: int | None = None,
    partial_rids: Collection[str] = (),
    chunk_limit: Callable[[HasNeed, int], int | None] | None = None,
) -> dict[str, int]:
    """Tokens each request prefills this round (requests given nothing are absent).

    ``partials`` are the partial prefills in progress, oldest first; ``waiting`` is the
    queue already sorted by the admission order. Dict order is admission order.
    ``budget`` overrides C for this round (mixed batching subtracts the decode tokens).
    ``kv_free``: KV tokens free for this round's prefill (available + evictable, less
    stock's reservation for running decodes); None = unlimited (no memory check).
    ``max_partials``: most partial prefills at once (engine ``--max-partial-prefills``);
    None = unbounded. ``partial_rids``: the rids in ``waiting`` that are partial prefills
    in progress, oldest first (srpt in ceiling mode, where the caller merges them into one
    order; the fill of step 3 goes in that order).
    A candidate may carry ``out_reserve`` (KV tokens charged for its output when its
    prefill finishes, SGLang's clipped ``max_new_tokens``); absent = 0. ``chunk_limit``
    (partial, budget left) -> a further cap on that partial's chunk, or None: SGLang 0.5.23's
    shortest-prefill-first cap, which the patch composes with T for each partial in turn
    (``policies.spf_allocate``); the floor mode's expansion is not capped by it.
    """
    if rule.mode == "reflex":
        raise ValueError("a reflex rule is resolved per round: pass reflex_round(rule, ...)")
    page = rule.page_size
    rem = rule.chunked_prefill_size if budget is None else budget
    rem_input = sys.maxsize if rule.max_prefill_tokens is None else rule.max_prefill_tokens
    cap = rule.threshold if rule.threshold > 0 else sys.maxsize
    limited = kv_free is not None
    kv_left = kv_free if kv_free is not None else 0
    running = set(partial_rids)
    # R: unbuilt remainder of every partial (page-rounded), and how many are unfinished.
    reserve = 0
    unfinished = 0
    for c in (*partials, *(c for c in waiting if c.rid in running)) if running else partials:
        reserve += -(-c.need // page) * page
        unfinished += 1
    new_open = True  # new admissions still allowed this round
    refused = False  # a new request was refused (memory or the partials bound)
    alloc: dict[str, int] = {}

    def charge(c: HasNeed, take: int, prior: int) -> None:
        nonlocal rem, rem_input, kv_left
        # SGLang charges whole pages (PrefillAdder._update_prefill_budget).
        pages = -(-take // page) * page
        rem -= pages
        rem_input -= pages
        if limited:
            done = prior + take == c.need
            kv_left -= pages + page + (getattr(c, "out_reserve", 0) if done else 0)

    def serve_partial(c: HasNeed) -> int:
        nonlocal reserve, unfinished
        take = min(c.need, cap, rem)
        if chunk_limit is not None and (limit := chunk_limit(c, rem)) is not None:
            take = min(take, limit)
        if take < c.need:
            take = take // page * page
        if take > 0:
            alloc[c.rid] = take
            charge(c, take, 0)
            reserve -= _ceil(c.need, page) - _ceil(c.need - take, page)
            if take == c.need:
                unfinished -= 1
        return take

    for c in partials:
        serve_partial(c)

    for c in waiting:
        if rem <= 0:
            break
        if c.rid in running:
            # srpt/ceiling: a partial in the merged order (never refused for memory).
            if serve_partial(c) < min(c.need, cap):
                break
            continue
        if not new_open:
            continue
        want = min(c.need, cap)
        take = want if want <= rem else rem // page * page
        if take <= 0:
            break
        if (limited and c.need + getattr(c, "out_reserve", 0) + page + reserve >= kv_left) or (
            max_partials is not None and take < c.need and unfinished >= max_partials
        ):
            # Stock's NO_TOKEN (or the partials bound): no more new requests this round;
            # partials later in a merged srpt order still run.
            new_open = False
            refused = True
            if not running:
                break
            continue
        alloc[c.rid] = take
        charge(c, take, 0)
        if take < c.need:
            reserve += _ceil(c.need - take, page)
            unfinished += 1
        if take < want or rem_input <= 0:
            # Truncated by the budget, or max_prefill_tokens used up: with chunked
            # prefill on, stock checks rem_input_tokens only after an admission.
            break
        if limited and kv_left <= 0:
            new_open = False
            if not running:
                break

    if rule.threshold > 0 and rem > 0 and (rule.mode == "floor" or (rule.fill_on_refusal and refused)):
        needs = {c.rid: c.need for c in partials}
        needs.update((c.rid, c.need) for c in waiting if c.rid in alloc)
        # Partials in progress oldest first, then this round's new requests in admission
        # order (under srpt the merged order put them anywhere).
        order = [*(r for r in partial_rids if r in alloc), *(r for r in alloc if r not in running)]
        for rid in order if running else list(alloc):
            short = needs[rid] - alloc[rid]
            if short <= 0:
                continue
            extra = min(short, rem)
            if extra < short:
                extra = extra // page * page
            if extra <= 0:
                break
            alloc[rid] += extra
            rem -= -(-extra // page) * page
    return alloc
