"""The model check: the twin must explain the present before its "what if" is believed.

Before the candidates are compared, the twin replays the window under the RUNNING setting
(the recommender's calibration run) and its per-tenant p99 TTFT is set beside what the
engines reported for the same window (the snapshot's TTFT histograms). The replay's p99
counts the window as the engines did (``tune.recommend.window_p99``): over the requests
that got a first token, a tail the replay rounded up to one request (one giant in a minute
over two engines is half a giant per engine) at its true share, or its own prefill would
be the replay's p99, and a request still waiting not at all. They must agree
within ``band`` (a factor, either way) for every tenant with enough first tokens to have
a p99 (``calibration_min_samples``); the worst tenant decides.

The observed side is a range, not a point (``Observed``, ``rank_range``): the engines'
p99 over a window's ~100 first tokens is the 99th of them, and whether one giant is 1.1%
or 0.9% of a window moves it from the bulk's bucket (under a second) to the giant's (ten
seconds and more). A replay holding the giant at its true share lands on either side of
that edge by chance, so the prediction is set against the observed quantiles one standard
deviation of the rank either side of the 99th (at least one request: for 100 requests,
the 98th and the last), and its distance from the nearer end is what the band bounds.
For example a window of 98.6 chat first tokens, 1.1 of them giants: observed p99 10.8 s,
98th percentile 0.91 s; a correct replay, the giant at its share, 0.81 s: it agrees.

When they do not, other draws of the same window are tried first (``tune.recommend``,
``checked``): the window says how many requests of each size came, not when, and one
giant drawn late in a replay delays nothing that the engines saw it delay; and when
requests wait now, a draw that counts them (a giant still prefilling delays requests that
already have their first token). The draw closest to the observation is kept.

Then, still outside the band, the offered load is calibrated: the replay's arrivals are made denser or
sparser (``Workload.scaled``) by factors of 2 in the direction the error points (the twin
too slow: sparser), at most ``max_runs`` twin runs of the running setting, keeping the
factor that brings the worst tenant closest; the check is made again on it. The rate is
what a window misjudges most: first tokens are counted when a prefill finishes, so under
a backlog they undercount the arrivals and over a backlog's drain they overcount them.

Still outside the band: the twin does not explain what the engines show, and a
comparison of candidates on it would be a guess; the tuner holds (``MODEL_MISMATCH``).

Why a factor of 4 by default (reasoned, not yet measured). The check must pass a correct
model, and the observed p99 is read from TTFT buckets 1.5-2.5x apart, resting on a window's
last few requests: a correct model can miss by about one bucket. A factor of 4 leaves room
for that and still catches the misses that matter: a model off by 2x to 200x (a p99 of
minutes predicted against seconds observed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slipstream.sim.workload import Workload

MODEL_MISMATCH = "ModelMismatch"
"""The reason of the Hold, and of ``MetricsAvailable=False``, when the twin disagrees."""


@dataclass(frozen=True, slots=True)
class Observed:
    """A tenant's observed p99 TTFT and the range its rank's sampling noise spans
    (``rank_range``): the p99 of a window's 100 requests is its 99th, and one giant more or
    less among them moves it from the bulk's bucket to the giant's."""

    p99_s: float
    low_s: float
    high_s: float

    @classmethod
    def exact(cls, p99_s: float) -> Observed:
        return cls(p99_s, p99_s, p99_s)


def rank_range(n: float, q: float = 0.99) -> tuple[float, float]:
    """The quantiles (low, high) one standard deviation of the count above the q-th
    quantile on either side of it, at least one request: a binomial count of the n
    requests above it, sd sqrt(n q (1 - q)). For 100 requests: the 98th and the last."""
    if n <= 0:
        return q, q
    slack = max(1.0, math.sqrt(n * q * (1 - q)))
    return max(0.0, (q * n - slack) / n), min(1.0, (q * n + slack) / n)


@dataclass(frozen=True, slots=True)
class TenantCheck:
    """One tenant's p99 TTFT over the window: the twin's replay and the engines'."""

    name: str
    predicted_s: float
    observed_s: float
    observed_low_s: float = math.nan
    """The low end of the observed p99's rank range (``Observed``; NaN: the p99 itself)."""
    observed_high_s: float = math.nan
    """The high end of it (NaN: the p99 itself)."""

    @property
    def ratio(self) -> float:
        """Predicted over the nearest end of the observed p99's rank range (1 inside it;
        10: the twin 10x too slow)."""
        predicted = max(self.predicted_s, 1e-3)
        low = self.observed_low_s if math.isfinite(self.observed_low_s) else self.observed_s
        high = self.observed_high_s if math.isfinite(self.observed_high_s) else self.observed_s
        if predicted < low:
            return predicted / max(low, 1e-3)
        if predicted > high:
            return predicted / high
        return 1.0

    @property
    def error(self) -> float:
        """|log(ratio)|: the factor of disagreement, either way, on a log scale."""
        return abs(math.log(self.ratio))


