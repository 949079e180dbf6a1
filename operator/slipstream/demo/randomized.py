"""Randomized phased workloads: the traffic Auto is judged on besides the hand-made phases.

``random_phases(seed)`` is one workload of 3-5 phases back to back (each 120-900 twin
seconds, shorter ones likelier), 2-3 tenants that send in every phase, each phase one of
the kinds in ``KINDS`` (never the same kind twice in a row, so every phase change changes
the traffic's shape):

- ``chat``: short prompts (lognormal, medians 800-3,000 tokens);
- ``documents``: uniform cold documents of about 8K-32K tokens;
- ``giants``: short chat among cold prompts of 100K-250K tokens arriving as a Poisson
  process (at least one a phase, explicit requests, so their load is known exactly);
- ``mixed``: one wide lognormal (sigma 1.2-1.8, 50 to 200K tokens);
- ``bursts``: light chat and bursts of 10-60 medium prompts within two seconds, from one
  tenant at a time, every 40-180 s;
- ``agents``: long multi-turn contexts (16K-48K medians) mostly cached (85-97% warm on
  arrival, plus a shared system prompt per tenant: the spec's ``cache_hit`` and
  ``shared_prefix_tokens``).

Each phase's offered load is drawn from 30% to 120% of the fleet's prefill capacity
(``offline.REPLICAS`` engines; above 100% the queue grows for the whole phase). The load
of a request is what its prefill costs an engine whose passes are full (``saturated_s``:
its linear and attention FLOPs on the profile plus its share of each pass's fixed cost),
so 100% is the rate at which the fleet just keeps up, also for short prompts that share
passes; decodes are not counted (outputs are short, 15-60 tokens median). A tenant
stream's rate is set from the mean of that cost over its prompt distribution (a fixed
grid of its quantiles, no sampling), explicit requests (giants, bursts) count exactly.

Pure and plain: a seed fully determines the phase specs (``phase_specs``, the format of
``slipstream loopbench --workload FILE``'s phases) and so the workload; ``slipstream
loopbench --workload random:SEED`` and ``scripts/sweep-random.py`` use the same one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from slipstream.demo import phases
from slipstream.demo.offline import REPLICAS
from slipstream.sim import profiles
from slipstream.sim.cost import DECODE, CostModel, chunk_pairs
from slipstream.sim.engine import solo_replay
from slipstream.sim.policies import EngineConfig
from slipstream.sim.workload import Workload

PHASES = (3, 5)
PHASE_S = (120.0, 900.0)
TENANTS = (2, 3)
LOAD = (0.3, 1.2)
"""Offered prefill load of a phase, a share of the fleet's capacity (``saturated_s``)."""
TENANT_NAMES = ("chat", "code", "support", "search", "agent", "docs")
GRID = 64
"""Quantiles of a prompt distribution its mean cost is taken over."""

PhaseSpec = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    """What a phase kind sends: tenant streams (spec tenants without ``rate_per_s``), the
    share of the streams' load each carries, and explicit requests (costed exactly)."""

    streams: tuple[PhaseSpec, ...]
    shares: tuple[float, ...]
    requests: tuple[PhaseSpec, ...] = ()


@dataclass(frozen=True)
class Draw:
    """A kind factory's inputs: the phase's RNG, tenants, length and target load."""

    rng: random.Random
    tenants: tuple[str, ...]
    duration_s: float
    load: float
    cost: CostModel


def engine_config() -> EngineConfig:
    return EngineConfig(**phases.DEMO_ENGINE)


def cost_model() -> CostModel:
    return CostModel.of(profiles.load(phases.PROFILE))


def saturated_s(cost: CostModel, cached: int, need: int, budget: int) -> float:
    """Engine seconds a prefill of ``need`` tokens after ``cached`` takes in full passes of
    ``budget`` tokens: each chunk's linear and attention FLOPs, and its share (tokens over
    the budget) of a pass's fixed cost. A chunk of a whole budget costs what a pass alone
    does (compute-bound); a short prompt costs a fraction of one."""
    total, offset, left = 0.0, cached, need
    while left > 0:
        take = min(budget, left)
        total += take / budget * cost.overhead_s + take * cost.linear_s + chunk_pairs(offset, take) * cost.attn_s
        offset += take
        left -= take
    return total


