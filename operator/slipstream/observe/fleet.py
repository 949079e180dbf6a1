"""The controller's per-deployment ``snapshot(sd, window_s, now)``, served from fleet reads.

Each ServingDeployment runs its own loop (``controller.loop``) and asks for its own
snapshot; ``FleetObserver`` answers every such call from one fleet read (``Observer.read``:
seven queries for every deployment at once) per Prometheus, window and tenant label,
reused for ``reuse_s`` seconds. So the queries an interval costs are bounded by
``6 x interval / reuse_s`` per Prometheus, whatever the number of deployments, and the
loops of 500 deployments do not send 3,000 queries. Reads run on a worker thread (the
client is blocking) under one lock per key: concurrent loops wait for the read in flight
and share it.
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

Key = tuple[str, float, str, str]
"""(Prometheus URL, window seconds, tenant label, bearer token or "")."""

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
    next one, and its snapshots hold all that is read of it (docs/reliability.md, "Memory
    at 500"). A deployment no answer mentions gets its snapshot
    from empty answers, which is what the full ones say about it (no series)."""
    read = observer.fetch(now)
    snapshots = read.snapshots()
    if read.results is not None:
        empty = {field: assemble.reduce(field, (), read.tenant_label) for field in read.results}
        read = dataclasses.replace(read, results=empty)
    return _Read(read, snapshots)


class FleetObserver:
    """``controller.loop.Observer``: never raises; says why a snapshot is invalid."""

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
        self._observers: dict[Key, Observer] = {}
        self._reads: dict[Key, _Read] = {}
        self._locks: dict[Key, asyncio.Lock] = {}

    @property
    def queries_made(self) -> int:
        """Round trips to every Prometheus so far (the scale benchmark's figure)."""
        return sum(o.queries_made for o in self._observers.values())

    def observer(self, url: str, window_s: float, tenant_label: str, token: str = "") -> Observer:
        """The Observer of one key (built on first use; it keeps that key's backoff)."""
        key = (url, window_s, tenant_label, token)
        if key not in self._observers:
            settings = dataclasses.replace(self.settings, window_s=window_s, tenant_label=tenant_label)
            self._observers[key] = Observer(url, settings, bearer_token=token or None)
        return self._observers[key]

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float) -> snap.WorkloadSnapshot:
        name = f"{sd.metadata.namespace}/{sd.metadata.name}"
        url = sd.spec.prometheus.url
        if not url:
            return snap.invalid(name, now, window_s, snap.UNREACHABLE,
                                "spec.prometheus.url is not set: no metrics to read")
        token = (self._token_for(sd) if self._token_for is not None else None) or ""
        key: Key = (url, float(window_s), sd.spec.tuning.objective.tenant_label, token)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._reads.get(key)
            if cached is None or not 0 <= now - cached.read.at < self.reuse_s:
                cached = self._reads[key] = await asyncio.to_thread(fetch, self.observer(*key), now)
        # Deployments the answers do not mention get theirs from the same read: NoSeries,
        # or the failure of the read.
        return cached.get(name)

    def close(self) -> None:
        for observer in self._observers.values():
            observer.close()
