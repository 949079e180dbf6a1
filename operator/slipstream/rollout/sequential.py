"""Sequential canary analysis: same-size requests on both sides, a Wald test over sub-windows.

A canary pod and the baseline pods share one Service, so they get the same traffic split
at random; what differs is the setting and luck. One window's p99 is mostly luck on heavy
tailed traffic (a giant prompt on the canary makes its p99 that prompt's own prefill).
This rule compares like with like and lets evidence accumulate:

1. Cells. Requests are grouped by (tenant, ``size_class``): the bounded labels of the
   engines' ``sglang:ttft_by_size_class_seconds`` histogram (``api.buckets``). Each side's
   cell is its histogram's ``_count`` and ``_sum`` increase over a sub-window.
2. A cell counts in a sub-window only with at least ``min_samples`` first tokens on both
   sides. A size class one side did not see (a lone giant prompt) never counts, nor does a
   tenant missing on one side.
3. Per sub-window, the counted cells' log ratios of mean TTFT (canary / baseline) are
   pooled, each weighted by ``n_c * n_b / (n_c + n_b)`` (the weight of a difference of two
   means). The sub-window is "slower" when the pooled ratio exceeds
   ``1 + tolerance_percent / 100``. A sub-window with no counted cell is no observation.
4. The observations form a Bernoulli sequence. Under "no regression" a sub-window is
   slower with probability at most ``p0`` = 0.5 (the two sides are exchangeable, and the
   tolerance only lowers it); under a regression with probability ``p1``. Wald's SPRT
   adds ``log(p1 / p0)`` per slower sub-window and ``log((1 - p1) / (1 - p0))`` per other
   one, and stops at the first crossing of ``log((1 - beta) / alpha)`` (Rollback) or
   ``log(beta / (1 - alpha))`` (Promote). ``alpha`` is the false-rollback level the test is
   built for and ``beta`` the missed-regression level, for independent sub-windows;
   ``slipstream canary-check`` measures both on the twin, where sub-windows share queue
   state and are not independent.
5. Until a crossing the outcome is Continue, whatever the data: missing cells and too few
   samples are Continue, never Rollback. Only at the analysis limit (``final``) does the
   rule decide on what it has: no observation at all rolls back (nothing to judge by: keep
   the setting that was running); otherwise Rollback when the statistic has come
   ``truncation_share`` of the way to the rollback bound, else Promote (a truncated SPRT
   that leans to the setting under test: it has not been shown worse).

Because one sub-window adds at most ``log(p1 / p0)`` (0.34 at the defaults) against a
rollback bound of 2.98, no single burst (one giant prompt blocking the canary for a
sub-window or two) can roll back a setting: a rollback before the limit takes at least
nine slower sub-windows, one at the limit at least five.
The rule is pure: plain counts in, a named `Call` with its numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Call = Literal["Promote", "Rollback", "Continue"]
Cell = tuple[str, str]
"""(tenant, size_class)."""


@dataclass(frozen=True)
class CellHistogram:
    """One cell's TTFT histogram increase over a sub-window (``_count``, ``_sum`` seconds)."""

    count: float
    sum_s: float

    @property
    def mean_s(self) -> float:
        return self.sum_s / self.count if self.count > 0 else math.nan


@dataclass(frozen=True)
class SubWindow:
    """Canary and baseline cells over one sub-window [start_s, end_s)."""

    start_s: float
    end_s: float
    canary: Mapping[Cell, CellHistogram]
    baseline: Mapping[Cell, CellHistogram]


@dataclass(frozen=True)
class SequentialRule:
    tolerance_percent: float = 5.0
    """A sub-window is slower when the pooled canary/baseline mean ratio exceeds 1 + this
    (spec.tuning.rollout.maxRegressionPercent)."""
    min_samples: int = 5
    """First tokens a cell needs on each side in a sub-window to count: below five a mean of
    heavy-tailed TTFTs is one request's luck."""
    p1: float = 0.7
    """Chance a sub-window is slower under a regression worth rolling back: a 2x slower
    canary is slower in about 77-80% of sub-windows on the twin's heterogeneous demo phase
    (a giant prompt on a baseline pod makes the baseline the slower side for a while); 0.7
    sits below that so such stretches do not promote a slow canary. Chosen on that phase
    (in-sample)."""
    alpha: float = 0.05
    """False-rollback level the test is built for (independent sub-windows)."""
    beta: float = 0.02
    """Missed-regression level the test is built for."""
    truncation_share: float = 0.5
    """At the limit, roll back only when the statistic has come this share of the way to
    the rollback bound: an undecided test has no strong evidence either way, and on an
    undecided analysis the candidate has not been shown worse (``canary-check`` measures
    the rates this gives)."""

    @property
    def upper(self) -> float:
        return math.log((1 - self.beta) / self.alpha)

    @property
    def lower(self) -> float:
        return math.log(self.beta / (1 - self.alpha))