@dataclass(frozen=True, slots=True)
class ModelCheck:
    """The check's outcome: every checked tenant, the band, and what calibration did."""

    tenants: tuple[TenantCheck, ...]
    band: float
    """Factor within which prediction and observation agree (0 or inf: no check)."""
    rate_factor: float = 1.0
    """Density of the replay's arrivals against the synthesised ones (1: not calibrated)."""
    runs: int = 0
    """Twin runs the calibration spent (0 when the first check agreed)."""
    draws: int = 0
    """Other draws of the window tried before the calibration (0 when the first agreed)."""
    waiting: bool = False
    """The replay kept counts the requests waiting now."""

    @property
    def worst(self) -> TenantCheck | None:
        return max(self.tenants, key=lambda t: t.error, default=None)

    @property
    def agrees(self) -> bool:
        """True when the band is off, no tenant could be checked, or the worst is inside."""
        worst = self.worst
        if not self.band or not math.isfinite(self.band) or worst is None:
            return True
        return worst.error <= math.log(self.band)

    def describe(self) -> str:
        """``twin predicts chat p99 TTFT 31.20 s, engines observed 2.40 s (13x; band 4x, ...)``."""
        worst = self.worst
        if worst is None:
            return "no tenant had enough first tokens to check the twin against"
        drawn = f", closest of {self.draws + 1} draws" if self.draws else ""
        waiting = ", with the requests waiting now" if self.waiting else ""
        calibrated = f", arrivals x{self.rate_factor:g} after {self.runs} calibration run(s)" if self.runs else ""
        spread = ""
        if math.isfinite(worst.observed_low_s) and math.isfinite(worst.observed_high_s) and (
                worst.observed_low_s < worst.observed_high_s):
            spread = f" (its rank's range {worst.observed_low_s:.2f}-{worst.observed_high_s:.2f} s)"
        return (f"twin predicts {worst.name} p99 TTFT {worst.predicted_s:.2f} s, engines observed "
                f"{worst.observed_s:.2f} s{spread} ({worst.ratio:.2g}x; band {self.band:g}x{drawn}{waiting}{calibrated})")


def check(predicted: Mapping[str, float], observed: Mapping[str, float | Observed], band: float,
          rate_factor: float = 1.0, runs: int = 0) -> ModelCheck:
    """The tenants both sides have a finite p99 for, set side by side (a bare float
    observed: a p99 with no rank range)."""
    rows = []
    for name, value in sorted(observed.items()):
        obs = value if isinstance(value, Observed) else Observed.exact(value)
        if name in predicted and math.isfinite(predicted[name]) and math.isfinite(obs.p99_s) and obs.p99_s > 0:
            rows.append(TenantCheck(name, predicted[name], obs.p99_s, obs.low_s, obs.high_s))
    return ModelCheck(tuple(rows), band, rate_factor, runs)


Replay = Callable[[Workload], Mapping[str, float]]
"""A twin run of the running setting on a workload -> its per-tenant p99 TTFT (seconds)."""


def calibrated(workload: Workload, replay: Replay, first: ModelCheck, observed: Mapping[str, float | Observed],
               max_runs: int = 3) -> tuple[float, ModelCheck]:
    """(rate factor, the check on it) after fitting the offered load (module doc); the
    first check itself when it agrees or cannot be improved."""
    worst = first.worst
    if first.agrees or worst is None or max_runs <= 0:
        return 1.0, first
    step = 0.5 if worst.ratio > 1 else 2.0
    best_factor, best = 1.0, first
    factor, runs = 1.0, 0
    while runs < max_runs:
        factor *= step
        runs += 1
        got = check(replay(workload.scaled(factor)), observed, first.band, factor, runs)
        if got.worst is None or best.worst is None or not got.worst.error < best.worst.error:
            break
        best_factor, best = factor, got
        if best.agrees:
            break
    return best_factor, ModelCheck(best.tenants, first.band, best_factor, runs, first.draws, first.waiting)
