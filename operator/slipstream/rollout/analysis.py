"""Canary analysis: do the canary pods serve any tenant worse than the baseline pods?

The comparison is pure (`compare`): per-tenant p99 TTFT of the canaries against the
baseline's over the same window, and a verdict that carries its numbers so the Event can
say them. Where the figures come from is a `PodLatency` (the controller's Prometheus reader
implements it): the rollout never queries anything itself.

Rules:
- A tenant regresses when its canary p99 exceeds its baseline p99 by more than
  `max_regression_percent`. Any regressing tenant fails the analysis.
- Only tenants with a finite figure on both sides are compared. When none is, there is
  nothing to judge by and the analysis fails: the safe answer to missing data is the
  setting that was already running (a failed read is never a pass).
- Below a noise floor (`floors`: seconds per tenant, or one figure for all) a canary p99
  does not count as a regression whatever the percentage: 0.20 s -> 0.37 s for a tenant
  whose target is 2 s is one window's noise, not a worse setting (found in the closed-loop
  demo). The controller sets each tenant's floor to a fraction of its p99 TTFT target. A
  tenant whose baseline p99 is 0 regresses only above its floor.

`sequential.evaluate` is the rule that compares same-size requests over sub-windows and may
answer Continue (`from_sequential` makes its verdict); the machine then keeps analysing up
to its limit, where the rule must decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slipstream.rollout import sequential


class PodLatency(Protocol):
    """Per-tenant p99 TTFT (seconds) of some pods of one ServingDeployment over a window.

    `start_s` and `end_s` are Unix seconds. Raises on a failed read; returns only tenants
    that had first tokens in the window.
    """

    async def tenant_p99(
        self, namespace: str, deployment: str, pods: Sequence[str], start_s: float, end_s: float
    ) -> dict[str, float]: ...

    async def sub_windows(
        self, namespace: str, deployment: str, canaries: Sequence[str], baseline: Sequence[str],
        start_s: float, end_s: float, sub_window_s: float,
    ) -> list[sequential.SubWindow]:
        """Canary and baseline (tenant, size class) cells over the whole sub-windows from
        `start_s` to `end_s`, oldest first (the sequential rule's input)."""
        ...

    async def exports_size_classes(
        self, namespace: str, deployment: str, pods: Sequence[str], end_s: float, lookback_s: float,
    ) -> bool:
        """Whether any of `pods` had a size-class TTFT series in the `lookback_s` before
        `end_s`: a gap in Prometheus' samples, not engines without the histogram, when
        every sub-window came back empty. Raises on a failed read."""
        ...


@dataclass(frozen=True)
class TenantComparison:
    tenant: str
    canary_p99_s: float
    baseline_p99_s: float

    @property
    def regression_percent(self) -> float:
        if self.baseline_p99_s <= 0:
            return 0.0 if self.canary_p99_s <= 0 else math.inf
        return 100.0 * (self.canary_p99_s - self.baseline_p99_s) / self.baseline_p99_s

    def words(self) -> str:
        return (
            f"{self.tenant} p99 TTFT {self.canary_p99_s:.2f} s vs {self.baseline_p99_s:.2f} s "
            f"({self.regression_percent:+.0f}%)"
        )


@dataclass(frozen=True)
class Verdict:
    passed: bool
    summary: str
    tenants: tuple[TenantComparison, ...] = ()
    undecided: bool = False
    """The sequential rule's Continue: keep analysing (``passed`` is False, and it is no
    failure either); only `sequential.evaluate` gives one, and never once it is final."""
    blind_s: float = 0.0
    """Seconds of the analysis Prometheus had no samples for (`sequential.blind_s`): the
    machine moves the analysis limit out by as much (`machine.analysis_final`)."""

    @property
    def outcome(self) -> sequential.Call:
        return "Continue" if self.undecided else "Promote" if self.passed else "Rollback"


def compare(
    canary: Mapping[str, float],
    baseline: Mapping[str, float],
    max_regression_percent: float,
    floors: float | Mapping[str, float] = 0.0,
) -> Verdict:
    """The verdict of one analysis window (see the module docstring)."""
    shared = sorted(
        t for t in set(canary) & set(baseline) if math.isfinite(canary[t]) and math.isfinite(baseline[t])
    )
    if not shared:
        return Verdict(
            False,
            f"no tenant has figures on both the canary ({len(canary)} tenant(s)) and the baseline "
            f"({len(baseline)} tenant(s)) pods",
        )
    rows = tuple(TenantComparison(t, canary[t], baseline[t]) for t in shared)

    def floor(tenant: str) -> float:
        return floors.get(tenant, 0.0) if isinstance(floors, Mapping) else floors

    worse = [
        r for r in rows
        if r.regression_percent > max_regression_percent and r.canary_p99_s > floor(r.tenant)
    ]  # fmt: skip
    if worse:
        listed = "; ".join(r.words() for r in worse)
        return Verdict(False, f"regressed beyond {max_regression_percent:g}%: {listed}", rows)
    listed = "; ".join(r.words() for r in rows)
    return Verdict(True, f"no tenant regressed beyond {max_regression_percent:g}%: {listed}", rows)


def from_sequential(result: sequential.SequentialResult, blind_s: float = 0.0) -> Verdict:
    """The sequential rule's result as the rollout machine's verdict; ``blind_s``: seconds
    of its sub-windows without samples, which the summary names."""
    summary = result.summary
    if blind_s > 0:
        summary += f"; {blind_s:.0f} s of the analysis had no samples (a scrape gap): its limit moves out by as much"
    return Verdict(result.outcome == "Promote", summary, undecided=result.outcome == "Continue", blind_s=blind_s)


def failed_read(error: str | Exception) -> Verdict:
    """The verdict when the figures could not be read (an exception: its type and the
    first 200 characters of its message)."""
    if isinstance(error, Exception):
        error = f"{type(error).__name__}: {str(error)[:200]}"
    return Verdict(False, f"the canary figures could not be read: {error}")
