"""Overload is named, not tuned around (tune/overload.py): a backlog growing window after
window while the fleet serves no more than before is an overload; steady or falling
backlog, a fleet catching up, or missing data never is. Under it the tuner takes the
setting with the most prefill throughput (tune/guardrails.py `throughput_setting`), with no
twin run."""

from __future__ import annotations

import dataclasses
import math

from slipstream.api import buckets, models, snapshot
from slipstream.controller import settings as settings_
from slipstream.controller import stages
from slipstream.sim.policies import Setting
from slipstream.tune import candidates, guardrails, overload
from slipstream.tune.overload import Reading


def readings(backlog: list[float | None], served: list[float | None]) -> list[Reading]:
    return [Reading(60.0 * i, b, s) for i, (b, s) in enumerate(zip(backlog, served, strict=True))]


FLAT = [20_000.0] * 4


def test_a_backlog_growing_at_capacity_is_an_overload() -> None:
    why = overload.overloaded(readings([100e3, 200e3, 400e3, 800e3], FLAT))
    assert "100,000 to 800,000" in why and "more replicas" in why and "p99 TTFT is queueing" in why
    assert overload.overloaded(readings([0.0, 1e3, 5e3, 9e3], FLAT)), "from an empty queue too"


def test_steady_falling_or_catching_up_is_not() -> None:
    assert overload.overloaded(readings([400e3] * 4, FLAT)) == "", "steady"
    assert overload.overloaded(readings([800e3, 400e3, 200e3, 100e3], FLAT)) == "", "falling"
    assert overload.overloaded(readings([100e3, 400e3, 300e3, 800e3], FLAT)) == "", "not rising at every window"
    assert overload.overloaded(readings([100e3, 110e3, 120e3, 130e3], FLAT)) == "", "grew less than 2x"
    catching_up = [20_000.0, 24_000.0, 28_000.0, 30_000.0]
    assert overload.overloaded(readings([100e3, 200e3, 400e3, 800e3], catching_up)) == "", "spare capacity"
    assert overload.overloaded(readings([100e3, 200e3, 400e3], FLAT[:3])) == "", "three readings are two rises"


def test_missing_data_is_never_an_overload() -> None:
    assert overload.overloaded(readings([100e3, None, 400e3, 800e3], FLAT)) == ""
    assert overload.overloaded(readings([100e3, 200e3, 400e3, 800e3], [20e3, 20e3, None, 20e3])) == ""
    assert overload.reading(snapshot.invalid("prod/kimi", 1.0, 60.0, snapshot.UNREACHABLE, "down")) == Reading(1.0, None, None)
    no_mix = snapshot.WorkloadSnapshot("prod/kimi", 1.0, 60.0, mix_fallback=snapshot.NO_MIX_SERIES)
    assert overload.reading(no_mix).backlog_tokens is None
    assert overload.reading(window(math.nan)).backlog_tokens is None, "NaN is no figure"
    assert overload.overloaded([overload.reading(window(b)) for b in (1e5, 2e5, math.nan, 8e5)]) == ""


def window(backlog: float, at: float = 1.0, served: float = 1_200_000.0) -> snapshot.WorkloadSnapshot:
    classes = {name: snapshot.SizeClassWindow(name) for name in buckets.SIZE_CLASS_NAMES}
    classes["le60k"] = snapshot.SizeClassWindow("le60k", 60.0, served, 0.0, backlog / 20_000.0, backlog)
    mix = snapshot.TenantMix("docs", 1.0, tuple(classes.values()))
    ttft = snapshot.histogram_of([1.0] * 60, buckets.TTFT_BOUNDS_S)
    tenant = snapshot.TenantWindow("docs", 1.0, ttft, snapshot.histogram_of([20_000.0] * 60, buckets.PROMPT_TOKENS))
    return snapshot.WorkloadSnapshot("prod/kimi", at, 60.0, (tenant,), queue_mix=(mix,))


def test_readings_come_from_the_queue_mix_series_one_per_interval() -> None:
    r = overload.reading(window(400e3, at=60.0))
    assert (r.backlog_tokens, r.served_tokens_per_s) == (400e3, 20_000.0)
    kept = overload.remember((), r, 54.0)
    assert overload.remember(kept, overload.reading(window(500e3, at=65.0)), 54.0) == kept, "a rollout poll's step"
    for i in range(2, 8):
        kept = overload.remember(kept, overload.reading(window(100e3 * i, at=60.0 * i)), 54.0)
    assert len(kept) == overload.KEEP and kept[-1].at == 420.0


SPEC = candidates.TuningSpec(8192, 1, 1, 8)


def test_under_overload_the_tuner_takes_the_most_prefill_throughput() -> None:
    cap = Setting(2048, "ceiling", "srpt")
    assert guardrails.throughput_setting(cap, SPEC) == Setting(2048, "floor", "srpt")
    assert guardrails.throughput_setting(Setting(0, "ceiling", "fcfs"), SPEC) is None, "stock leaves none idle"
    assert guardrails.throughput_setting(Setting(2048, "floor", "srpt"), SPEC) is None
    reflex_only = candidates.TuningSpec(8192, 1, 1, 8, modes=("reflex",))
    for spec_ in (reflex_only, candidates.TuningSpec(8192, 1, 1, 8, modes=("reflex", "ceiling", "floor"))):
        # A reflex fills a capped round that refuses work (sim/admission.py): nothing to gain.
        assert guardrails.throughput_setting(Setting(4096, "reflex", "srpt"), spec_) is None
    state = guardrails.TunerState(Setting(4096, "reflex", "srpt"), overloaded="the queue grew")
    held = guardrails.under_overload(state, reflex_only)
    assert held.reason == "Overloaded" and "already leaves no prefill budget idle" in getattr(held, "message", "")
    moved = guardrails.under_overload(guardrails.TunerState(cap, overloaded="the queue grew"), SPEC)
    assert isinstance(moved, guardrails.Move) and moved.to == Setting(2048, "floor", "srpt")
    # The operator's recommender: a move without a twin run (no profile loaded), its reason
    # the overload's; then a Hold on the setting it chose.
    sd = models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
        "spec": {"replicas": 2, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 1},
                 "tuning": {"mode": "Auto", "threshold": 4096}, "prometheus": {"url": "http://127.0.0.1:9090"}},
    })  # fmt: skip
    why = overload.overloaded(readings([100e3, 200e3, 400e3, 800e3], FLAT))
    snap = dataclasses.replace(window(800e3, at=10_000.0), overload=why)
    recommender = stages.TwinRecommender(settings_.ControllerSettings(observe_min_samples=50, tuner_reuse_seconds=0))
    fleet = models.EngineSetting(threshold=4096, schedule_policy="srpt")
    rec = recommender.without_twin(sd, snap, fleet, 10_000.0)
    assert rec is not None and rec.move and rec.setting == models.EngineSetting(threshold=4096, mode="floor",
                                                                                schedule_policy="srpt")  # fmt: skip
    assert rec.reason.startswith("overloaded: the waiting queue grew") and recommender.profile is None
    held = recommender.without_twin(sd, snap, rec.setting, 10_000.0)
    assert held is not None and not held.move and held.reason.startswith("Overloaded:")
    calm = recommender.without_twin(sd, window(800e3, at=10_000.0), fleet, 10_000.0)
    assert calm is None, "no overload: the twin runs as before"
