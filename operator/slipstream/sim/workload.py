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

TILE_BLOCK_STRIDE = 1 << 34
"""A tiled copy k of a trace offsets its block ids by k * TILE_BLOCK_STRIDE inside its
tenant's space, so a copy hits its own earlier turns, never the original's."""

ALIGN_MODES = ("truncate", "tile")


def align(parts: Sequence[Workload], mode: str = "truncate") -> tuple[list[Workload], str]:
    """Give traces of different spans one common window before they are merged.

    Merging a 1-hour trace with a 10-minute one and fitting the rate scale over the hour
    runs the short one's window far above the target load (above capacity inside it for a
    0.7 target). ``truncate`` (default) cuts every
    trace to the shortest span; ``tile`` repeats the shorter traces until they cover the
    longest, each copy one mean inter-arrival gap after the last and in a hash space of
    its own. Returns the parts and one line saying what was done ("" if spans agree).
    """
    if mode not in ALIGN_MODES:
        raise ValueError(f"--align must be one of {', '.join(ALIGN_MODES)}, got {mode!r}")
    spans = [w.span_s for w in parts]
    if len(parts) < 2 or max(spans) - min(spans) <= 1e-9 * max(spans):
        return list(parts), ""
    if min(spans) <= 0:
        short = parts[spans.index(min(spans))].name
        raise ValueError(f"trace {short!r} spans no time: traces cannot be aligned to it "
                         "(give it more than one arrival time)")
    if mode == "truncate":
        window = min(spans)
        out = [_window(w, window) for w in parts]
        kept = ", ".join(f"{w.name} {len(o.requests)}/{len(w.requests)}"
                         for w, o in zip(parts, out, strict=True))
        return out, (f"aligned: traces of different spans cut to the shortest, "
                     f"{window:.0f} s (requests kept: {kept}; --align tile repeats the "
                     "shorter ones instead)")
    window = max(spans)
    out = [_tile(w, window) for w in parts]
    copies = ", ".join(f"{w.name} x{len(o.requests) / len(w.requests):.2f}"
                       for w, o in zip(parts, out, strict=True))
    return out, f"aligned: shorter traces tiled to the longest span, {window:.0f} s ({copies})"


def _window(w: Workload, window: float) -> Workload:
    start = w.requests[0].arrival_s
    reqs = tuple(r for r in w.requests if r.arrival_s - start <= window)
    return replace(w, requests=reqs)


def _tile(w: Workload, window: float) -> Workload:
    span = w.span_s
    if span >= window:
        return w
    start = w.requests[0].arrival_s
    period = span + span / max(1, len(w.requests) - 1)
    copies = int(window // period) + 1
    if any((b % BLOCK_SPACE) >= TILE_BLOCK_STRIDE for r in w.requests for b in r.blocks):
        raise ValueError(f"trace {w.name!r}: block ids too large to tile (>= 2^34)")
    if copies > BLOCK_SPACE // TILE_BLOCK_STRIDE:
        raise ValueError(f"trace {w.name!r} would need {copies} copies to cover {window:.0f} s; "
                         f"at most {BLOCK_SPACE // TILE_BLOCK_STRIDE}: use --align truncate")
    reqs = []
    for k in range(copies):
        shift = k * period
        for r in w.requests:
            at = r.arrival_s + shift
            if at - start > window:
                break
            if k == 0:
                reqs.append(r)
                continue
            blocks = tuple(b + k * TILE_BLOCK_STRIDE for b in r.blocks)
            reqs.append(replace(r, rid=f"{r.rid}~{k}", arrival_s=at, blocks=blocks))
    return replace(w, requests=tuple(reqs))


def block_sizes_for(prompt_tokens: int, n_blocks: int, block_size: int) -> tuple[int, ...]:
    """Sizes of ``n_blocks`` blocks of ``block_size`` covering a prompt; the last is partial."""
    sizes = [block_size] * n_blocks
    if n_blocks:
        sizes[-1] = prompt_tokens - block_size * (n_blocks - 1)
    return tuple(sizes)
