"""How mixed the queue is: one number in [0, 1] from the uncached-prompt-token histogram.

    H = 1 - E[S]^2 / E[S^2]  =  CV^2 / (1 + CV^2)

where S is a request's prefill cost (seconds alone on an idle engine, from the twin's
cost profile; tokens when no profile is given) and the expectation runs over the
requests of the window (``sglang:uncached_prompt_tokens_histogram``). Each bucket's
requests are placed at its midpoint; the +Inf bucket at the mean its share of ``_sum``
implies.

Why this one: by the Pollaczek-Khinchine formula a first-come-first-served queue makes
the average request wait ``rho / (1 - rho) * E[S^2] / (2 E[S])``, i.e. its slowdown grows
with ``E[S^2] / E[S]^2 = 1 + CV^2`` at a given load. That factor is exactly the part of
queueing that comes from the *spread* of prefill costs, the part an admission order
(srpt) or concurrent prefills (a threshold T) can remove and stock cannot. H maps it
into [0, 1): 0 when every prompt costs the same (uniform traffic: nothing to gain from
reordering), 0.5 for exponential sizes, and close to 1 when a few long cold prompts
carry most of the prefill work (a 600K-token document among 2K-token chats). Weighting
by cost rather than tokens counts what the engine actually spends: the fixed per-pass
overhead makes short prompts dearer than their tokens, attention over the context makes
long ones dearer (on kimi-k3-8xh200 a 2K prompt takes 0.12 s alone, a 100K one 4.7 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from slipstream.api.snapshot import Histogram
from slipstream.sim.cost import CostModel
from slipstream.sim.profiles import Profile


def representative_lengths(hist: Histogram) -> list[tuple[float, float]]:
    """(tokens, observations) per non-empty bucket: midpoints, the +Inf one from ``_sum``."""
    buckets = [(lo, hi, n) for lo, hi, n in hist.buckets() if n > 0]
    if len(buckets) == 1:
        # One bucket: its mean is known exactly from _sum (uniform traffic stays at H = 0).
        return [(hist.sum / buckets[0][2] if hist.sum > 0 else _mid(*buckets[0][:2]), buckets[0][2])]
    out = [(_mid(lo, hi), n) for lo, hi, n in buckets if math.isfinite(hi)]
    tail = [(lo, n) for lo, hi, n in buckets if not math.isfinite(hi)]
    if tail:
        lo, n = tail[0]
        rest = hist.sum - sum(x * c for x, c in out)
        out.append((max(lo, rest / n), n))
    return out


def _mid(lo: float, hi: float) -> float:
    return (lo + hi) / 2.0


def prefill_cost(profile: Profile | None, chunked_prefill_size: int) -> Callable[[float], float]:
    """A request's prefill seconds alone (from the profile), or its tokens without one."""
    if profile is None:
        return lambda tokens: tokens
    cost = CostModel(profile)
    return lambda tokens: cost.solo_prefill_s(0, max(1, int(tokens)), chunked_prefill_size)


def heterogeneity(hist: Histogram | None, profile: Profile | None = None,
                  chunked_prefill_size: int = 8192) -> float:
    """H in [0, 1] of one window's uncached-prompt-token histogram (see the module doc).

    NaN when the histogram is missing, empty or not finite: no traffic is not "uniform".
    """
    if hist is None or hist.total <= 0 or not hist.finite:
        return math.nan
    cost = prefill_cost(profile, chunked_prefill_size)
    weighted = [(cost(tokens), n) for tokens, n in representative_lengths(hist)]
    if len({s for s, _ in weighted}) == 1:
        return 0.0  # one cost: exactly uniform (the formula below rounds to ~1e-16)
    total = sum(n for _, n in weighted)
    mean = sum(s * n for s, n in weighted) / total
    mean_sq = sum(s * s * n for s, n in weighted) / total
    if mean_sq <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - mean * mean / mean_sq))
