"""The waiting queue, kept sorted by the admission order.

Orders (SGLang's ``--schedule-policy`` names):
- ``fcfs``: arrival order (SGLang's default).
- ``lpm``: longest cached prefix first, as SGLang's ``lpm``, which falls back to fcfs
  when more than 128 requests wait (matching every request each round is too dear).
- ``srpt``: shortest remaining uncached prefill first, with aging: key
  ``arrival_s + need / aging`` (see ``admission.srpt_key`` for the bound it gives). As
  the engine patch (``long_prefill.srpt_order``), each round re-matches at most
  ``SRPT_REMATCH_MAX`` (128) waiting requests, the first of the list's order (last round's
  srpt order, new requests behind); every other request keeps the key of its last match
  (``Queued.srpt_key``), or, never matched, is keyed by its whole prompt (``unmatched``).
- ``spf``: SGLang 0.5.23's ``shortest-prefill-first``: uncached work, then queue entry
  time (``SchedulePolicy._sort_by_shortest_prefill``); no aging and no fcfs fallback.
- ``hrrn``: SGLang 0.5.23's highest response ratio next (``SchedulePolicy._sort_by_hrrn``):
  ratio ``(P - P_entry) / uncached prompt`` with P the prefill tokens processed so far (the
  wait counted in tokens, so it equals classic HRRN at constant throughput), highest first;
  past 128 waiting requests the last order is kept and new requests queue behind it.

``spf``, ``hrrn`` and ``srpt`` are kept as SGLang keeps its list: a push appends, and
``start_round(P)``, which the engine calls before every round, re-orders the whole list
the way ``SchedulePolicy.calc_priority`` does (``upstream_orders.calc_priority``: every
waiting request re-matched, in-batch prefix de-duplication, SGLang's tie-breaks; srpt: the
bounded re-match above, then a sort by key).

For fcfs and lpm, keys are computed when a request joins the queue (its cached prefix is
looked up then). Under every order the head of the queue is re-matched against the cache
every round before admission (the engine's ``_refresh_head``), so what a request is
charged is always current. Admission always takes a prefix of the
sorted queue (the allocator stops at the first request it cannot place), so removal is
a slice at the front.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from slipstream.sim import upstream_orders
from slipstream.sim.admission import srpt_key
from slipstream.sim.upstream_orders import UPSTREAM_ORDERS

LPM_FCFS_FALLBACK = 128
"""SGLang switches lpm (and hrrn) to fcfs past this many waiting requests
(``WAITING_QUEUE_PREFIX_MATCH_MAX``, schedule_policy.py)."""
assert LPM_FCFS_FALLBACK == upstream_orders.WAITING_QUEUE_PREFIX_MATCH_MAX

FALLBACK_ORDERS = ("lpm",)
"""Orders whose keys switch to arrival past the limit (hrrn keeps its last order instead)."""

SRPT_REMATCH_MAX = 128
"""Most waiting requests srpt re-matches a round: the engine patch's
``long_prefill.SRPT_REMATCH_MAX`` (stock lpm's limit), which bounds its per-pass cost."""

LIST_ORDERS = (*UPSTREAM_ORDERS, "srpt")
"""Orders kept as SGLang keeps its list (push appends, ``start_round`` re-orders)."""


class Queued(Protocol):
    seq: int
    arrival_s: float
    need: int
    cached_est: int
    redo: int
    srpt_key: tuple[float, float, int] | None
    """The request's srpt key as of its last match (the patch's ``srpt_cached_key``): kept
    while it is not re-matched, and across a retraction; None before its first srpt round."""


Q = TypeVar("Q", bound=Queued)


class WaitQueue(Generic[Q]):
    """Jobs sorted by the active order's key, cheapest operations at the front."""

    __slots__ = ("order", "aging", "items", "keys", "_lpm_active", "processed", "_arrival_processed",
                 "_entry_s", "tie", "_rng", "draw_ties", "rematch", "prefix", "unmatched", "rematch_max")

    def __init__(self, order: str, aging_tokens_per_s: float, seed: int = 0, ties: bool | None = None) -> None:
        self.order = order
        self.aging = aging_tokens_per_s
        self.items: list[Q] = []
        self.keys: list[tuple[float, float, int]] = []
        self._lpm_active = True
        self.processed = 0
        """Prefill tokens processed so far (hrrn's clock), as of the last ``start_round``."""
        self._arrival_processed: dict[int, int] = {}
        self._entry_s: dict[int, float] = {}
        """When each waiting job (last) joined the queue: SGLang's ``wait_queue_entry_time``."""
        self.tie: dict[int, str] = {}
        """hrrn's tie-break per job: a random hex id like SGLang's ``rid``, from ``_rng``."""
        self._rng = random.Random(seed)
        self.draw_ties = order == "hrrn" if ties is None else ties
        """Whether a push draws the job's tie now (``ties``; default: under hrrn). Off, a
        queue draws ties only once it turns to hrrn (``set_order``), for those waiting
        then: the draw is hrrn's alone, and most runs never sort by it."""
        self.rematch: Callable[[Q], None] | None = None
        """Refreshes a job's ``need`` and ``cached_est`` from the cache (set by the engine)."""
        self.prefix: Callable[[Q], tuple[Sequence[int], Sequence[int]]] | None = None
        """A job's prefix blocks and sizes, for in-batch de-duplication (set by the engine)."""
        self.unmatched: Callable[[Q], int] | None = None
        """A job's need with no prefix matched (its whole prompt, and the output a retracted
        one recomputes): srpt's key for a request never re-matched (set by the engine;
        None: its current ``need``)."""
        self.rematch_max = SRPT_REMATCH_MAX
        """Most requests srpt re-matches a round (``SRPT_REMATCH_MAX``)."""

    def __len__(self) -> int:
        return len(self.items)

    def _srpt(self, job: Q, need: int) -> tuple[float, float, int]:
        return (srpt_key(job.arrival_s, need, self.aging), job.arrival_s, job.seq)

    def _key(self, job: Q) -> tuple[float, float, int]:
        if self.order == "srpt":
            # Its last match's key; never matched: its whole prompt (the round re-keys the
            # first ``rematch_max`` of the list).
            if job.srpt_key is not None:
                return job.srpt_key
            return self._srpt(job, self.unmatched(job) if self.unmatched is not None else job.need)
        if self.order == "lpm" and self._lpm_active:
            return (-float(job.cached_est), job.arrival_s, job.seq)
        if self.order in UPSTREAM_ORDERS:
            return (0.0, 0.0, job.seq)  # list order is the order (``start_round``)
        return (job.arrival_s, 0.0, job.seq)

    def start_round(self, processed_tokens: int) -> None:
        """Advance hrrn's clock to ``processed_tokens``; under ``spf``, ``hrrn`` and
        ``srpt``, re-order the list as SGLang's ``calc_priority`` does (fcfs, lpm: no-op)."""
        self.processed = processed_tokens
        if self.order in UPSTREAM_ORDERS and self.items:
            self._upstream_round()
        elif self.order == "srpt" and self.items:
            self._srpt_round()

    def _srpt_round(self) -> None:
        """The patch's ``srpt_order``: re-match and re-key the first ``rematch_max`` of the
        list (a retracted request is not re-matched: it recomputes everything, the twin's
        rule), keep every other request's key, sort by key."""
        items, keys, rematch = self.items, self.keys, self.rematch
        for k in range(min(self.rematch_max, len(items))):
            job = items[k]
            if rematch is not None and not job.redo:
                rematch(job)
            keys[k] = job.srpt_key = self._srpt(job, job.need)
        if any(keys[k] > keys[k + 1] for k in range(len(keys) - 1)):
            pairs = sorted(zip(keys, items, strict=True), key=lambda p: p[0])
            self.keys = [k for k, _ in pairs]
            self.items = [j for _, j in pairs]

    def _upstream_round(self) -> None:
        ordered = upstream_orders.calc_priority(
            self.items, self.order, self.processed, self._entry_s, self._arrival_processed,
            self.tie, self.rematch, self.prefix)
        if ordered is not None:
            self.items = ordered
            self.keys = [(0.0, 0.0, j.seq) for j in ordered]

    def push(self, job: Q, entry_s: float | None = None) -> None:
        """Queue ``job``; ``entry_s`` is when it (re-)entered, its arrival by default (a
        retracted request re-enters at the time of its retraction)."""
        self._arrival_processed[job.seq] = self.processed
        self._entry_s[job.seq] = job.arrival_s if entry_s is None else entry_s
        if self.draw_ties and job.seq not in self.tie:
            self.tie[job.seq] = self._draw_tie()
        if self.order in UPSTREAM_ORDERS:
            self.items.append(job)
            self.keys.append((0.0, 0.0, job.seq))
            return
        if self.order == "srpt":  # behind the list; the next round sorts it in
            self.items.append(job)
            self.keys.append(self._key(job))
            return
        self._check_lpm(len(self.items) + 1)
        key = self._key(job)
        keys = self.keys
        if not keys or key >= keys[-1]:
            keys.append(key)
            self.items.append(job)
        else:
            at = bisect.bisect_right(keys, key)
            keys.insert(at, key)
            self.items.insert(at, job)

    def pop_front(self, k: int) -> None:
        if k:
            for job in self.items[:k]:
                self._arrival_processed.pop(job.seq, None)
                self._entry_s.pop(job.seq, None)
            del self.items[:k]
            del self.keys[:k]
            self._check_lpm(len(self.items))

    def _draw_tie(self) -> str:
        return f"{self._rng.getrandbits(128):032x}"

    def set_order(self, order: str) -> None:
        if order == "hrrn" and not self.draw_ties:
            self.draw_ties = True
            for job in self.items:
                if job.seq not in self.tie:
                    self.tie[job.seq] = self._draw_tie()
        if order != self.order:
            self.order = order
            if order not in LIST_ORDERS:  # a list order starts from the list as it is
                self._resort()

    def _check_lpm(self, size: int) -> None:
        if self.order not in FALLBACK_ORDERS:
            return
        active = size <= LPM_FCFS_FALLBACK
        if active != self._lpm_active:
            self._lpm_active = active
            self._resort()

    def _resort(self) -> None:
        pairs = sorted(((self._key(j), j) for j in self.items), key=lambda p: p[0])
        self.keys = [k for k, _ in pairs]
        self.items = [j for _, j in pairs]
