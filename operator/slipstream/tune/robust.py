"""The robust choice: the setting that does best across the workloads a window is consistent with.

One window does not pin the workload down. The twin's synthesis of it depends on the seed
(which of the window's rare giant prompts land where) and on the fitted burst size (the
fit's own uncertainty: its neighbours on the ladder fit nearly as well), and the candidate
that wins on one such draw can lose badly on another. So the recommender runs its best
candidates on several *draws* (``recommend.draws``: the confirming sample and independent
resamples at the neighbouring burst sizes, each at the calibrated rate) and chooses by this
rule:

1. on each draw d, a candidate c's *regret* is how much worse its objective is than the
   best candidate's on that same draw: ``r(c, d) = o(c, d) / min_c' o(c', d)`` (1 when it
   is that draw's best, 2 when twice as slow as the best);
2. a candidate's *score* is an upper quantile of its regrets over the draws
   (``quantile``; 1.0, the default, is the worst draw: with three draws an inner quantile
   would ignore the one draw that had the giants);
3. the choice is the least score; candidates within ``tie_tolerance`` (relative) of it
   are ties, won by the caller's preference (least concurrency, then srpt, ...);
4. the *robust gain* of the choice over the current setting is ``1 - score(choice) /
   score(current)``: the guardrails need it to clear ``min_gain`` before a move
   (``NotOnResample`` otherwise).

Why regret as a ratio, per draw: errors cost unequal amounts, and the ratio says by how
much. A cap on uniform traffic costs a few percent (regret ~1.05 on those draws); no cap
when giant cold prompts arrive costs 10x (regret ~10 on those draws). Minimising the worst
regret therefore takes the cap when even a minority of the plausible draws has giants, and
keeps stock when no draw has them (every regret ~1, the tie goes to least concurrency).
When the draws disagree with no clear winner (A beats the current setting by 30% on one
draw and loses by 30% on another) both score about the same, the robust gain is near 0,
and the guardrails hold: a point estimate would have moved on whichever draw it saw.

Pure: plain numbers in, plain numbers out; the twin runs are the caller's
(``tune.recommend``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Scored(Generic[K]):
    """One candidate's regrets over the draws, and its score (their upper quantile)."""

    candidate: K
    regrets: tuple[float, ...]
    """o(c, d) / min o(., d) per draw, in the draws' order (>= 1; inf when its run did not
    finish a request the others did)."""
    score: float


def regrets(figures: Mapping[K, Sequence[float]]) -> dict[K, tuple[float, ...]]:
    """Per candidate, its regret on each draw (step 1). ``figures[c][d]`` is candidate c's
    objective on draw d (lower is better); every candidate has a figure on every draw. A
    draw whose best figure is not finite and positive gives every candidate regret 1 (it
    tells them apart in nothing); a non-finite figure elsewhere is regret inf."""
    if not figures:
        return {}
    n = {len(v) for v in figures.values()}
    if len(n) != 1:
        raise ValueError(f"every candidate needs a figure on every draw, got lengths {sorted(n)}")
    draws = n.pop()
    out: dict[K, list[float]] = {c: [] for c in figures}
    for d in range(draws):
        column = [v[d] for v in figures.values()]
        best = min((x for x in column if math.isfinite(x)), default=math.nan)
        for c, v in figures.items():
            if not (math.isfinite(best) and best > 0):
                out[c].append(1.0)
            else:
                out[c].append(v[d] / best if math.isfinite(v[d]) else math.inf)
    return {c: tuple(r) for c, r in out.items()}


def upper_quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank from above: q = 1 is the max)."""
    if not values:
        return math.nan
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, max(0, math.ceil(q * len(ranked)) - 1))]


def score(figures: Mapping[K, Sequence[float]], quantile: float = 1.0) -> list[Scored[K]]:
    """Every candidate scored (steps 1-2), in the mapping's order."""
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    return [Scored(c, r, upper_quantile(r, quantile)) for c, r in regrets(figures).items()]


def choose(figures: Mapping[K, Sequence[float]], preference: Callable[[K], tuple[int, ...]],
           quantile: float = 1.0, tie_tolerance: float = 0.05,
           eligible: Callable[[K], bool] | None = None) -> tuple[Scored[K], list[Scored[K]]]:
    """(the robust choice, every candidate scored): steps 1-3, least score among the
    ``eligible`` (default all; the others, such as a current setting outside the spec's
    bounds, are still scored: regret is relative to every candidate run), ties within
    ``tie_tolerance`` won by the least ``preference`` key."""
    every = score(figures, quantile)
    scored = [s for s in every if eligible is None or eligible(s.candidate)]
    if not scored:
        raise ValueError("no eligible candidates to choose from")
    least = min(s.score for s in scored)
    ties = [s for s in scored if s.score <= least * (1 + tie_tolerance)]
    return min(ties, key=lambda s: preference(s.candidate)), every


def gain(chosen: Scored[K], current: Scored[K]) -> float:
    """The robust gain (step 4): ``1 - score(chosen) / score(current)``; 1 when only the
    current's score is infinite (it left requests unserved on some draw), 0 when neither
    is finite."""
    a, b = current.score, chosen.score
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0:
        return 1.0 if math.isinf(a) and math.isfinite(b) else 0.0
    return 1.0 - b / a
