"""Deciding on little data (tune/pooling.py): the window a step judges is the interval,
doubled while it holds too few samples, never past the last change of the fleet's setting
nor 16 intervals; a jump's step counts the requests waiting too and widens only up to the
interval. The same rule in the guardrails' gate and in the operator's loop (the ranges it
reads)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from slipstream.api import buckets, models, snapshot
from slipstream.controller import loop
from slipstream.controller import settings as settings_
from slipstream.sim.policies import Setting
from slipstream.tune import guardrails, pooling


def test_the_ladder_doubles_up_to_sixteen_intervals_and_never_past_the_last_change() -> None:
    assert pooling.ladder(60.0, 10_000.0, None) == (60.0, 120.0, 240.0, 480.0, 960.0)
    assert pooling.ladder(60.0, 10_000.0, 10_000.0 - 300.0) == (60.0, 120.0, 240.0), "a window must see one setting"
    assert pooling.ladder(60.0, 10_000.0, 10_000.0 - 240.0) == (60.0, 120.0, 240.0)
    assert pooling.ladder(60.0, 10_000.0, 10_000.0 - 10.0) == (60.0,), "the interval's own window is always read"
    assert pooling.ladder(60.0, 10_000.0, None, max_s=200.0) == (60.0, 120.0)
    with pytest.raises(ValueError):
        pooling.ladder(0.0, 1.0, None)
    # A jump's window widens up to the interval only (its traffic is the jump's).
    assert pooling.jump_ladder(30.0, 60.0, 1000.0, 0.0) == (30.0, 60.0)
    assert pooling.jump_ladder(30.0, 60.0, 1000.0, 1000.0 - 40.0) == (30.0,)
    assert pooling.jump_ladder(20.0, 60.0, 1000.0, None) == (20.0, 40.0, 60.0)


def test_the_first_window_with_enough_samples_is_judged() -> None:
    assert pooling.choose([26, 47, 90], 50) == 2
    assert pooling.choose([60, 120], 50) == 0
    assert pooling.choose([10, 20], 50) == -1
    # From first-token times: 30 a minute, steadily, for 10 minutes.
    times = [i * 2.0 for i in range(300)]
    now = 600.0
    assert pooling.pick(pooling.ladder(60.0, now, None), times, now, 50) == (120.0, True)
    assert pooling.pick(pooling.ladder(60.0, now, now - 100.0), times, now, 50) == (60.0, False)
    # A jump's step counts the requests waiting now.
    assert pooling.pick((30.0, 60.0), times, now, 20, waiting=8) == (30.0, True)
    assert pooling.pick((30.0, 60.0), times, now, 20, waiting=0) == (60.0, True)


def window(first_tokens: float, window_s: float = 60.0, waiting: float = 0.0,
           invalid: str | None = None) -> snapshot.WorkloadSnapshot:
    """A deployment's window: ``first_tokens`` 20K-token documents, ``waiting`` giants."""
    ttft = snapshot.histogram_of([1.0] * int(first_tokens), buckets.TTFT_BOUNDS_S)
    tokens = snapshot.histogram_of([20_000.0] * int(first_tokens), buckets.PROMPT_TOKENS)
    classes = {name: snapshot.SizeClassWindow(name) for name in buckets.SIZE_CLASS_NAMES}
    classes["le60k"] = snapshot.SizeClassWindow("le60k", first_tokens, 20_000.0 * first_tokens)
    classes["le300k"] = snapshot.SizeClassWindow("le300k", 0.0, 0.0, 0.0, waiting, 250_000.0 * waiting)
    mix = snapshot.TenantMix("docs", first_tokens / window_s, tuple(classes.values()))
    tenant = snapshot.TenantWindow("docs", first_tokens / window_s, ttft, tokens)
    return snapshot.WorkloadSnapshot("prod/kimi", 1000.0, window_s, (tenant,), tokens, queue_mix=(mix,),
                                     invalid=invalid, extra={"requests": first_tokens})  # fmt: skip


