"""tune.memo: the twin re-runs only when the workload moved, the setting changed, or the
last run is too old; the guardrails still judge every snapshot."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from test_tune import OFF, PROFILE, SPEC, heterogeneous, uniform

from slipstream.sim.policies import Setting
from slipstream.tune import guardrails, memo, recommend, tuner
from slipstream.tune.candidates import concurrency
from slipstream.tune.guardrails import GuardrailSettings, Move, TunerState

SETTINGS = tuner.TunerSettings(spec=SPEC, guardrails=GuardrailSettings(min_samples=20, cooldown_s=0, interval_s=1))


@pytest.fixture
def twin_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every twin run (recommend.recommend call), by deployment."""
    runs: list[str] = []
    real = recommend.recommend

    def counted(snapshot, *args, **kwargs):  # type: ignore[no-untyped-def]
        runs.append(snapshot.deployment)
        return real(snapshot, *args, **kwargs)

    monkeypatch.setattr(recommend, "recommend", counted)
    return runs


def scaled(snap, rate_factor: float):  # type: ignore[no-untyped-def]
    tenants = tuple(dataclasses.replace(t, requests_per_s=t.requests_per_s * rate_factor) for t in snap.tenants)
    return dataclasses.replace(snap, tenants=tenants)


def test_an_unmoved_workload_reuses_the_twin_run_and_decides_the_same(twin_runs: list[str]) -> None:
    m = memo.Memo(max_age_s=600)
    state = TunerState(current=OFF)
    first = tuner.tune_once(heterogeneous(), state, SETTINGS, PROFILE, None, 1000.0, m)
    # The next interval: 1% more traffic is within the twin's resolution.
    again = tuner.tune_once(scaled(heterogeneous(), 1.01), state, SETTINGS, PROFILE, None, 1060.0, m)
    assert twin_runs == ["ns/sd"] and (m.runs, m.reused) == (1, 1)
    assert again == first
    assert again == tuner.tune_once(heterogeneous(), state, SETTINGS, PROFILE, None, 1060.0)  # no memo: same answer


def test_a_moved_workload_a_new_setting_or_an_old_run_runs_the_twin_again(twin_runs: list[str]) -> None:
    m = memo.Memo(max_age_s=600)
    state = TunerState(current=OFF)
    tuner.tune_once(heterogeneous(), state, SETTINGS, PROFILE, None, 1000.0, m)
    tuner.tune_once(scaled(heterogeneous(), 1.3), state, SETTINGS, PROFILE, None, 1060.0, m)  # traffic +30%
    tuner.tune_once(scaled(heterogeneous(), 1.3), TunerState(current=Setting(2048, "ceiling", "srpt")),
                    SETTINGS, PROFILE, None, 1120.0, m)  # fmt: skip
    tuner.tune_once(scaled(heterogeneous(), 1.3), TunerState(current=Setting(2048, "ceiling", "srpt")),
                    SETTINGS, PROFILE, None, 1120.0 + 600, m)  # too old
    assert len(twin_runs) == 4 and m.reused == 0


def test_deployments_never_share_a_run_and_held_snapshots_run_nothing(twin_runs: list[str]) -> None:
    m = memo.Memo(max_age_s=600)
    other = dataclasses.replace(heterogeneous(), deployment="ns/other")
    tuner.tune_once(heterogeneous(), TunerState(current=OFF), SETTINGS, PROFILE, None, 1000.0, m)
    tuner.tune_once(other, TunerState(current=OFF), SETTINGS, PROFILE, None, 1000.0, m)
    held = tuner.tune_once(heterogeneous(), TunerState(current=OFF, rollout_in_progress=True), SETTINGS, PROFILE,
                           None, 1010.0, m)  # fmt: skip
    assert held.reason == "RolloutInProgress"
    assert twin_runs == ["ns/sd", "ns/other"] and m.reused == 0


def test_zero_max_age_never_reuses() -> None:
    m = memo.Memo(max_age_s=0)
    seen = memo.fingerprint(heterogeneous(), 20)
    m.put("a", ("k",), seen, 1.0, "rec")
    assert m.get("a", ("k",), seen, 1.0) is None


def test_fingerprint_resolution() -> None:
    snap = heterogeneous()
    seen = memo.fingerprint(snap, 20)
    assert memo.fingerprint(scaled(snap, 1.05), 20).close_to(seen)
    assert not memo.fingerprint(scaled(snap, 1.3), 20).close_to(seen)
    fewer = dataclasses.replace(snap, tenants=snap.tenants[:2])
    assert not memo.fingerprint(fewer, 20).close_to(seen)
    # A slow drift is measured from the snapshot the twin ran on: +5% twice is +10%, a re-run
    # (chat's rate rests on 900 first tokens: its noise is 2/sqrt(900) = 6.7%).
    assert not memo.fingerprint(scaled(scaled(snap, 1.05), 1.05), 20).close_to(seen)