DECODE_BATCH = 128
"""Decodes a step is costed at (``decode_s``): a loaded engine's batch. Chosen on the twin so that
short chat turns to overload near 100%: ``offline.static`` of ``phase_spec("chat", 7, ("chat",
"code"), 300.0, load)`` under stock gives a worst-tenant p99 TTFT of 0.49 s at 80%, 1.64 s at
100% and 8.05 s (a growing queue) at 120% (2026-12-06; at 16 a step, 0.33 s at 115%: no
overload; with no decode cost, 24 s at 90%). The other kinds turn near 100% too (stock at
80% / 100%: documents 2.5 / 23 s, mixed 17 / 44 s, agents 10 / 89 s)."""


def decode_s(cost: CostModel, output: int, context: int) -> float:
    """Engine seconds of ``output`` decode tokens at ``context``: each its share of a decode
    step of ``DECODE_BATCH`` (the step's fixed cost and weight reads shared, its own KV read)."""
    b = DECODE_BATCH
    return output * cost.pass_time(b, b * context, b * context, 0, DECODE) / b


def request_s(cost: CostModel, cached: int, need: int, output: int, budget: int) -> float:
    """A request's offered load, engine seconds: ``saturated_s`` and ``decode_s``."""
    return saturated_s(cost, cached, need, budget) + decode_s(cost, output, cached + need)


def _quantiles(d: PhaseSpec) -> list[int]:
    """Prompt lengths at ``GRID`` evenly spaced quantiles of a spec distribution, clamped
    as ``sim.spec`` clamps its draws."""
    qs = [(k + 0.5) / GRID for k in range(GRID)]
    if d["dist"] == "constant":
        values = [float(d["value"])] * GRID
    elif d["dist"] == "uniform":
        values = [d["min"] + (d["max"] - d["min"]) * q for q in qs]
    else:
        values = [d["median"] * math.exp(d["sigma"] * NormalDist().inv_cdf(q)) for q in qs]
    lo, hi = d.get("min", 1), d.get("max", math.inf)
    return [int(max(lo, min(hi, max(1.0, round(v))))) for v in values]


def stream_cost(cost: CostModel, stream: PhaseSpec, budget: int) -> float:
    """Mean engine seconds of one request of a spec tenant: ``saturated_s`` (its shared
    prefix cached) and ``decode_s`` of its median output."""
    hit, shared = float(stream.get("cache_hit", 0.0)), int(stream.get("shared_prefix_tokens", 0))
    output = int(stream.get("output_tokens", {}).get("median", 1))
    total = 0.0
    for prompt in _quantiles(stream["prompt_tokens"]):
        cached = int(prompt * hit)
        if shared and shared + cached < prompt:
            cached += shared
        total += request_s(cost, cached, prompt - cached, output, budget)
    return total / GRID


def _output(rng: random.Random) -> PhaseSpec:
    return {"dist": "lognormal", "median": rng.randint(15, 60), "sigma": 0.5, "min": 1, "max": 300}


def _lognormal(rng: random.Random, median: tuple[int, int], sigma: tuple[float, float], lo: int,
               hi: int) -> PhaseSpec:  # fmt: skip
    return {"dist": "lognormal", "median": rng.randint(*median), "sigma": round(rng.uniform(*sigma), 2),
            "min": lo, "max": hi}  # fmt: skip


def _shares(rng: random.Random, n: int) -> tuple[float, ...]:
    weights = [rng.uniform(0.5, 1.5) for _ in range(n)]
    return tuple(w / sum(weights) for w in weights)


def _streams(draw: Draw, prompt: Callable[[random.Random], PhaseSpec], **extra: Callable[[random.Random], Any]) -> Shape:
    """One stream per tenant, its prompts from ``prompt(rng)``, ``extra`` fields drawn alike."""
    rng = draw.rng
    streams = tuple({"name": t, "prompt_tokens": prompt(rng), "output_tokens": _output(rng),
                     **{k: f(rng) for k, f in extra.items()}} for t in draw.tenants)  # fmt: skip
    return Shape(streams, _shares(rng, len(streams)))


def _short(rng: random.Random) -> PhaseSpec:
    return _lognormal(rng, (800, 3000), (0.3, 0.7), 50, 12000)


def chat(draw: Draw) -> Shape:
    return _streams(draw, _short)