def test_the_gate_counts_first_tokens_and_on_a_jump_the_requests_waiting() -> None:
    guard = guardrails.GuardrailSettings(min_samples=50)
    state = guardrails.TunerState(Setting(0, "ceiling", "fcfs"))
    held = guardrails.gate(window(26), state, guard, 1000.0)
    assert held is not None and held.reason == "TooFewSamples" and "26 first tokens in the 60 s window" in held.message
    assert guardrails.gate(window(60, 120.0), state, guard, 1000.0) is None, "a pooled window of 60 decides"
    jumped = guardrails.TunerState(Setting(0, "ceiling", "fcfs"), mix_jumped=True)
    # 14 first tokens in the jump's 30 s and 7 giants waiting: the queue shows the change.
    assert guard.jump_min_samples == 20
    assert guardrails.gate(window(14, 30.0, waiting=7), jumped, guard, 1000.0) is None
    short = guardrails.gate(window(14, 30.0, waiting=2), jumped, guard, 1000.0)
    assert short is not None and short.reason == "TooFewSamples" and "requests waiting" in short.message
    assert pooling.evidence(window(14, 30.0, waiting=7), jumped=False) == 14


class ByWindow:
    """Prometheus for one low-rate deployment: 20 first tokens a minute, as observe
    assembles them (TooFewSamples below 50), and the ranges it was asked for."""

    def __init__(self, per_minute: float = 20.0, waiting: float = 0.0) -> None:
        self.per_minute, self.waiting = per_minute, waiting
        self.ranges: list[float] = []

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snapshot.WorkloadSnapshot:
        self.ranges.append(window_s)
        n = self.per_minute * window_s / 60.0
        return window(n, window_s, self.waiting, None if n >= (min_samples or 50) else "TooFewSamples")


def sd(status: dict[str, Any] | None = None) -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
        "spec": {"replicas": 1, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192},
                 "tuning": {"mode": "Auto", "threshold": 0, "intervalSeconds": 60},
                 "prometheus": {"url": "http://127.0.0.1:9090"}},
        "status": status or {},
    })  # fmt: skip


def read(source: ByWindow, dep: models.ServingDeployment, jumped: bool = False,
         first_look: float = 0.0) -> snapshot.WorkloadSnapshot:
    deps = loop.Deps(kube=None, config=settings_.ControllerSettings(observe_min_samples=50, mix_poll_seconds=10.0),  # type: ignore[arg-type]
                     keys=None, observer=source)  # type: ignore[arg-type]
    memory = loop.Memory(first_look=first_look)
    return asyncio.run(loop.read_pooled(deps, dep, 10_000.0, jumped, memory.since(dep, 10_000.0)))


def test_the_operator_reads_wider_ranges_until_one_holds_enough() -> None:
    source = ByWindow()
    got = read(source, sd())
    assert source.ranges == [60.0, 120.0, 240.0]
    assert got.valid and got.window_s == 240.0 and got.requests == 80
    # The last change 150 s ago: the 240 s range would see two settings; held, and it says why.
    source = ByWindow()
    recent = sd({"lastDecision": {"time": "1970-01-01T02:44:10Z", "from": {"threshold": 0},
                                  "to": {"threshold": 4096}, "reason": "r"}})  # fmt: skip
    got = read(source, recent)
    assert source.ranges == [60.0, 120.0]
    assert got.invalid == "TooFewSamples" and "widened from 60 s" in got.detail
    # Never before the loop's first look (the series' start, as far as the loop knows).
    source = ByWindow()
    read(source, sd(), first_look=10_000.0 - 130.0)
    assert source.ranges == [60.0, 120.0]


def test_a_jump_step_on_a_low_rate_deployment_decides_on_the_queue_it_sees() -> None:
    source = ByWindow(waiting=10.0)
    got = read(source, sd(), jumped=True)
    assert source.ranges == [30.0], "10 first tokens and 10 giants waiting: the jump's own window holds enough"
    assert got.valid and got.window_s == 30.0
    source = ByWindow(waiting=1.0)
    got = read(source, sd(), jumped=True)
    assert source.ranges == [30.0, 60.0], "widened up to the interval, no further"
    assert got.valid and got.window_s == 60.0
