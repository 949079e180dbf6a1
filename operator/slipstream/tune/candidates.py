"""The settings the tuner may choose from, and what the spec allows of them.

A candidate is the engine's tuned triple (``sim.policies.Setting``): admission order
(fcfs, lpm, srpt; on SGLang 0.5.23 also hrrn and spf, its shortest-prefill-first), mode
(ceiling, floor, reflex) and threshold T. T is set through a concurrency K, the number of
long prefills that share a round: ``T = C // K`` rounded down to whole pages. T = 0 is off
(stock's whole-request admission): one long prefill at a time, so it counts as concurrency
1; its mode does not matter and it is listed once per order (as ``ceiling``). K = 1 (T = C)
behaves like off and is not listed separately.

The modes come from the spec (``TuningSpec.modes``): ``spec.tuning.engineMode: reflex``
tunes T and the order with the reflex kept (``sim.admission``: the engine caps only in
the passes where a request of at most T uncached tokens waits, or did in the last few
seconds, and runs stock in the others), and lists no T = 0: a reflex is already off on
uniform traffic, while T = 0 would serve the next giant's arrival uncapped until the
tuner sees it, a tuning interval or more later. Otherwise ceiling and floor are tuned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slipstream.api import models, versions
from slipstream.api.models import ServingDeploymentSpec
from slipstream.sim.admission import MODES
from slipstream.sim.policies import ORDERS, QUEUE_ORDERS, Setting, twin_order

TUNED_MODES = ("ceiling", "floor")
"""The modes tuned when the spec's engine mode is not the reflex (``modes_for``)."""


@dataclass(frozen=True, slots=True)
class TuningSpec:
    """What the ServingDeployment's spec says the tuner may do, as plain data."""

    chunked_prefill_size: int = 8192
    """C, tokens per round (``spec.engine.chunkedPrefillSize``)."""
    page_size: int = 1
    """KV page size, tokens (``spec.engine.pageSize``): T is a whole number of pages."""
    min_concurrency: int = 1
    """Fewest concurrent prefills (``spec.tuning.minConcurrency``); off counts as 1."""
    max_concurrency: int = 8
    """Most concurrent prefills (``spec.tuning.maxConcurrency``)."""
    ttft_target_s: float = 2.0
    """p99 TTFT target of every tenant not listed (``spec.tuning.objective.ttftP99Seconds``)."""
    tenant_targets: tuple[tuple[str, float], ...] = ()
    """(tenant, p99 TTFT target seconds) (``spec.tuning.objective.tenants``)."""
    orders: tuple[str, ...] = ORDERS
    """Orders the tuner may choose, twin names: ``spec.tuning.orders`` that the engine's
    release (``spec.engine.version``) runs."""
    modes: tuple[str, ...] = TUNED_MODES
    """Modes the tuner may choose (``modes_for``: reflex alone when
    ``spec.tuning.engineMode`` is reflex, else ceiling and floor)."""

    def __post_init__(self) -> None:
        if self.chunked_prefill_size <= 0 or self.page_size <= 0:
            raise ValueError("chunked_prefill_size and page_size must be > 0")
        if not 1 <= self.min_concurrency <= self.max_concurrency:
            raise ValueError(
                f"concurrency bounds must satisfy 1 <= min ({self.min_concurrency}) <= max "
                f"({self.max_concurrency})"
            )
        if self.max_concurrency * self.page_size > self.chunked_prefill_size:
            raise ValueError("max_concurrency must be <= chunked_prefill_size / page_size")
        if not self.orders or any(o not in QUEUE_ORDERS for o in self.orders):
            raise ValueError(f"orders must be some of {QUEUE_ORDERS}, got {self.orders!r}")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must be some of {MODES}, got {self.modes!r}")

    @property
    def lists_off(self) -> bool:
        """Whether T = 0 is a candidate: not for a reflex spec (module doc)."""
        return any(m != "reflex" for m in self.modes)

    def target_for(self, tenant: str) -> float:
        return dict(self.tenant_targets).get(tenant, self.ttft_target_s)

    def threshold_for(self, concurrency: int) -> int:
        """T giving ``concurrency`` prefills a round: C // K rounded down to pages."""
        return self.chunked_prefill_size // concurrency // self.page_size * self.page_size

    def allows(self, setting: Setting) -> bool:
        """Inside the spec's bounds (order and mode known, concurrency in range, whole pages)."""
        if setting.order not in self.orders:
            return False
        if setting.mode not in self.modes if setting.threshold else not self.lists_off:
            return False
        if setting.threshold % self.page_size or setting.threshold > self.chunked_prefill_size:
            return False
        return self.min_concurrency <= concurrency(setting, self.chunked_prefill_size) <= self.max_concurrency