def documents(draw: Draw) -> Shape:
    return _streams(draw, lambda rng: _lognormal(rng, (10000, 24000), (0.15, 0.3), 8000, 32000))


def mixed(draw: Draw) -> Shape:
    return _streams(draw, lambda rng: _lognormal(rng, (2000, 8000), (1.2, 1.8), 50, 200000))


def agents(draw: Draw) -> Shape:
    """Per tenant a shared prefix (system prompt and tools, 8K-24K tokens) and each
    request's own earlier turns warm on arrival (15-30% of the prompt), the prompt 2-2.8x
    the prefix (at least 1.6x, so the prefix is always used): 50-75% cached. Mostly the
    shared prefix, which every request keeps hot: a request's own warm turns are what a
    queue can push out of the cache before it is served (then the request is cold)."""
    rng = draw.rng
    streams = []
    for tenant in draw.tenants:
        prefix = rng.randint(8000, 24000)
        prompt = {"dist": "lognormal", "median": int(prefix * rng.uniform(2.0, 2.8)), "sigma": 0.3,
                  "min": int(prefix * 1.6), "max": 160000}  # fmt: skip
        streams.append({"name": tenant, "prompt_tokens": prompt, "output_tokens": _output(rng),
                        "cache_hit": round(rng.uniform(0.15, 0.3), 3), "shared_prefix_tokens": prefix})
    return Shape(tuple(streams), _shares(rng, len(streams)))


def _explicit(prefix: str, times: list[float], sizes: list[int], tenants: list[str],
              rng: random.Random) -> tuple[PhaseSpec, ...]:  # fmt: skip
    return tuple({"id": f"{prefix}-{k}", "tenant": tenant, "arrival_s": round(t, 3), "prompt_tokens": n,
                  "output_tokens": rng.randint(1, 40)}
                 for k, (t, n, tenant) in enumerate(zip(times, sizes, tenants, strict=True)))  # fmt: skip


def _arrivals(rng: random.Random, duration_s: float, gap: Callable[[], float]) -> list[float]:
    """Times from ``gap()`` after 0, each ``gap()`` after the last, within the phase; at
    least one (anywhere in it)."""
    times, t = [], gap()
    while t < duration_s:
        times.append(t)
        t += gap()
    return times or [rng.uniform(0.0, duration_s)]


def giants(draw: Draw) -> Shape:
    """Short chat, and giants (Poisson arrivals) carrying 30-60% of the load (at least one;
    the last dropped while they would carry more than 75%)."""
    rng, budget = draw.rng, engine_config().chunked_prefill_size
    lo, hi = 100_000, 250_000
    mean = stream_cost(draw.cost, {"prompt_tokens": {"dist": "uniform", "min": lo, "max": hi}}, budget)
    per_s = rng.uniform(0.3, 0.6) * draw.load * REPLICAS / mean
    times = _arrivals(rng, draw.duration_s, lambda: rng.expovariate(per_s))
    sizes = [rng.randint(lo, hi) for _ in times]
    while len(sizes) > 1 and sum(request_s(draw.cost, 0, n, 20, budget) for n in sizes) > (
            0.75 * draw.load * REPLICAS * draw.duration_s):
        times.pop(), sizes.pop()
    tenants = [rng.choice(draw.tenants) for _ in times]
    shape = chat(draw)
    return Shape(shape.streams, shape.shares, _explicit("giant", times, sizes, tenants, rng))


def bursts(draw: Draw) -> Shape:
    """Light chat (30-60% of the load) and bursts of medium prompts (the rest): each burst
    10-60 prompts within two seconds, from one tenant, 40-180 s apart (at least one)."""
    rng, budget = draw.rng, engine_config().chunked_prefill_size
    shape = chat(draw)
    starts = _arrivals(rng, draw.duration_s, lambda: rng.uniform(40.0, 180.0))
    per_burst = rng.uniform(0.4, 0.7) * draw.load * REPLICAS * draw.duration_s / len(starts)
    median = rng.randint(3000, 12000)
    times: list[float] = []
    sizes: list[int] = []
    tenants: list[str] = []
    for start in starts:
        tenant, burst, spent = rng.choice(draw.tenants), [], 0.0
        while len(burst) < 10 or (spent < per_burst and len(burst) < 60):
            burst.append(int(min(32000, max(500, rng.lognormvariate(math.log(median), 0.3)))))
            spent += request_s(draw.cost, 0, burst[-1], 20, budget)
        times += sorted(min(start + rng.uniform(0.0, 2.0), draw.duration_s - 0.001) for _ in burst)
        sizes += burst
        tenants += [tenant] * len(burst)
    return Shape(shape.streams, shape.shares, _explicit("burst", times, sizes, tenants, rng))


