"""Traffic in phases, for the demo and the closed-loop test.

1. uniform: one tenant of short, similar prompts. Nothing to gain from capping
   prefill concurrency; the tuner should leave it off (or at the least
   concurrency allowed).
2. heterogeneous: three tenants of short and high-hit prompts (chat, code, and
   an agent re-sending a long shared context) among long cold prompts
   ("giants", 150K-250K tokens, ~20-35 s of prefill alone) that arrive at
   fixed times, from chat and code in turn. Stock SGLang runs a giant's whole
   prefill before the next request's first token, so every request arriving
   behind one waits; with C // T prefills at once they do not. Giants are kept
   under 1% of each tenant's requests, so each tenant's p99 TTFT measures the
   short requests (what the users feel), not the giants' own prefill time.
3. uniform again: the tuner should step back.

Rates are per engine replica (``replicas`` multiplies them, the load spreads
over the pods). Times are twin seconds; the load divides them by the time
scale. Every phase is a YAML workload spec (slipstream.sim.spec), so
``slipstream bench --workload`` can run each one on the twin alone; the
figures the README quotes come from that command.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import yaml

from slipstream.sim import spec as spec_mod
from slipstream.sim.workload import Request, Workload, build

UNIFORM = "uniform"
HETEROGENEOUS = "heterogeneous"

ENGINE = {"chunked_prefill_size": 8192, "page_size": 1, "cache_tokens": 3_000_000}
PROFILE = "kimi-k3-8xh200"

GIANT_EVERY_S = 120.0
"""Twin seconds between giants per replica: one runs about a quarter of the time,
enough to make stock's queueing the tail of every tenant, while the engines stay ~70%
busy (giants of 250K-400K every 90 s overloaded them: capped settings then fell behind)."""

GIANT_TOKENS = (150_000, 250_000)

GIANT_TENANTS = ("chat", "code")
"""The tenants whose requests include giants, in turn. The agent, whose long prompts
hit the cache, has none: with three tenants a judged window of a few hundred seconds put
more than 1% giants into the agent's requests, and its p99 became a giant's own prefill."""


@dataclass(frozen=True)
class Phase:
    """One phase of the load: its kind and twin-time span (start inclusive)."""

    name: str
    kind: str
    start_s: float
    end_s: float

    def holds(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s


def uniform_spec(duration_s: float, replicas: int, seed: int) -> dict[str, object]:
    return {
        "name": UNIFORM,
        "profile": PROFILE,
        "engine": ENGINE,
        "seed": seed,
        "duration_s": duration_s,
        "tenants": [
            {
                "name": "chat",
                "rate_per_s": 1.2 * replicas,
                "prompt_tokens": {"dist": "lognormal", "median": 2000, "sigma": 0.3, "min": 500, "max": 6000},
                "output_tokens": {"dist": "lognormal", "median": 20, "sigma": 0.5, "min": 1, "max": 100},
            }
        ],
    }


def heterogeneous_spec(duration_s: float, replicas: int, seed: int) -> dict[str, object]:
    tenants = list(GIANT_TENANTS)
    every = GIANT_EVERY_S / replicas
    count = int(duration_s // every)
    lo, hi = GIANT_TOKENS
    giants = [
        {
            "id": f"giant-{k}",
            "tenant": tenants[k % len(tenants)],
            "arrival_s": round(every * (k + 0.5), 3),
            "prompt_tokens": int(lo + (hi - lo) * ((k * 37) % 11) / 10),
            "output_tokens": 5,
        }
        for k in range(count)
    ]
    short = {"dist": "lognormal", "median": 20, "sigma": 0.5, "min": 1, "max": 100}
    return {
        "name": HETEROGENEOUS,
        "profile": PROFILE,
        "engine": ENGINE,
        "seed": seed,
        "duration_s": duration_s,
        "requests": giants,
        "tenants": [
            {
                "name": "chat",
                "rate_per_s": 0.6 * replicas,
                "prompt_tokens": {"dist": "lognormal", "median": 2000, "sigma": 0.4, "min": 200, "max": 8000},
                "output_tokens": short,
            },
            {
                "name": "code",
                "rate_per_s": 0.6 * replicas,
                "prompt_tokens": {"dist": "lognormal", "median": 1200, "sigma": 0.5, "min": 100, "max": 6000},
                "output_tokens": short,
            },
            {
                "name": "agent",
                "rate_per_s": 0.3 * replicas,
                "prompt_tokens": {"dist": "lognormal", "median": 20000, "sigma": 0.1, "min": 19000, "max": 30000},
                "output_tokens": short,
                "shared_prefix_tokens": 18000,
            },
        ],
    }


SPECS = {UNIFORM: uniform_spec, HETEROGENEOUS: heterogeneous_spec}


def phase_workload(kind: str, duration_s: float, replicas: int = 1, seed: int = 1, base: int = 0) -> Workload:
    """One phase's requests, arrivals from 0 (twin seconds)."""
    doc = SPECS[kind](duration_s, replicas, seed)
    return spec_mod.parse(yaml.safe_dump(doc), f"<phase {kind}>", tenant_base=base).workload


def plan(
    phase_s: float,
    replicas: int = 2,
    kinds: tuple[str, ...] = (UNIFORM, HETEROGENEOUS, UNIFORM),
) -> tuple[Workload, list[Phase]]:
    """The phases back to back: one workload (request ids prefixed by the phase) and the spans."""
    requests: list[Request] = []
    phases: list[Phase] = []
    for index, kind in enumerate(kinds):
        start = index * phase_s
        name = f"{index + 1}-{kind}"
        part = phase_workload(kind, phase_s, replicas, seed=index + 1, base=index * 8)
        requests += [replace(r, rid=f"{name}/{r.rid}", arrival_s=r.arrival_s + start) for r in part.requests]
        phases.append(Phase(name, kind, start, start + phase_s))
    return build("phases", requests, " -> ".join(p.name for p in phases)), phases


def spec_yaml(kind: str, duration_s: float, replicas: int = 1) -> str:
    """The phase as a YAML spec, for ``slipstream bench --workload``."""
    return yaml.safe_dump(SPECS[kind](duration_s, replicas, 1), sort_keys=False)