def test_a_rate_measured_on_few_requests_tolerates_its_noise() -> None:
    snap = heterogeneous()
    seen = memo.fingerprint(snap, 20)
    docs = [dataclasses.replace(t, requests_per_s=t.requests_per_s * 1.3) if t.name == "docs" else t
            for t in snap.tenants]  # 12 first tokens: +30% is noise
    chat = [dataclasses.replace(t, requests_per_s=t.requests_per_s * 1.3) if t.name == "chat" else t
            for t in snap.tenants]  # 900 first tokens: +30% is a change
    assert memo.fingerprint(dataclasses.replace(snap, tenants=tuple(docs)), 20).close_to(seen)
    assert not memo.fingerprint(dataclasses.replace(snap, tenants=tuple(chat)), 20).close_to(seen)


# -- the split the controller uses: without_twin on its event loop, with_twin on its pool ----


def test_without_twin_reuses_or_holds_but_never_runs_the_twin(twin_runs: list[str]) -> None:
    m = memo.Memo(max_age_s=600)
    state = TunerState(current=OFF)
    assert tuner.without_twin(heterogeneous(), state, SETTINGS, PROFILE, None, 1000.0, m) is None, "nothing to reuse"
    held = tuner.without_twin(heterogeneous(), TunerState(current=OFF, rollout_in_progress=True), SETTINGS,
                              PROFILE, None, 1000.0, m)  # fmt: skip
    assert held is not None and held.reason == "RolloutInProgress" and held.recommendation is None
    ran = tuner.with_twin(heterogeneous(), state, SETTINGS, PROFILE, None, 1000.0, m)
    assert twin_runs == ["ns/sd"] and (m.runs, m.reused) == (1, 0)
    reused = tuner.without_twin(scaled(heterogeneous(), 1.01), state, SETTINGS, PROFILE, None, 1060.0, m)
    assert reused == ran and twin_runs == ["ns/sd"] and m.reused == 1
    # moved, another setting, no profile loaded yet, no memo: the twin must run (None)
    assert tuner.without_twin(scaled(heterogeneous(), 1.3), state, SETTINGS, PROFILE, None, 1060.0, m) is None
    assert tuner.without_twin(heterogeneous(), TunerState(current=Setting(2048, "ceiling", "srpt")), SETTINGS,
                              PROFILE, None, 1060.0, m) is None  # fmt: skip
    assert tuner.without_twin(heterogeneous(), state, SETTINGS, None, None, 1060.0, m) is None
    assert tuner.without_twin(heterogeneous(), state, SETTINGS, PROFILE, None, 1060.0) is None
    assert twin_runs == ["ns/sd"]


def test_a_reused_decision_equals_the_computed_one_for_the_same_inputs(twin_runs: list[str]) -> None:
    m = memo.Memo(max_age_s=600)
    state = TunerState(current=OFF)
    first = tuner.with_twin(heterogeneous(), state, SETTINGS, PROFILE, None, 1000.0, m)
    assert first.kind == "Move"
    # Later intervals, judged afresh by the guardrails with the reused predictions exactly as
    # a twin run's would be: as before; a step 0.5 s ago (the gate's Interval); a margin the
    # gain does not clear (BelowMargin, after the twin); the best setting left 10 s ago
    # (Dwell, from the state's memory, which the memo's key does not hold).
    assert isinstance(first, Move)
    strict = dataclasses.replace(SETTINGS, guardrails=dataclasses.replace(SETTINGS.guardrails, min_gain=100.0))
    dwelling = dataclasses.replace(SETTINGS, guardrails=dataclasses.replace(SETTINGS.guardrails, cooldown_s=100.0))
    left = TunerState(current=OFF, left=((first.to, 1050.0),))
    kinds = []
    for later, settings in ((state, SETTINGS), (TunerState(current=OFF, last_step_at=1059.5), SETTINGS),
                            (state, strict), (left, dwelling)):  # fmt: skip
        reused = tuner.without_twin(heterogeneous(), later, settings, PROFILE, None, 1060.0, m)
        computed = tuner.with_twin(heterogeneous(), later, settings, PROFILE, None, 1060.0)
        assert reused is not None and reused == computed == tuner.tune_once(heterogeneous(), later, settings,
                                                                            PROFILE, None, 1060.0)  # fmt: skip
        kinds.append(reused.reason if reused.kind == "Hold" else reused.kind)
    assert kinds == ["Move", "Interval", "BelowMargin", "Dwell"]
    # the memo was read 3 times (the gate's hold reads none); the twin ran for the comparisons only
    assert m.reused == 3 and len(twin_runs) == 1 + 3 * 2


