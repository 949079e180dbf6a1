"""The controller's per-deployment ``snapshot(sd, window_s, now)``, served from fleet reads.

Each ServingDeployment runs its own loop (``controller.loop``) and asks for its own
snapshot; ``FleetObserver`` answers every such call from one fleet read (``Observer.read``:
the 23 queries of ``queries.fleet_reads``, every deployment at once) per Prometheus, window
and tenant label, reused for ``reuse_s`` seconds. So the queries an interval costs are
bounded by ``23 x interval / reuse_s`` per Prometheus, whatever the number of deployments,
and the loops of 500 deployments do not send 11,500 queries. Reads run on a worker thread (the
client is blocking), at most one per key at a time: concurrent loops wait for the read in
flight and share it. The read is a task of its own, which a loop giving up on it (its
``asyncio.wait_for`` in ``controller.loop.observe``) does not cancel and does not restart:
a lock held by the waiter would not do: each waiter that timed out would release the lock
while its thread read on, and the next waiter would start another read beside it. On a slow
Prometheus (or two cores busy with twin runs) reads would pile up, each holding a fleet's
answers, and make Prometheus slower still.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from slipstream.api import models
from slipstream.api import snapshot as snap
from slipstream.observe import assemble
from slipstream.observe.observer import FleetRead, Observer, ObserveSettings

ReadKey = tuple[str, float, str, str, int | None]
"""(Prometheus URL, window seconds, tenant label, bearer token or "", min samples or None:
the settings')."""

TokenFor = Callable[[models.ServingDeployment], str | None]
"""The bearer token of a deployment's Prometheus (``spec.prometheus.bearerTokenSecretRef``,
read from its Secret by the caller, which holds the Kubernetes client), or None."""


@dataclass
class _Read:
    read: FleetRead
    snapshots: dict[str, snap.WorkloadSnapshot]
    """Every deployment the answers mention, assembled once."""

    def get(self, name: str) -> snap.WorkloadSnapshot:
        found = self.snapshots.get(name)
        return found if found is not None else self.read.snapshots([name])[name]


def fetch(observer: Observer, now: float) -> _Read:
    """One fleet read, assembled into every deployment's snapshot at once (on the caller's
    worker thread: assembling tens of thousands of samples must not stall the event loop).

    The observer reduces each answer as it comes (``assemble.reduce``), and the reduced
    answers are dropped once assembled: the read is kept for the reuse period and until the
    next one, and its snapshots hold all that is read of it (docs/reliability.md, "Scale").
    A deployment no answer mentions gets its snapshot
    from empty answers, which is what the full ones say about it (no series)."""
    read = observer.fetch(now)
    snapshots = read.snapshots()
    if read.results is not None:
        empty = {field: assemble.reduce(field, (), read.tenant_label) for field in read.results}
        read = dataclasses.replace(read, results=empty)
    return _Read(read, snapshots)


class FleetObserver:
    """``controller.loop.SnapshotSource``: never raises; says why a snapshot is invalid."""

    def __init__(
        self,
        settings: ObserveSettings | None = None,
        *,
        reuse_s: float = 5.0,
        token_for: TokenFor | None = None,
    ) -> None:
        self.settings = settings or ObserveSettings()
        self.reuse_s = reuse_s
        """Seconds a fleet read answers later calls: a fraction of the control interval."""
        self._token_for = token_for
        self._observers: dict[ReadKey, Observer] = {}
        self._reads: dict[ReadKey, _Read] = {}
        self._flights: dict[ReadKey, asyncio.Future[_Read]] = {}
        """The read in flight per key; it clears itself when done."""
        self.reads_started = 0
        """Fleet reads started (each up to 23 queries): at most one in flight per key."""

    @property
    def queries_made(self) -> int:
        """Round trips to every Prometheus so far (the scale benchmark's figure)."""
        return sum(o.queries_made for o in self._observers.values())

    def observer(self, url: str, window_s: float, tenant_label: str, token: str = "",
                 min_samples: int | None = None) -> Observer:
        """The Observer of one key (built on first use; it keeps that key's backoff)."""
        key = (url, window_s, tenant_label, token, min_samples)
        if key not in self._observers:
            settings = dataclasses.replace(self.settings, window_s=window_s, tenant_label=tenant_label,
                                           min_samples=self.settings.min_samples if min_samples is None else min_samples)
            self._observers[key] = Observer(url, settings, bearer_token=token or None)
        return self._observers[key]

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snap.WorkloadSnapshot:
        """The deployment's snapshot of the last ``window_s`` from a fleet read shared by every
        deployment on the same Prometheus; ``min_samples`` (default: the settings') first
        tokens make it valid (a step a jump of the queue mix brought forward needs fewer)."""
        name = f"{sd.metadata.namespace}/{sd.metadata.name}"
        url = sd.spec.prometheus.url
        if not url:
            return snap.invalid(name, now, window_s, snap.UNREACHABLE,
                                "spec.prometheus.url is not set: no metrics to read")
        token = (self._token_for(sd) if self._token_for is not None else None) or ""
        key: ReadKey = (url, float(window_s), sd.spec.tuning.objective.tenant_label, token, min_samples)
        while True:
            cached = self._reads.get(key)
            if cached is not None and 0 <= now - cached.read.at < self.reuse_s:
                break
            flight = self._flights.get(key)
            mine = flight is None or flight.done()
            if flight is None or mine:
                flight = self._flights[key] = asyncio.ensure_future(self._read(key, now))
                flight.add_done_callback(self._retrieved)
            # Shielded: this caller's cancellation leaves the read to the others (and to the
            # cache). A read in flight for another `now` is waited for, then judged as the
            # cache is: one read at a time per key, as with a lock. Only a flight not done
            # is joined: awaiting a done one does not yield, and a caller it did not suit
            # would find it again, and spin with the event loop held.
            cached = await asyncio.shield(flight)
            if mine or 0 <= now - cached.read.at < self.reuse_s:
                break
        # Deployments the answers do not mention get theirs from the same read: NoSeries,
        # or the failure of the read.
        return cached.get(name)

    @staticmethod
    def _retrieved(flight: asyncio.Future[_Read]) -> None:
        """A read's exception counts as retrieved (every caller may have given up on it;
        those that waited got it)."""
        if not flight.cancelled():
            flight.exception()

    async def _read(self, key: ReadKey, now: float) -> _Read:
        """One fleet read on a worker thread, cached for the loops that come after it; it
        leaves ``_flights`` before it is done, so a later caller never joins a done one."""
        try:
            self.reads_started += 1
            read = self._reads[key] = await asyncio.to_thread(fetch, self.observer(*key), now)
            return read
        finally:
            self._flights.pop(key, None)

    def close(self) -> None:
        for observer in self._observers.values():
            observer.close()
