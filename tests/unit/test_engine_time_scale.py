"""The tuner reads time-scaled engine simulators on their own clock.

`slipstream cluster up --time-scale 8` runs the engine simulators 8 engine seconds per wall
second: their TTFT histograms are in engine seconds, but Prometheus rates are per wall
second, 8 times the engine-time rate. Seen by a user walking through docs/operator.md: the
twin predicted a chat p99 TTFT of 221 s where the engines measured 9.6 s. The operator now
divides the rates by SLIPSTREAM_ENGINE_TIME_SCALE before the twin runs.
"""

from __future__ import annotations

from dataclasses import replace

from test_tune import heterogeneous
from test_tuning_step import S, make

from slipstream.controller import settings as settings_
from slipstream.controller import stages

SCALE = 8.0


def as_prometheus_sees_it(snap, scale):
    """What a Prometheus scraping engines run `scale` times faster reports: rates per wall
    second (x scale) over a window of wall seconds (/ scale); counts and TTFTs unchanged."""
    tenants = tuple(replace(t, requests_per_s=t.requests_per_s * scale) for t in snap.tenants)
    return replace(snap, tenants=tenants, window_s=snap.window_s / scale)


def test_in_engine_time_divides_rates_and_stretches_the_window():
    snap = heterogeneous()
    wall = as_prometheus_sees_it(snap, SCALE)
    back = stages.in_engine_time(wall, SCALE)
    assert [t.requests_per_s for t in back.tenants] == [t.requests_per_s for t in snap.tenants]
    assert back.window_s == snap.window_s
    assert back.tenants[0].ttft == snap.tenants[0].ttft and back.requests == snap.requests
    assert stages.in_engine_time(snap, 1.0) is snap, "real engines: nothing changes"


def test_the_recommender_predicts_the_same_for_a_time_scaled_engine():
    sd = make({"mode": "Auto", "threshold": 0, "cooldownSeconds": 600})
    plain = settings_.ControllerSettings(tuning_time_scale=0.1, observe_min_samples=50)
    scaled = replace(plain, engine_time_scale=SCALE)
    snap, wall = heterogeneous(), as_prometheus_sees_it(heterogeneous(), SCALE)

    expected = stages.TwinRecommender(plain).recommend(sd, snap, S(threshold=0), 1000.0)
    got = stages.TwinRecommender(scaled).recommend(sd, wall, S(threshold=0), 1000.0)
    assert (got.setting, got.reason) == (expected.setting, expected.reason)
    # read on the wall clock, the same traffic looks 8 times as dense to the twin
    unscaled = stages.TwinRecommender(plain).recommend(sd, wall, S(threshold=0), 1000.0)
    assert unscaled.reason != expected.reason


def test_cluster_up_tells_the_operator_the_simulators_time_scale():
    from slipstream.localkube import stack

    class Options:  # what operator_env reads of a Stack, without starting one
        time_scale = SCALE
        operator_env: dict[str, str] = {}

    class Cluster:
        pod_cidr = "127.9.0.0/16"

    class Fake:
        options, cluster = Options(), Cluster()

    env = stack.Stack.operator_env(Fake())  # type: ignore[arg-type]
    assert float(env["SLIPSTREAM_ENGINE_TIME_SCALE"]) == SCALE
    assert float(env["SLIPSTREAM_TUNING_TIME_SCALE"]) * SCALE == 1.0
