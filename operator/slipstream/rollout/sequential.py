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
   means). A sub-window with no counted cell is no observation.
4. Each observation scores ``x = clip(log(ratio) / log(1 + tolerance), 0, 1)``: 0 when the
   canary is no slower, 1 when it is slower by the whole tolerance
   (``maxRegressionPercent``) or more, in between in proportion. The statistic adds
   ``step * (2x - 1)``: a Wald SPRT for the mean log ratio, 0 (no regression) against the
   tolerance (a regression to roll back), with the observation clipped to that span so
   that no sub-window weighs more than ``step`` either way. It stops at the first
   crossing of ``log((1 - beta) / alpha)`` (Rollback) or ``log(beta / (1 - alpha))``
   (Promote). The clip is what makes it robust on heavy-tailed traffic: a giant prompt
   that blocks one side for a sub-window moves the statistic by ``step`` and no more,
   however large the ratio. A plain sign test (slower or not, at the tolerance) throws
   the size of the difference away: at a 100% tolerance it caught a 2x slower canary in
   under half the pairs of ``slipstream canary-check``.
5. Until a crossing the outcome is Continue, whatever the data: missing cells and too few
   samples are Continue, never Rollback. Only at the analysis limit (``final``) does the
   rule decide on what it has: no observation at all rolls back (nothing to judge by: keep
   the setting that was running); otherwise Rollback when the statistic has come
   ``truncation_share`` of the way to the rollback bound, or to as far as its observations
   could take it when fewer than the bound needs (``observations * step``), else Promote
   (a truncated SPRT that leans to the setting under test: it has not been shown worse).
   The second clause is for a canary so slow that few of its cells reach ``min_samples``:
   two sub-windows both fully slower (a canary 15x slower, its other cells starved) reach
   1.4, under half the bound, yet are all the evidence such a canary gives.
6. Starved. Means are taken over the requests that got their first token, so a canary
   too slow to keep up shows only its quick ones, and can score faster in a sub-window
   than a baseline that serves all of its share. The Service splits requests evenly over pods,
   so at the limit (given the pod counts, ``pods``) a canary whose pods gave fewer than
   ``starved_share`` of the baseline pods' first tokens per pod over the analysis, with
   at least ``starved_min`` per baseline pod, rolls back: it is not keeping up with its
   share of the traffic. A canary that keeps up (slower or not) gives as many as the
   baseline, so this clause changes nothing for it.
7. Blind. A sub-window without a single series on either side (`SubWindow.scraped`) is a
   scrape gap, not a quiet spell, and the analysis limit moves out by its length
   (`blind_s`; `machine.analysis_final` caps the move at one more limit): a truncated
   Promote must not be decided on the few sub-windows a Prometheus outage left (a 60 s
   outage inside a 120 s analysis of 10 s sub-windows leaves about half of them).

At the defaults one sub-window adds at most 0.7 against a rollback bound of 2.98, so no
burst shorter than five sub-windows (one giant prompt blocking the canary for a while) can
roll back a setting before the limit, and a promotion takes at least six. ``alpha`` and
``beta`` are the levels the test is built for with independent sub-windows; sub-windows
share queue state, so ``slipstream canary-check`` measures the real rates on the twin.
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
    scraped: bool = True
    """Whether Prometheus answered any series for this sub-window, on either side, idle
    ones (a zero increase) included. False: it has no two scrapes in its range (Prometheus
    down, stopped or not scraping), so it is no evidence at all, not a quiet sub-window
    (rule 7)."""


def blind_s(windows: Sequence[SubWindow]) -> float:
    """Seconds of the sub-windows Prometheus has no samples for (rule 7)."""
    return sum(w.end_s - w.start_s for w in windows if not w.scraped)