KindFactory = Callable[[Draw], Shape]
KINDS: dict[str, KindFactory] = {
    "chat": chat,
    "documents": documents,
    "giants": giants,
    "mixed": mixed,
    "bursts": bursts,
    "agents": agents,
}
"""Phase kind -> its factory (as ``sim.policies.REGISTRY``); the phase's ``kind`` names it."""


def rated(shape: Shape, draw: Draw) -> tuple[list[PhaseSpec], list[PhaseSpec]]:
    """(spec tenants with ``rate_per_s``, explicit requests): the streams share what the
    explicit requests leave of the target load (a quarter of it at least)."""
    budget = engine_config().chunked_prefill_size
    fleet_s = draw.duration_s * REPLICAS
    explicit = sum(request_s(draw.cost, 0, r["prompt_tokens"], r["output_tokens"], budget)
                   for r in shape.requests) / fleet_s  # fmt: skip
    left = max(draw.load - explicit, 0.25 * draw.load)
    tenants = [{**s, "rate_per_s": round(share * left * REPLICAS / stream_cost(draw.cost, s, budget), 4)}
               for s, share in zip(shape.streams, shape.shares, strict=True)]  # fmt: skip
    return tenants, list(shape.requests)


def _duration(rng: random.Random) -> float:
    lo, hi = PHASE_S
    return float(round(lo + (hi - lo) * rng.random() ** 2, -1))  # shorter phases likelier (mean ~380 s)


def phase_spec(kind: str, seed: int, tenants: tuple[str, ...], duration_s: float, load: float) -> PhaseSpec:
    """One phase of ``kind`` (a workload spec whose ``name`` is the kind; ``load``, not a
    spec field, popped before parsing, is its target offered load)."""
    draw = Draw(random.Random(f"slipstream-random-phase-{seed}"), tenants, duration_s, load, cost_model())
    streams, requests = rated(KINDS[kind](draw), draw)
    return {"name": kind, "load": load, "duration_s": duration_s, "seed": seed, "profile": phases.PROFILE,
            "engine": dict(phases.DEMO_ENGINE), "tenants": streams, **({"requests": requests} if requests else {})}


def phase_specs(seed: int) -> list[PhaseSpec]:
    """The phases of ``seed``'s workload (``phase_spec`` each)."""
    rng = random.Random(f"slipstream-random-{seed}")
    tenants = tuple(rng.sample(TENANT_NAMES, rng.randint(*TENANTS)))
    out: list[PhaseSpec] = []
    kind = ""
    for index in range(rng.randint(*PHASES)):
        kind = rng.choice([k for k in KINDS if k != kind])
        duration, load = _duration(rng), round(rng.uniform(*LOAD), 3)
        out.append(phase_spec(kind, seed * 100 + index + 1, tenants, duration, load))
    return out


def random_phases(seed: int) -> tuple[Workload, list[phases.Phase]]:
    """``seed``'s randomized workload and its phases (``phases.plan``'s shape)."""
    items = [{k: v for k, v in spec.items() if k != "load"} for spec in phase_specs(seed)]
    return phases.back_to_back(items, f"random:{seed}", f"random-{seed}")


def offered_load(workload: Workload, spans: list[phases.Phase]) -> list[float]:
    """Each phase's offered prefill load as generated: ``saturated_s`` of the requests
    arriving in it (the prefix cache replayed in arrival order), over its span and
    ``REPLICAS`` engines."""
    cost, cfg = cost_model(), engine_config()
    per = [0.0] * len(spans)
    for job in solo_replay(workload, cost.profile, cfg):
        k = next(i for i, p in enumerate(spans) if p.holds(job.arrival_s))
        per[k] += request_s(cost, job.cached, job.uncached, job.req.output_tokens, cfg.chunked_prefill_size)
    return [s / ((p.end_s - p.start_s) * REPLICAS) for s, p in zip(per, spans, strict=True)]