def from_spec(spec: ServingDeploymentSpec) -> TuningSpec:
    """The tuner's view of a ServingDeployment's spec."""
    tuning = spec.tuning
    return TuningSpec(
        chunked_prefill_size=spec.engine.chunked_prefill_size,
        page_size=spec.engine.page_size,
        min_concurrency=tuning.min_concurrency,
        max_concurrency=tuning.max_concurrency,
        ttft_target_s=tuning.objective.ttft_p99_seconds,
        tenant_targets=tuple((t.name, t.ttft_p99_seconds) for t in tuning.objective.tenants),
        orders=twin_orders(spec.engine.version, spec.tuning.orders),
        modes=modes_for(tuning.engine_mode),
    )


def modes_for(engine_mode: str) -> tuple[str, ...]:
    """The modes Auto tunes for a spec whose ``tuning.engineMode`` is ``engine_mode``: the
    reflex alone (module doc), or ceiling and floor."""
    return ("reflex",) if engine_mode == "reflex" else TUNED_MODES


def twin_orders(version: str, wanted: Sequence[str] | None = None) -> tuple[str, ...]:
    """The orders of ``wanted`` (``spec.tuning.orders``; None: all) the release's patched
    engine runs, by the twin's names, in the release's order."""
    return tuple(twin_order(o) for o in versions.orders(version) if wanted is None or o in wanted)


def concurrency(setting: Setting, chunked_prefill_size: int) -> int:
    """Long prefills that share a round: C // T, 1 when T is 0 (off), as status shows it."""
    return models.prefills_at_once(chunked_prefill_size, setting.threshold)


PREFERRED_ORDERS = ("srpt", "fcfs", "lpm", "spf", "hrrn")
"""Tie-break among orders. srpt (with aging) predicts as well as fcfs on a calm window and
far better once a long prompt arrives, which a short window may not have shown: a tie
broken towards fcfs leaves the next giant prompt in front of every short request that
arrives behind it, while srpt lets them past. 0.5.23's own orders come last: on a tie the
order both releases run is kept."""


def preference(setting: Setting, chunked_prefill_size: int) -> tuple[int, int, int]:
    """Sort key among near-equal candidates: least concurrency, then srpt, fcfs, lpm, then
    ceiling. Least concurrency first: fewer partial prefills hold less KV and stall decodes
    less, and off is the setting an operator can reason about without the patch."""
    return (concurrency(setting, chunked_prefill_size), PREFERRED_ORDERS.index(setting.order),
            MODES.index(setting.mode))


def enumerate_candidates(spec: TuningSpec, orders: tuple[str, ...] = ORDERS,
                         modes: tuple[str, ...] = MODES) -> list[Setting]:
    """Every candidate inside the spec's bounds (orders the release runs), preferred first,
    without duplicates."""
    orders = tuple(o for o in orders if o in spec.orders)
    modes = tuple(m for m in modes if m in spec.modes)
    out: list[Setting] = []
    if spec.min_concurrency <= 1 and spec.lists_off:
        out += [Setting(0, "ceiling", order) for order in orders]
    for k in range(max(2, spec.min_concurrency), spec.max_concurrency + 1):
        threshold = spec.threshold_for(k)
        if threshold <= 0:
            continue
        out += [Setting(threshold, mode, order) for order in orders for mode in modes]
    unique = list(dict.fromkeys(out))
    return sorted(unique, key=lambda s: preference(s, spec.chunked_prefill_size))
