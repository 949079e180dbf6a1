"""The robust choice (tune/robust.py) and its use in the recommender and the guardrails."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_tune import OFF, PROFILE, SPEC, heterogeneous

from slipstream.sim.policies import Setting
from slipstream.tune import guardrails, recommend, robust
from slipstream.tune.candidates import preference
from slipstream.tune.guardrails import GuardrailSettings, Hold, Move, TunerState

STOCK = OFF
CAP = Setting(4096, "ceiling", "srpt")
OTHER = Setting(2730, "floor", "srpt")
GUARD = GuardrailSettings(min_samples=50, min_gain=0.2, min_gain_abs=0.5, cooldown_s=600, interval_s=60)


def prefer(s: Setting) -> tuple[int, int, int]:
    return preference(s, SPEC.chunked_prefill_size)


def test_the_cap_wins_when_a_minority_of_draws_has_giants():
    # Worst-tenant p99 slowdown on three draws of one window: two without giants (the cap
    # costs 5%), one with them (no cap costs 10x). The point estimate on the first draw
    # picks stock; the worst regret picks the cap.
    figures = {STOCK: [1.0, 1.0, 20.0], CAP: [1.05, 1.05, 2.0]}
    point = min(figures, key=lambda s: figures[s][0])
    assert point == STOCK
    chosen, scored = robust.choose(figures, prefer)
    assert chosen.candidate == CAP
    by = {s.candidate: s for s in scored}
    assert by[STOCK].regrets == (1.0, 1.0, 10.0) and by[STOCK].score == 10.0
    assert by[CAP].regrets == pytest.approx((1.05, 1.05, 1.0)) and by[CAP].score == pytest.approx(1.05)
    assert robust.gain(chosen, by[STOCK]) == pytest.approx(1 - 1.05 / 10.0)
    # Stock is preferred on a tie (least concurrency): it loses here on the loss alone.
    assert prefer(STOCK) < prefer(CAP)


def test_no_draw_with_giants_keeps_the_preferred_setting():
    figures = {STOCK: [1.0, 1.0, 1.0], CAP: [1.03, 1.04, 1.0]}
    chosen, scored = robust.choose(figures, prefer)
    assert chosen.candidate == STOCK
    by = {s.candidate: s for s in scored}
    assert robust.gain(by[CAP], by[STOCK]) < 0  # the cap would have cost, never gained


def test_draws_that_disagree_with_no_clear_gain_hold():
    # OTHER beats the current setting by 30% on one draw and loses by 30% on the other:
    # the two score the same, so the robust gain is nil and the guardrails hold, though
    # the point estimate on the first draw shows a gain of 30%.
    figures = {CAP: [10.0, 7.0], OTHER: [7.0, 10.0]}
    chosen, scored = robust.choose(figures, prefer)
    by = {s.candidate: s for s in scored}
    assert by[CAP].score == pytest.approx(by[OTHER].score)
    assert abs(robust.gain(by[OTHER], by[CAP])) < 1e-9
    rec = recommend.recommend(heterogeneous(under=CAP), CAP, SPEC, PROFILE)
    point = replace(rec, best=replace(rec.best, setting=OTHER, worst_tenant_slowdown_p99=7.0),
                    current=replace(rec.current, worst_tenant_slowdown_p99=10.0),
                    predictions=(), resample_gain=math.nan)
    assert point.gain == pytest.approx(0.3)
    assert isinstance(guardrails.decide(heterogeneous(under=CAP), point, TunerState(CAP), SPEC, GUARD, 1000.0), Move)
    held = replace(point, resample_gain=robust.gain(by[OTHER], by[CAP]))
    d = guardrails.decide(heterogeneous(under=CAP), held, TunerState(CAP), SPEC, GUARD, 1000.0)
    assert isinstance(d, Hold) and d.reason == guardrails.NOT_ON_RESAMPLE


def test_an_upper_quantile_below_the_worst_ignores_the_one_bad_draw():
    figures = {STOCK: [1.0, 1.0, 1.0, 20.0], CAP: [1.05, 1.05, 1.05, 2.0]}
    assert robust.choose(figures, prefer, quantile=1.0)[0].candidate == CAP
    assert robust.choose(figures, prefer, quantile=0.75)[0].candidate == STOCK
    with pytest.raises(ValueError, match="quantile"):
        robust.score(figures, quantile=0.0)


def test_regrets_of_unfinished_runs_and_empty_draws():
    got = robust.regrets({STOCK: [math.inf, 0.0], CAP: [2.0, 0.0]})
    assert got[STOCK] == (math.inf, 1.0) and got[CAP] == (1.0, 1.0)  # an all-zero draw tells nothing
    with pytest.raises(ValueError, match="every draw"):
        robust.regrets({STOCK: [1.0], CAP: [1.0, 2.0]})
    inf, fin = robust.Scored(STOCK, (math.inf,), math.inf), robust.Scored(CAP, (1.0,), 1.0)
    assert robust.gain(fin, inf) == 1.0 and robust.gain(inf, inf) == 0.0
    with pytest.raises(ValueError, match="eligible"):
        robust.choose({STOCK: [1.0]}, prefer, eligible=lambda s: False)


def test_an_ineligible_current_setting_is_scored_not_chosen():
    figures = {STOCK: [1.0, 1.0], CAP: [1.5, 1.2]}
    chosen, scored = robust.choose(figures, prefer, eligible=lambda s: s != STOCK)
    assert chosen.candidate == CAP and {s.candidate for s in scored} == {STOCK, CAP}
    assert chosen.regrets == pytest.approx((1.5, 1.2))  # regret relative to every run


def test_the_resamples_burst_sizes_are_the_fits_neighbours():
    ladder = (1, 2, 4, 8, 16, 32)
    assert recommend.draw_bursts(4, ladder, 2) == [8, 2]
    assert recommend.draw_bursts(4, ladder, 4) == [8, 2, 16, 1]
    assert recommend.draw_bursts(1, ladder, 2) == [2, 1]  # no neighbour below: the fit's own
    assert recommend.draw_bursts(32, ladder, 1) == [64]
    assert recommend.draw_bursts(1, (1,), 2) == [2, 1]


def test_the_recommender_chooses_by_the_worst_regret_over_its_draws():
    settings = recommend.RecommenderSettings()
    rec = recommend.recommend(heterogeneous(), STOCK, SPEC, PROFILE, settings=settings)
    by = {s.candidate: s for s in rec.regrets}
    assert STOCK in by and rec.best.setting in by
    assert 2 <= len(by) <= settings.robust_top + 2  # the top few, the point choice, the current
    assert all(len(s.regrets) == 1 + settings.robust_draws for s in rec.regrets)
    admitted = {p.setting for p in recommend.eligible(rec.confirmed)}
    least = min(s.score for s in rec.regrets if s.candidate in admitted)
    assert by[rec.best.setting].score <= least * (1 + settings.tie_tolerance)
    assert rec.resample_gain == pytest.approx(robust.gain(by[rec.best.setting], by[STOCK]))
    assert rec.kept().regrets == rec.regrets  # the guardrails' and the memo's view keeps them
    # Off: the point choice on the confirming sample, nothing resampled.
    point = recommend.recommend(heterogeneous(), STOCK, SPEC, PROFILE,
                                settings=replace(settings, robust_draws=0))
    assert point.regrets == () and math.isnan(point.resample_gain)
    chosen, _ = recommend.choose(point.confirmed, settings, SPEC.chunked_prefill_size)
    assert point.best == chosen
    with pytest.raises(ValueError, match="robust_draws"):
        recommend.RecommenderSettings(robust_draws=-1)
