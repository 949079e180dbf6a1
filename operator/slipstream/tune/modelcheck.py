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
class TenantCheck:
    """One tenant's p99 TTFT over the window: the twin's replay and the engines'."""

    name: str
    predicted_s: float
    observed_s: float

    @property
    def ratio(self) -> float:
        """Predicted over observed (1 is exact; 10: the twin 10x too slow)."""
        return max(self.predicted_s, 1e-3) / self.observed_s

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
        return (f"twin predicts {worst.name} p99 TTFT {worst.predicted_s:.2f} s, engines observed "
                f"{worst.observed_s:.2f} s ({worst.ratio:.2g}x; band {self.band:g}x{drawn}{waiting}{calibrated})")


def check(predicted: Mapping[str, float], observed: Mapping[str, float], band: float,
          rate_factor: float = 1.0, runs: int = 0) -> ModelCheck:
    """The tenants both sides have a finite p99 for, set side by side."""
    rows = tuple(TenantCheck(name, predicted[name], obs) for name, obs in sorted(observed.items())
                 if name in predicted and math.isfinite(predicted[name]) and math.isfinite(obs) and obs > 0)
    return ModelCheck(rows, band, rate_factor, runs)


Replay = Callable[[Workload], Mapping[str, float]]
"""A twin run of the running setting on a workload -> its per-tenant p99 TTFT (seconds)."""


def calibrated(workload: Workload, replay: Replay, first: ModelCheck, observed: Mapping[str, float],
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