def test_with_twin_always_runs_the_twin_and_stores_it(twin_runs: list[str]) -> None:
    m = memo.Memo(max_age_s=600)
    state = TunerState(current=OFF)
    tuner.with_twin(heterogeneous(), state, SETTINGS, PROFILE, None, 1000.0, m)
    tuner.with_twin(heterogeneous(), state, SETTINGS, PROFILE, None, 1060.0, m)
    assert twin_runs == ["ns/sd", "ns/sd"] and (m.runs, m.reused) == (2, 0)
    assert m.entries["ns/sd"].made == 1060.0, "the newest run is the one kept"


def test_runs_made_together_expire_spread_out_never_after_max_age() -> None:
    """The first round after a start makes a fleet's runs within a minute or two; had they
    all expired max_age_s later, hundreds of twin runs would queue at once (the ~600 s wave
    at 500 deployments in CHANGELOG.md). Each entry's lifetime is max_age_s less up
    to ``jitter`` of it, spread by deployment and time made, and never longer."""
    m = memo.Memo(max_age_s=600)
    seen = memo.fingerprint(heterogeneous(), 20)
    for i in range(500):
        m.put(f"ns/sd-{i}", ("k",), seen, 1000.0 + 0.24 * i, "rec")  # 500 runs in two minutes
    spread = m.jitter * 600
    ages = sorted(e.expires - e.made for e in m.entries.values())
    assert 600 - spread <= ages[0] and ages[-1] <= 600
    assert ages[-1] - ages[0] > 0.9 * spread, "lifetimes spread over the jitter's range"

    def busiest(expiries: list[float]) -> int:
        return max(sum(1 for x in expiries if t <= x < t + 30) for t in expiries)

    together = busiest([e.made + 600 for e in m.entries.values()])  # 125: 500 runs over 120 s
    jittered = busiest([e.expires for e in m.entries.values()])
    # Uniform draws: at most 500 / spread expiries a second (the sum's plateau), plus noise.
    assert jittered <= 1.2 * 30 * 500 / spread < together, (jittered, together)
    # Each entry is reused up to its own expiry, not after; the same inputs, the same lifetime.
    name, entry = next(iter(m.entries.items()))
    assert m.get(name, ("k",), seen, entry.expires - 0.001) == "rec"
    assert m.get(name, ("k",), seen, entry.expires) is None
    assert memo.lifetime(name, entry.made, 600, m.jitter) == entry.expires - entry.made
    assert memo.lifetime(name, entry.made + 600, 600, m.jitter) != entry.expires - entry.made, "each round a new draw"


def test_what_a_decision_keeps_of_a_run_decides_the_same_and_is_a_fraction_of_it() -> None:
    """The memo keeps a run per deployment between intervals: only what the guardrails and
    the controller read of it (``Ranking.kept``), which gives every figure they read
    and the same decision under each guardrail as the whole run."""
    full = recommend.recommend(heterogeneous(), OFF, SPEC, PROFILE, None, SETTINGS.recommender)
    kept = full.kept()
    assert len(full.predictions) > 5 and len(kept.predictions) <= 2
    # Of the confirming shortlist, only the candidates the resamples scored (the step back's).
    assert {p.setting for p in kept.confirmed} <= {s.candidate for s in full.regrets}
    assert len(kept.confirmed) < len(full.confirmed)
    for figure in ("gain", "screen_gain", "gain_spread", "gain_abs"):
        assert getattr(kept, figure) == getattr(full, figure), figure
    assert (kept.best, kept.current, kept.heterogeneity, kept.feasible, kept.reason) == (
        full.best, full.current, full.heterogeneity, full.feasible, full.reason)
    for state in (TunerState(current=OFF), TunerState(current=OFF, last_step_at=990.0),
                  TunerState(current=OFF, left=((full.best.setting, 900.0),))):
        a = guardrails.decide(heterogeneous(), full, state, SPEC, SETTINGS.guardrails, 1000.0)
        b = guardrails.decide(heterogeneous(), kept, state, SPEC, SETTINGS.guardrails, 1000.0)
        assert (type(a), a.reason) == (type(b), b.reason)
    assert deep_size(kept) < deep_size(full) / 2, (deep_size(kept), deep_size(full))
    # Near-uniform traffic under a cap: the step back reads the kept figures the same.
    busy = full.best.setting
    calm = recommend.recommend(uniform(), busy, SPEC, PROFILE, None, SETTINGS.recommender)
    a = guardrails.decide(uniform(), calm, TunerState(current=busy), SPEC, SETTINGS.guardrails, 1000.0)
    b = guardrails.decide(uniform(), calm.kept(), TunerState(current=busy), SPEC, SETTINGS.guardrails, 1000.0)
    assert isinstance(a, Move) and (type(a), a.to, a.reason) == (type(b), b.to, b.reason)


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of ``obj`` and everything it holds (each object once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (type, type(None))):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        return size + sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(deep_size(v, seen) for v in obj)
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields:
        return size + sum(deep_size(getattr(obj, f), seen) for f in fields)
    return size


