"""SGLang 0.5.23's ``shortest-prefill-first`` and ``hrrn`` orders, one round at a time.

Read from SGLang 0.5.23 (``pip download --no-deps sglang==0.5.23``),
``sglang/srt/managers/schedule_policy.py``; the functions cited are ``SchedulePolicy``'s:

- ``calc_priority`` runs every round, before admission, on the whole waiting list in its
  current order (last round's order, arrivals and retracted requests appended at the end by
  ``Scheduler._add_request_to_queue``). ``_determine_active_policy`` turns hrrn (and lpm) into
  fcfs past ``WAITING_QUEUE_PREFIX_MATCH_MAX`` = 128 waiting requests, and fcfs does nothing
  to the list: past 128, hrrn's last order is kept and new requests queue behind it.
  shortest-prefill-first has no such fallback.
- ``_compute_prefix_matches`` re-matches every waiting request's prefix against the cache
  (``match_kv_cache``), and de-duplicates within the batch: walking the list in its current
  order, a request whose cached prefix is at most ``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD``
  (32) tokens is matched against a radix tree of the waiting requests walked so far; a match
  of at least ``IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD`` (32) tokens marks it
  ``temporary_deprioritized`` (it goes last), otherwise its tokens enter that tree.
- ``_sort_by_shortest_prefill``: stable sort on (deprioritized, ``max(1, input + output -
  matched)``, ``time_stats.wait_queue_entry_time``). The entry time is stamped in
  ``_add_request_to_queue``, so a retracted request gets a new one.
- ``_sort_by_hrrn``: stable sort on ``(-(processed_tokens - arrival_processed_tokens) /
  uncached, rid)``, with ``uncached = max(0, input - matched)`` (prompt only), ``(-inf, rid)``
  when nothing is uncached and ``(inf, rid)`` when deprioritized. ``rid`` is a random uuid
  hex in SGLang, so ties fall in random order: the queue draws each request's tie string
  from one seeded RNG per run (``WaitQueue``). ``arrival_processed_tokens`` is also stamped
  in ``_add_request_to_queue``, so it restarts on retraction.

The twin's prefixes are block ids (equal ids = shared prefix, ``sim/cache.py``): the
in-batch tree is the set of blocks of the requests inserted so far, and a match is the run
of leading blocks found in it. A retracted request recomputes its whole context without a
cache hit (``engine.py``), so it is not re-matched here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

WAITING_QUEUE_PREFIX_MATCH_MAX = 128
"""hrrn (and lpm) fall back to fcfs past this many waiting requests (schedule_policy.py)."""
IN_BATCH_CHECK_TOKENS = 32
"""``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD``: only requests with at most this many cached
tokens are checked against the other waiting requests."""
IN_BATCH_DEPRIORITIZE_TOKENS = 32
"""``IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD``: a shared prefix this long with an
earlier waiting request sends a request to the back."""

UPSTREAM_ORDERS = ("spf", "hrrn")


class Waiting(Protocol):
    seq: int
    need: int
    """Uncached tokens to compute: prompt plus recomputed output, less the cached prefix."""
    redo: int
    """Output tokens to recompute (a retracted request); 0 otherwise."""
    cached_est: int
    """Cached prefix tokens found at the last match."""


W = TypeVar("W", bound=Waiting)
Prefix = Callable[[W], tuple[Sequence[int], Sequence[int]]]
"""A request's prefix blocks and their sizes in tokens."""


def hrrn_active(waiting: int) -> bool:
    """Whether hrrn sorts this round (``_determine_active_policy``)."""
    return waiting <= WAITING_QUEUE_PREFIX_MATCH_MAX


def deprioritized(jobs: Sequence[W], prefix: Prefix[W] | None) -> set[int]:
    """``_compute_prefix_matches``' in-batch de-duplication: the seqs sent to the back.

    Walks ``jobs`` in their current order; ``prefix`` gives each job's blocks (None: no
    prefixes known, nothing de-duplicated).
    """
    out: set[int] = set()
    if prefix is None:
        return out
    tree: set[int] = set()
    for job in jobs:
        if job.cached_est > IN_BATCH_CHECK_TOKENS:
            continue
        blocks, sizes = prefix(job)
        matched = 0
        for block, size in zip(blocks, sizes, strict=True):
            if block not in tree:
                break
            matched += size
        if matched >= IN_BATCH_DEPRIORITIZE_TOKENS:
            out.add(job.seq)
        else:
            tree.update(blocks)
    return out


def spf_sorted(jobs: Sequence[W], dep: set[int], entry_s: dict[int, float]) -> list[W]:
    """``_sort_by_shortest_prefill``: (deprioritized, uncached work, queue entry time)."""
    return sorted(jobs, key=lambda j: (j.seq in dep, max(1, j.need), entry_s[j.seq]))


def hrrn_sorted(jobs: Sequence[W], dep: set[int], processed: int,
                arrival_processed: dict[int, int], tie: dict[int, str]) -> list[W]:
    """``_sort_by_hrrn``: highest ratio of prefill tokens processed since entry to the
    uncached prompt, ties by the request's random id."""

    def key(j: W) -> tuple[float, str]:
        rid = tie[j.seq]
        if j.seq in dep:
            return (float("inf"), rid)
        uncached = max(0, j.need - j.redo)
        if uncached <= 0:
            return (-float("inf"), rid)
        return (-max(0, processed - arrival_processed[j.seq]) / uncached, rid)

    return sorted(jobs, key=key)


def calc_priority(jobs: Sequence[W], order: str, processed: int, entry_s: dict[int, float],
                  arrival_processed: dict[int, int], tie: dict[int, str],
                  rematch: Callable[[W], None] | None = None,
                  prefix: Prefix[W] | None = None) -> list[W] | None:
    """One round of ``SchedulePolicy.calc_priority`` for ``order`` ("spf" or "hrrn").

    Returns the new order, or None when the list stays as it is (hrrn past 128 waiting).
    ``rematch`` refreshes a job's ``need`` and ``cached_est`` from the cache (None: keep).
    """
    if order == "hrrn" and not hrrn_active(len(jobs)):
        return None
    if rematch is not None:
        for job in jobs:
            if not job.redo:
                rematch(job)
    dep = deprioritized(jobs, prefix)
    if order == "spf":
        return spf_sorted(jobs, dep, entry_s)
    if order == "hrrn":
        return hrrn_sorted(jobs, dep, processed, arrival_processed, tie)
    raise ValueError(f"calc_priority: unknown upstream order {order!r} (one of {UPSTREAM_ORDERS})")
