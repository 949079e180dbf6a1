"""Requests and workloads: the plain data every loader produces and the engine consumes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the trace gives it; the cache decides how much of it is uncached."""

    rid: str
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]
    """Prefix block ids, globally unique per tenant space (equal ids = shared prefix)."""
    block_sizes: tuple[int, ...]
    """Tokens in each block; they add up to ``prompt_tokens``."""
    warm_blocks: int = 0
    """Leading blocks placed in the prefix cache when the request arrives (an earlier turn
    or a shared document computed just before): how specs and scenarios state a hit."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests sorted by arrival, and where they came from."""

    name: str
    requests: tuple[Request, ...]
    rate_scale: float = 1.0
    description: str = ""
    tenants: tuple[str, ...] = field(default=())

    @property
    def span_s(self) -> float:
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    def scaled(self, factor: float) -> Workload:
        """Arrivals ``factor`` times as dense (the clock runs ``factor`` times faster)."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"rate scale must be a finite number > 0, got {factor}")
        reqs = tuple(replace(r, arrival_s=r.arrival_s / factor) for r in self.requests)
        return replace(self, requests=reqs, rate_scale=self.rate_scale * factor)


def build(name: str, requests: Iterable[Request], description: str = "") -> Workload:
    """A workload from requests in any order. Loaders name file and line of bad input; this
    is the last guard for the two that would make the twin loop forever: a non-finite
    arrival and a request id used twice (the engine keys its allocations by id)."""
    reqs = tuple(sorted(requests, key=lambda r: r.arrival_s))
    seen: set[str] = set()
    for r in reqs:
        if not math.isfinite(r.arrival_s):
            raise ValueError(f"{name}: request {r.rid!r}: arrival_s must be a finite number, "
                             f"got {r.arrival_s}")
        if r.rid in seen:
            raise ValueError(f"{name}: request id {r.rid!r} is used twice; ids must be unique")
        seen.add(r.rid)
    tenants = tuple(dict.fromkeys(r.tenant for r in reqs))
    return Workload(name, reqs, 1.0, description, tenants)


def merge(name: str, parts: Sequence[Workload]) -> Workload:
    """One workload from several (one tenant each); block ids must already be disjoint."""
    reqs = [r for w in parts for r in w.requests]
    return build(name, reqs, " + ".join(w.name for w in parts))


BLOCK_SPACE = 1 << 40
"""Each tenant's hash ids are offset by tenant_index * BLOCK_SPACE: no cross-tenant sharing."""


def block_sizes_for(prompt_tokens: int, n_blocks: int, block_size: int) -> tuple[int, ...]:
    """Sizes of ``n_blocks`` blocks of ``block_size`` covering a prompt; the last is partial."""
    sizes = [block_size] * n_blocks
    if n_blocks:
        sizes[-1] = prompt_tokens - block_size * (n_blocks - 1)
    return tuple(sizes)