@dataclass(frozen=True)
class SequentialRule:
    tolerance_percent: float = 100.0
    """The regression to roll back, percent slower (spec.tuning.rollout.maxRegressionPercent,
    the CRD's default here too). Below `MIN_TOLERANCE_PERCENT` it counts as that: a smaller
    difference of mean TTFTs over one sub-window is noise."""
    min_samples: int = 5
    """First tokens a cell needs on each side in a sub-window to count: below five a mean of
    heavy-tailed TTFTs is one request's luck."""
    step: float = 0.7
    """Most one sub-window moves the statistic, either way. Below 2.98 / 5 so that four
    sub-windows fully slower (a giant blocking the canary for 40 s) cannot roll back before
    the limit. Chosen with `slipstream canary-check` on the demo's heterogeneous phase of
    2026-12-03 (in-sample); docs/operator.md has the current rule's rates on the demo's
    phases and another workload."""
    alpha: float = 0.05
    """False-rollback level the test is built for (independent sub-windows)."""
    beta: float = 0.02
    """Missed-regression level the test is built for."""
    starved_share: float = 0.5
    """At the limit, a canary whose pods gave fewer than this share of the baseline pods'
    first tokens per pod is starved (rule 6): even splits put it near 1 (a 60-request
    share's Poisson noise is 13%), a canary that keeps up at any speed too."""
    starved_min: float = 20.0
    """First tokens per baseline pod over the analysis below which rule 6 says nothing."""
    truncation_share: float = 0.4
    """At the limit, roll back only when the statistic has come this share of the way to
    the rollback bound (or to ``observations * step``, when that is nearer): an undecided
    test has no strong evidence either way, and on an undecided analysis the candidate has
    not been shown worse. ``canary-check`` on the demo's heterogeneous phase from stock
    (200 pairs, limit 120 s, 2026-12-04): at 0.5 a 2x slower canary was caught in 86.5%,
    at 0.4 in 95%, with no A/A rollback at either: in-sample; docs/operator.md has the rows
    of other workloads and directions."""

    @property
    def upper(self) -> float:
        return math.log((1 - self.beta) / self.alpha)

    @property
    def lower(self) -> float:
        return math.log(self.beta / (1 - self.alpha))


MIN_TOLERANCE_PERCENT = 5.0
"""The least tolerance the score is scaled to."""


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
    """Scored past the middle (ratio above sqrt(1 + tolerance))."""
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


def evaluate(windows: Sequence[SubWindow], rule: SequentialRule, final: bool = False,
           pods: tuple[int, int] | None = None) -> SequentialResult:  # fmt: skip
    """Run the test over the sub-windows in order (see the module docstring); ``pods``:
    (canary pods, baseline pods), for the starved rule at the limit."""
    up, down = rule.upper, rule.lower
    scale = math.log(1 + max(rule.tolerance_percent, MIN_TOLERANCE_PERCENT) / 100)
    llr = 0.0
    slower = observations = 0
    steps: list[Step] = []
    for w in windows:
        ratio, cells = pooled_ratio(w, rule.min_samples)
        if cells == 0:
            steps.append(Step(w.start_s, w.end_s, 0, math.nan, False, llr))
            continue
        score = min(1.0, max(0.0, math.log(ratio) / scale))
        observations += 1
        slower += score > 0.5
        llr += rule.step * (2 * score - 1)
        steps.append(Step(w.start_s, w.end_s, cells, ratio, score > 0.5, llr))
        if llr >= up or llr <= down:
            outcome: Call = "Rollback" if llr >= up else "Promote"
            return _result(outcome, rule, llr, observations, slower, w.end_s, steps, "crossed")
    if final:
        if observations == 0:
            return _result("Rollback", rule, llr, 0, 0, None, steps, "nothing to judge by")
        if (share := starved(windows, pods, rule)) is not None:
            return _result("Rollback", rule, llr, observations, slower, None, steps,
                           f"starved: the canary gave {share:.0%} of the baseline's first tokens per pod")  # fmt: skip
        outcome = "Rollback" if llr >= rule.truncation_share * min(up, observations * rule.step) else "Promote"
        return _result(outcome, rule, llr, observations, slower, None, steps, "truncated")
    return _result("Continue", rule, llr, observations, slower, None, steps, "undecided")


def starved(windows: Sequence[SubWindow], pods: tuple[int, int] | None, rule: SequentialRule) -> float | None:
    """The canary's first tokens per pod over the baseline's, over every cell of every
    sub-window, when below ``rule.starved_share`` with enough baseline first tokens to
    tell (rule 6); None otherwise, or without the pod counts."""
    if pods is None or pods[0] <= 0 or pods[1] <= 0:
        return None
    canary = sum(h.count for w in windows for h in w.canary.values()) / pods[0]
    baseline = sum(h.count for w in windows for h in w.baseline.values()) / pods[1]
    if baseline < rule.starved_min:
        return None
    share = canary / baseline
    return share if share < rule.starved_share else None


def _result(outcome: Call, rule: SequentialRule, llr: float, n: int, slower: int, at: float | None,
            steps: list[Step], how: str) -> SequentialResult:  # fmt: skip
    ratios = [s.ratio for s in steps if s.cells]
    median = sorted(ratios)[len(ratios) // 2] if ratios else math.nan
    summary = (
        f"{outcome} ({how}): canary regressed past half of {rule.tolerance_percent:g}% in {slower} of {n} "
        f"sub-window(s) with same-size cells on both sides (median ratio {median:.2f}); "
        f"statistic {llr:+.2f} against bounds {rule.lower:+.2f} / {rule.upper:+.2f} "
        f"(alpha {rule.alpha:g}, beta {rule.beta:g}, step {rule.step:g})"
    )
    return SequentialResult(outcome, summary, llr, n, slower, at, tuple(steps))
