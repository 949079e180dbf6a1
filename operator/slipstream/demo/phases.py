"""Traffic in phases, for the demo, the loop benchmark and the closed-loop test.

The demo's workload (``plan``'s default) is documents -> heterogeneous -> documents, two
tenants (chat and code) throughout, whose traffic changes shape:

1. documents: both tenants send retrieval-augmented prompts of about 16K cold tokens
   (10K-24K), uniform in size, keeping each engine about 40% busy. Stock SGLang is best
   here: one prompt at a time with the whole budget. A cap costs: with C // T = 2 two
   documents share every pass, so each takes longer, and a ceiling caps a lone document
   for nothing; on the twin every capped setting's worst-tenant p99 TTFT is 5-40% above
   stock's (``tests/unit/test_demo_phases.py`` checks that no setting is best in both).
2. heterogeneous: short chat and code prompts among long cold prompts ("giants",
   150K-200K tokens, 9-14.5 s of prefill alone) that arrive at fixed times, from chat and
   code in turn, the first as the phase begins. Stock SGLang runs a giant's whole prefill
   before the next request's first token, so every request arriving behind one waits
   (worst-tenant p99 ~12 s); with C // T prefills at once they do not (~1 s).
3. documents again: the tuner should step back.

So no single static setting is best: the cap loses in the documents phases and stock
loses ten-fold in the heterogeneous one, and a loop that follows the traffic can beat
both over the whole run. Giants are kept under 1% of each tenant's requests, so each
tenant's p99 TTFT measures the short requests (what the users feel), not the giants' own
prefill time; and the tenants span every phase, so one giant caught before a loop can
react weighs what it weighs in any tenant's day, not the whole p99 of a tenant that
lives only in that phase.

``uniform`` (one tenant of short, similar prompts) is a further kind, where nothing is
gained or lost by capping.

Rates are per engine replica (``replicas`` multiplies them, the load spreads
over the pods). These are the engines' own rates: the operator divides what Prometheus
counts per wall second by a time-scaled stack's factor before the twin runs, so
the twin judges this traffic, not eight times it (at the wall-clock rates the
twin would see an overloaded fleet and move for the overload, not for the mix).
Times are twin seconds; the load divides them by the time
scale. Every phase is a YAML workload spec (slipstream.sim.spec), so
``slipstream bench --workload`` can run each one on the twin alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from slipstream.sim import profiles
from slipstream.sim import spec as spec_mod
from slipstream.sim.workload import Request, Workload, build

UNIFORM = "uniform"
DOCUMENTS = "documents"
HETEROGENEOUS = "heterogeneous"
DEMO = (DOCUMENTS, HETEROGENEOUS, DOCUMENTS)
"""The demo's phases, in order."""
TENANTS = ("chat", "code")
"""The demo's tenants: both send in every phase of ``DEMO``."""

DEMO_ENGINE = {"chunked_prefill_size": 8192, "page_size": 1, "cache_tokens": 3_000_000}
PROFILE = profiles.DEFAULT_PROFILE

GIANT_EVERY_S = 80.0
"""Twin seconds between giants per replica (a giant every 40 s across two): one runs
about a third of the time, enough to make stock's queueing the tail of every tenant,
while the engines stay ~70% busy (giants of 250K-400K every 90 s overloaded them:
capped settings then fell behind). The operator reads one control interval (60 s) of
the whole fleet at a time, so every window holds a giant or two: a window without one
reads as uniform traffic (heterogeneity ~0.01), and the tuner would step back in the
middle of the phase."""

GIANT_TOKENS = (150_000, 200_000)

GIANT_TENANTS = TENANTS
"""The tenants whose requests include giants, in turn."""

DOCUMENT_RATE_PER_S = 0.4
"""Documents per second per tenant and replica: two tenants keep an engine ~40% busy with
16K-token prefills, enough that two documents often overlap (where a cap makes them
share passes) without a standing queue."""


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
        "engine": DEMO_ENGINE,
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


SHORT_OUTPUT = {"dist": "lognormal", "median": 20, "sigma": 0.5, "min": 1, "max": 100}


def _spec(name: str, duration_s: float, seed: int, **rest: object) -> dict[str, object]:
    return {"name": name, "profile": PROFILE, "engine": DEMO_ENGINE, "seed": seed, "duration_s": duration_s, **rest}


def documents_spec(duration_s: float, replicas: int, seed: int) -> dict[str, object]:
    document = {"dist": "lognormal", "median": 16000, "sigma": 0.15, "min": 10000, "max": 24000}
    return _spec(DOCUMENTS, duration_s, seed, tenants=[
        {"name": name, "rate_per_s": DOCUMENT_RATE_PER_S * replicas, "prompt_tokens": document,
         "output_tokens": SHORT_OUTPUT} for name in TENANTS])  # fmt: skip


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
        "engine": DEMO_ENGINE,
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
        ],
    }


SPECS = {UNIFORM: uniform_spec, DOCUMENTS: documents_spec, HETEROGENEOUS: heterogeneous_spec}


def phase_workload(kind: str, duration_s: float, replicas: int = 1, seed: int = 1, base: int = 0) -> Workload:
    """One phase's requests, arrivals from 0 (twin seconds)."""
    doc = SPECS[kind](duration_s, replicas, seed)
    return spec_mod.parse(yaml.safe_dump(doc), f"<phase {kind}>", tenant_base=base).workload


def plan(
    phase_s: float,
    replicas: int = 2,
    kinds: tuple[str, ...] = DEMO,
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


PartOf = Callable[[dict[str, Any], str, int, float], Workload | None]
"""(phase item, where, index, duration) -> the phase's requests, or None for a workload spec."""


def back_to_back(items: Sequence[object], origin: str, name: str,
                 part_of: PartOf | None = None) -> tuple[Workload, list[Phase]]:  # fmt: skip
    """Phases, each a workload spec with a numeric ``duration_s`` (its ``name`` the phase's
    kind), one after another: one workload (request ids prefixed by the phase, arrivals
    past a phase's end left out) and the spans. ``part_of`` may read a phase another way
    (loopbench's phases of traces). Errors name ``origin: phases[i]``."""
    requests: list[Request] = []
    spans: list[Phase] = []
    start = 0.0
    for index, item in enumerate(items):
        where = f"{origin}: phases[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("duration_s"), int | float):
            raise ValueError(f"{where}: each phase is a workload spec with a numeric duration_s")
        duration = float(item["duration_s"])
        part = part_of(item, where, index, duration) if part_of is not None else None
        if part is None:
            try:
                part = spec_mod.parse(yaml.safe_dump(item), where, tenant_base=index * 8).workload
            except spec_mod.SpecError as exc:  # its line is the phase's re-dumped text's: leave it out
                raise ValueError(re.sub(rf"^{re.escape(where)}:\d+", where, str(exc))) from None
        label = f"{index + 1}-{item.get('name') or 'phase'}"
        requests += [replace(r, rid=f"{label}/{r.rid}", arrival_s=r.arrival_s + start) for r in part.requests
                     if r.arrival_s < duration]  # fmt: skip
        spans.append(Phase(label, str(item.get("name") or "phase"), start, start + duration))
        start += duration
    return build(name, requests, " -> ".join(s.name for s in spans)), spans


def spec_yaml(kind: str, duration_s: float, replicas: int = 1) -> str:
    """The phase as a YAML spec, for ``slipstream bench --workload``."""
    return yaml.safe_dump(SPECS[kind](duration_s, replicas, 1), sort_keys=False)
