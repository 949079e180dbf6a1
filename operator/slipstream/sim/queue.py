"""The waiting queue, kept sorted by the admission order.

Orders (SGLang's ``--schedule-policy`` names):
- ``fcfs``: arrival order (SGLang's default).
- ``lpm``: longest cached prefix first, as SGLang's ``lpm``, which falls back to fcfs
  when more than 128 requests wait (matching every request each round is too dear).
- ``srpt``: shortest remaining uncached prefill first, with aging: key
  ``arrival_s + need / aging`` (see ``admission.srpt_key`` for the bound it gives).
- ``spf``: SGLang 0.5.23's ``shortest-prefill-first``: uncached work, then arrival
  (``SchedulePolicy._sort_by_shortest_prefill``); no aging and no fcfs fallback.
- ``hrrn``: SGLang 0.5.23's highest response ratio next (``SchedulePolicy._sort_by_hrrn``):
  ratio ``(P - P_arrival) / need`` with P the prefill tokens processed so far (the wait
  counted in tokens, so it equals classic HRRN at constant throughput), highest first;
  falls back to fcfs past 128 waiting requests, as lpm. The key moves with P, so the
  engine calls ``start_round(P)`` before every round and the queue re-sorts.

Keys are computed when a request joins the queue (its cached prefix is looked up then);
the head of the queue is re-matched against the cache every round before admission, so
what a request is charged is always current. Admission always takes a prefix of the
sorted queue (the allocator stops at the first request it cannot place), so removal is
a slice at the front.
"""

from __future__ import annotations

import bisect
from typing import Generic, Protocol, TypeVar

from slipstream.sim.admission import srpt_key

LPM_FCFS_FALLBACK = 128
"""SGLang switches lpm (and hrrn) to fcfs past this many waiting requests
(``WAITING_QUEUE_PREFIX_MATCH_MAX``, schedule_policy.py)."""

FALLBACK_ORDERS = ("lpm", "hrrn")


class Queued(Protocol):
    seq: int
    arrival_s: float
    need: int
    cached_est: int


Q = TypeVar("Q", bound=Queued)


class WaitQueue(Generic[Q]):
    """Jobs sorted by the active order's key, cheapest operations at the front."""

    __slots__ = ("order", "aging", "items", "keys", "_lpm_active", "processed", "_arrival_processed")

    def __init__(self, order: str, aging_tokens_per_s: float) -> None:
        self.order = order
        self.aging = aging_tokens_per_s
        self.items: list[Q] = []
        self.keys: list[tuple[float, float, int]] = []
        self._lpm_active = True
        self.processed = 0
        """Prefill tokens processed so far (hrrn's clock), as of the last ``start_round``."""
        self._arrival_processed: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def _key(self, job: Q) -> tuple[float, float, int]:
        if self.order == "srpt":
            return (srpt_key(job.arrival_s, job.need, self.aging), job.arrival_s, job.seq)
        if self.order == "lpm" and self._lpm_active:
            return (-float(job.cached_est), job.arrival_s, job.seq)
        if self.order == "spf":
            return (float(max(1, job.need)), job.arrival_s, job.seq)
        if self.order == "hrrn" and self._lpm_active:
            if job.need <= 0:
                return (-float("inf"), job.arrival_s, job.seq)
            waited = self.processed - self._arrival_processed.get(job.seq, self.processed)
            return (-max(0, waited) / job.need, job.arrival_s, job.seq)
        return (job.arrival_s, 0.0, job.seq)

    def start_round(self, processed_tokens: int) -> None:
        """Advance hrrn's clock to ``processed_tokens`` and re-sort (other orders: no-op)."""
        if self.order == "hrrn" and processed_tokens != self.processed:
            self.processed = processed_tokens
            if self._lpm_active and len(self.items) > 1:
                self._resort()
        else:
            self.processed = processed_tokens

    def push(self, job: Q) -> None:
        self._arrival_processed[job.seq] = self.processed
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
            del self.items[:k]
            del self.keys[:k]
            self._check_lpm(len(self.items))

    def set_order(self, order: str) -> None:
        if order != self.order:
            self.order = order
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