# -- a step the queue mix brought forward ranks ceilings only (tuner.JUMP_MODES) ------------


def test_a_step_the_mix_brought_forward_ranks_ceilings_only_and_never_reuses_a_timer_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    modes: list[tuple[str, ...]] = []
    real = recommend.recommend

    def seen(snapshot, current, spec, profile, config, settings):  # type: ignore[no-untyped-def]
        modes.append(settings.modes)
        return real(snapshot, current, spec, profile, config, settings)

    monkeypatch.setattr(recommend, "recommend", seen)
    m = memo.Memo(max_age_s=600)
    timer = tuner.tune_once(heterogeneous(), TunerState(current=OFF), SETTINGS, PROFILE, None, 1000.0, m)
    jumped = tuner.tune_once(heterogeneous(), TunerState(current=OFF, mix_jumped=True), SETTINGS, PROFILE, None,
                             1000.0, m)  # fmt: skip
    # The same workload a moment later: the timer's run is not reused for the jump's step.
    assert modes == [("ceiling", "floor", "reflex"), ("ceiling", "reflex")], modes  # the spec keeps ceiling, floor
    assert timer.recommendation is not None and jumped.recommendation is not None
    assert jumped.recommendation.best.setting.mode == "ceiling", jumped.recommendation.best.setting
    # Its own run is reused by the next jump step on the same workload.
    tuner.tune_once(heterogeneous(), TunerState(current=OFF, mix_jumped=True), SETTINGS, PROFILE, None, 1060.0, m)
    assert len(modes) == 2, modes


def test_a_jump_step_ranks_only_the_harder_caps_it_may_move_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step the queue mix brought forward may move only to a harder cap (JumpNotHarder), so
    from one prefill at a time it ranks only the caps, beside the current setting and the
    baseline: a best it may not take would hold it while the giants queue. The timer's
    step, and a jump step from a cap (a jump going the other way must still find its looser
    best: guardrails.other_way), rank the whole spec."""
    ranked: list[recommend.Ranking] = []
    real = recommend.recommend

    def seen(snapshot, current, spec, profile, config, settings):  # type: ignore[no-untyped-def]
        ranked.append(real(snapshot, current, spec, profile, config, settings))
        return ranked[-1]

    monkeypatch.setattr(recommend, "recommend", seen)
    c = SPEC.chunked_prefill_size
    jumped = tuner.tune_once(heterogeneous(), TunerState(current=OFF, mix_jumped=True), SETTINGS, PROFILE, None, 1000.0)
    others = {p.setting for p in ranked[-1].predictions} - {OFF, recommend.BASELINE}
    assert others and all(concurrency(s, c) > concurrency(OFF, c) for s in others), others
    assert isinstance(jumped, Move) and concurrency(jumped.to, c) > 1
    tuner.tune_once(heterogeneous(), TunerState(current=OFF), SETTINGS, PROFILE, None, 1000.0)
    assert any(concurrency(p.setting, c) == 1 and p.setting != OFF for p in ranked[-1].predictions)
    top = Setting(c // SPEC.max_concurrency, "ceiling", "srpt")
    assert concurrency(top, c) == SPEC.max_concurrency
    assert tuner.ranked_spec(TunerState(current=top, mix_jumped=True), SPEC) == SPEC
    capped = Setting(c // 2, "ceiling", "srpt")
    assert tuner.ranked_spec(TunerState(current=capped, mix_jumped=True), SPEC) == SPEC
    assert tuner.ranked_spec(TunerState(current=Setting(0, "ceiling", "srpt"), mix_jumped=True), SPEC).min_concurrency == 2
    assert tuner.ranked_spec(TunerState(current=OFF, mix_jumped=True), SPEC).min_concurrency == 2
    assert tuner.ranked_spec(TunerState(current=OFF), SPEC) == SPEC
