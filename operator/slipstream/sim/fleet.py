"""A fleet of engines behind a router: which engine each request lands on, and so its cache hits.

Each engine of a fleet keeps its own prefix cache (``sim.cache``), so where a request is
sent decides what it finds warm: a conversation's next turn hits only on the engine that
ran its earlier turns. Real fleets route at random, round robin, by least load, or by
prefix affinity (llm-d's prefix-cache scorer, Dynamo's KV router); which one decides the
cache hits of multi-turn traffic, and with them the prefill work and the TTFT.

``route(workload, n, router, profile, config)`` splits a workload into one workload per
engine. The routers (``ROUTERS``, a registry in the manner of Vidur's policy registries)
see only what a router in front of the engines sees: the requests it has sent, never the
engines' state, so least-loaded and prefix routing use an estimate of each engine's
outstanding prefill work (``Backlog``):

- ``round-robin``: request k to engine k mod n (the load generator's ``pick``, the
  demo's ``offline.split``);
- ``random``: each request to an engine drawn at random (seeded: the same split each run);
- ``least-loaded``: to the engine with the least estimated outstanding prefill seconds
  (ties, as on an idle fleet: to the one sent fewest requests);
- ``prefix``: to the engine where the request's prefill would finish first by the
  estimate: its outstanding seconds plus the request's tokens not in the prefix blocks the
  router has sent it before, among the engines not above ``BOUND`` times their share of
  the requests so far. Prefix affinity and load balance in one score: a long shared
  history pulls a turn to the engine that holds it unless that engine is far behind or
  has had more than its share.

The estimate: a request's work is its tokens over the engine's full-pass prefill rate (C
tokens per pass of the profile's cost at C); an engine's outstanding work drains at one
second per second. It ignores batching, decodes and evictions, as a router that does not
read the engines must.

``simulate_fleet`` runs one engine per part (a fresh policy each: a tuner per engine) and
``merged`` pools their outcomes for the usual summaries; ``hit_ratios`` is each engine's
share of prompt tokens served from its cache.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from slipstream.sim import engine
from slipstream.sim.cost import PREFILL, CostModel
from slipstream.sim.policies import EngineConfig, Policy
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Request, Workload


@dataclass
class Backlog:
    """What a router knows of n engines: each one's estimated outstanding prefill seconds
    at the last arrival, and the prefix blocks it has been sent."""

    n: int
    tokens_per_s: float
    """The full-pass prefill rate the estimate drains at."""
    work_s: list[float] = field(default_factory=list)
    blocks: list[set[int]] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    """Requests sent to each engine: the tie-break (an idle fleet's estimates are all 0)."""
    at_s: float = 0.0

    def __post_init__(self) -> None:
        self.work_s = [0.0] * self.n
        self.blocks = [set() for _ in range(self.n)]
        self.sent = [0] * self.n

    def advance(self, now_s: float) -> None:
        gone = max(0.0, now_s - self.at_s)
        self.work_s = [max(0.0, w - gone) for w in self.work_s]
        self.at_s = max(self.at_s, now_s)

    def held_tokens(self, k: int, req: Request) -> int:
        """Tokens of the request's leading blocks that engine k was sent before."""
        held, seen = 0, self.blocks[k]
        for block, size in zip(req.blocks, req.block_sizes, strict=True):
            if block not in seen:
                break
            held += size
        return held

    def send(self, k: int, req: Request, tokens: int) -> None:
        self.work_s[k] += tokens / self.tokens_per_s
        self.blocks[k].update(req.blocks)
        self.sent[k] += 1


Router = Callable[[Request, int, Backlog, random.Random], int]
"""(request, its index in arrival order, the backlog, the router's RNG) -> engine index."""


def round_robin(req: Request, index: int, backlog: Backlog, rng: random.Random) -> int:
    return index % backlog.n


def at_random(req: Request, index: int, backlog: Backlog, rng: random.Random) -> int:
    return rng.randrange(backlog.n)


def least_loaded(req: Request, index: int, backlog: Backlog, rng: random.Random) -> int:
    return min(range(backlog.n), key=lambda k: (backlog.work_s[k], backlog.sent[k], k))


BOUND = 1.25
"""Prefix routing's load bound: no engine is sent more than this many times its share of
the requests so far (consistent hashing with bounded loads, Mirrokni et al. 2018), so a
prefix every request shares (a system prompt) cannot pull the whole fleet's traffic onto
the engine that saw it first."""


def prefix_affinity(req: Request, index: int, backlog: Backlog, rng: random.Random) -> int:
    def finish_s(k: int) -> tuple[float, int, int]:
        left = req.prompt_tokens - backlog.held_tokens(k, req)
        return backlog.work_s[k] + left / backlog.tokens_per_s, backlog.sent[k], k

    cap = BOUND * (sum(backlog.sent) + 1) / backlog.n
    room = [k for k in range(backlog.n) if backlog.sent[k] + 1 <= cap] or list(range(backlog.n))
    return min(room, key=finish_s)


ROUTERS: dict[str, Router] = {
    "round-robin": round_robin,
    "random": at_random,
    "least-loaded": least_loaded,
    "prefix": prefix_affinity,
}
DEFAULT_ROUTER = "round-robin"


def full_pass_rate(profile: Profile, config: EngineConfig) -> float:
    """Prefill tokens per second of back-to-back full passes of C tokens (cold)."""
    c = config.chunked_prefill_size
    return c / CostModel(profile).pass_time(c, c * (c + 1) // 2, 0, 0, PREFILL)


def route(workload: Workload, n: int, router: str, profile: Profile, config: EngineConfig,
          seed: int = 0) -> list[Workload]:  # fmt: skip
    """One workload per engine: every request of ``workload`` sent by ``router`` (a name
    of ``ROUTERS``), in arrival order. Raises ValueError naming the choices on a bad name."""
    if n < 1:
        raise ValueError(f"engines must be at least 1, got {n}")
    if router not in ROUTERS:
        raise ValueError(f"routing {router!r} is not one of {', '.join(ROUTERS)}")
    pick, rng = ROUTERS[router], random.Random(seed)
    backlog = Backlog(n, full_pass_rate(profile, config))
    parts: list[list[Request]] = [[] for _ in range(n)]
    for index, req in enumerate(workload.requests):
        backlog.advance(req.arrival_s)
        k = pick(req, index, backlog, rng)
        backlog.send(k, req, req.prompt_tokens - backlog.held_tokens(k, req))
        parts[k].append(req)
    return [replace(workload, name=f"{workload.name}@engine-{k}", requests=tuple(p)) for k, p in enumerate(parts)]


def simulate_fleet(parts: Sequence[Workload], policy: Callable[[int], Policy], profile: Profile,
                   config: EngineConfig) -> list[engine.SimResult]:  # fmt: skip
    """Each engine's run: part k under ``policy(k)`` (a fresh policy per engine, so a
    tuner's memory is its engine's own)."""
    return [engine.simulate(part, policy(k), profile, config) for k, part in enumerate(parts)]


def merged(workload: Workload, results: Sequence[engine.SimResult]) -> engine.SimResult:
    """The fleet's runs as one result for ``metrics.summarize``: every request, the ITL
    gaps pooled, the longest makespan, tokens and passes summed; the busy seconds are the
    engines' mean, so busy fractions are the fleet's mean engine's."""
    first, n = results[0], len(results)
    return replace(
        first,
        workload=workload,
        jobs=[j for r in results for j in r.jobs],
        makespan_s=max(r.makespan_s for r in results),
        prefill_busy_s=sum(r.prefill_busy_s for r in results) / n,
        prefill_tokens=sum(r.prefill_tokens for r in results),
        passes=sum(r.passes for r in results),
        rounds=[],
        busy_s=sum(r.busy_s for r in results) / n,
        step_gaps=[g for r in results for g in r.step_gaps],
        step_weights=[w for r in results for w in r.step_weights],
        entry_gaps=[g for r in results for g in r.entry_gaps],
        peak_kv_tokens=max(r.peak_kv_tokens for r in results),
        retractions=sum(r.retractions for r in results),
        rejected=sum(r.rejected for r in results),
    )


def hit_ratios(results: Sequence[engine.SimResult]) -> list[float]:
    """Each engine's cache-hit ratio: prompt tokens it did not prefill over prompt tokens
    (requests it refused left out); NaN for an engine that got no request."""
    out = []
    for r in results:
        jobs = [j for j in r.jobs if not j.rejected]
        prompt = sum(j.req.prompt_tokens for j in jobs)
        out.append(1.0 - sum(j.uncached for j in jobs) / prompt if prompt else float("nan"))
    return out
