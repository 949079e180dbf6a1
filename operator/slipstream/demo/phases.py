"""Traffic in phases, for the demo and the closed-loop test.

1. uniform: one tenant of short, similar prompts. Nothing to gain from capping
   prefill concurrency; the tuner should leave it off (or at the least
   concurrency allowed).
2. heterogeneous: three tenants of short and high-hit prompts (chat, code, and
   an agent re-sending a long shared context) among long cold prompts
   ("giants", 150K-200K tokens, 9-14.5 s of prefill alone) that arrive at
   fixed times, from chat and code in turn, the first as the phase begins.
   Stock SGLang runs a giant's whole prefill before the next request's first
   token, so every request arriving behind one waits; with C // T prefills at
   once they do not. Giants are kept under 1% of each tenant's requests, so each
   tenant's p99 TTFT measures the short requests (what the users feel), not the
   giants' own prefill time. Short prompts stay under 4K tokens (chat and code
   sessions), so a window without a giant gives no reason to cap anything.
3. uniform again: the tuner should step back.

Rates are per engine replica (``replicas`` multiplies them, the load spreads
over the pods). The heterogeneous phase keeps an engine about 80% busy on the
twin (33% of it prefill; ``slipstream bench --workload`` of
``spec_yaml("heterogeneous", 720)``): a loaded but not overloaded fleet, where
stock's worst tenant p99 TTFT is ~12 s and concurrency 2 (ceiling, srpt) brings it
to ~1.3 s. These are the engines' own rates: the operator divides what Prometheus
counts per wall second by a time-scaled stack's factor before the twin runs, so
the twin judges this traffic, not eight times it (at the wall-clock rates the
twin would see an overloaded fleet and move for the overload, not for the mix).
Times are twin seconds; the load divides them by the time
scale. Every phase is a YAML workload spec (slipstream.sim.spec), so
``slipstream bench --workload`` can run each one on the twin alone; the
twin's figures in docs/demo.md come from that command.
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

GIANT_EVERY_S = 80.0
"""Twin seconds between giants per replica (a giant every 40 s across two): one runs
about a third of the time, enough to make stock's queueing the tail of every tenant,
while the engines stay ~70% busy (giants of 250K-400K every 90 s overloaded them:
capped settings then fell behind). The operator reads one control interval (60 s) of
the whole fleet at a time, so every window holds a giant or two: a window without one
reads as uniform traffic (heterogeneity ~0.01), and the tuner would step back in the
middle of the phase."""

GIANT_TOKENS = (150_000, 200_000)

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
            # the first one second into the phase: the mix is visible in the first window
            "arrival_s": round(every * k + 1.0, 3),
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
                "rate_per_s": 0.8 * replicas,
                "prompt_tokens": {"dist": "lognormal", "median": 2000, "sigma": 0.4, "min": 200, "max": 4000},
                "output_tokens": short,
            },
            {
                "name": "code",
                "rate_per_s": 0.8 * replicas,
                "prompt_tokens": {"dist": "lognormal", "median": 1200, "sigma": 0.5, "min": 100, "max": 4000},
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