P0 = 0.5
"""Chance a sub-window is slower when the canary is no worse (exchangeable sides)."""


@dataclass(frozen=True)
class Step:
    """One sub-window's comparison."""

    start_s: float
    end_s: float
    cells: int
    """Cells counted (enough samples on both sides)."""
    ratio: float
    """Pooled canary/baseline mean TTFT ratio (nan: no cell counted)."""
    slower: bool
    llr: float
    """The statistic after this sub-window."""


@dataclass(frozen=True)
class SequentialResult:
    outcome: Call
    summary: str
    llr: float
    observations: int
    slower: int
    decided_at_s: float | None
    """End of the sub-window where the test crossed a bound (None: it did not)."""
    steps: tuple[Step, ...] = field(default=())


def pooled_ratio(window: SubWindow, min_samples: int) -> tuple[float, int]:
    """The weighted geometric mean of the counted cells' mean ratios, and how many counted."""
    num = den = 0.0
    cells = 0
    for cell in sorted(set(window.canary) & set(window.baseline)):
        c, b = window.canary[cell], window.baseline[cell]
        if c.count < min_samples or b.count < min_samples:
            continue
        if not (c.mean_s > 0 and b.mean_s > 0 and math.isfinite(c.mean_s) and math.isfinite(b.mean_s)):
            continue
        weight = c.count * b.count / (c.count + b.count)
        num += weight * math.log(c.mean_s / b.mean_s)
        den += weight
        cells += 1
    return (math.exp(num / den), cells) if den > 0 else (math.nan, 0)


def decide(windows: Sequence[SubWindow], rule: SequentialRule, final: bool = False) -> SequentialResult:
    """Run the test over the sub-windows in order (see the module docstring)."""
    up, down = rule.upper, rule.lower
    inc_slow, inc_ok = math.log(rule.p1 / P0), math.log((1 - rule.p1) / (1 - P0))
    llr = 0.0
    slower = observations = 0
    steps: list[Step] = []
    for w in windows:
        ratio, cells = pooled_ratio(w, rule.min_samples)
        if cells == 0:
            steps.append(Step(w.start_s, w.end_s, 0, math.nan, False, llr))
            continue
        is_slower = ratio > 1 + rule.tolerance_percent / 100
        observations += 1
        slower += is_slower
        llr += inc_slow if is_slower else inc_ok
        steps.append(Step(w.start_s, w.end_s, cells, ratio, is_slower, llr))
        if llr >= up or llr <= down:
            outcome: Call = "Rollback" if llr >= up else "Promote"
            return _result(outcome, rule, llr, observations, slower, w.end_s, steps, "crossed")
    if final:
        if observations == 0:
            return _result("Rollback", rule, llr, 0, 0, None, steps, "nothing to judge by")
        outcome = "Rollback" if llr >= rule.truncation_share * up else "Promote"
        return _result(outcome, rule, llr, observations, slower, None, steps, "truncated")
    return _result("Continue", rule, llr, observations, slower, None, steps, "undecided")


def _result(outcome: Call, rule: SequentialRule, llr: float, n: int, slower: int, at: float | None,
            steps: list[Step], how: str) -> SequentialResult:  # fmt: skip
    ratios = [s.ratio for s in steps if s.cells]
    median = sorted(ratios)[len(ratios) // 2] if ratios else math.nan
    summary = (
        f"{outcome} ({how}): canary slower by more than {rule.tolerance_percent:g}% in {slower} of {n} "
        f"sub-window(s) with same-size cells on both sides (median ratio {median:.2f}); "
        f"log-likelihood ratio {llr:+.2f} against bounds {rule.lower:+.2f} / {rule.upper:+.2f} "
        f"(alpha {rule.alpha:g}, beta {rule.beta:g}, p1 {rule.p1:g})"
    )
    return SequentialResult(outcome, summary, llr, n, slower, at, tuple(steps))
