"""A queue-mix jump makes the tuning loop step before its timer (issue 16, item 4).

`controller.loop.step` over real HTTP (an engine's admin API on loopback, the Kubernetes
API in memory: `loop_helpers`), then `loop.until_mix_jump`, the loop's wait between steps,
on an injected clock and sleep: an observer whose engines start showing giant prompts part
way through the interval ends the wait at the first poll after the jump; a steady mix
waits out the whole interval. In the cooldown the early step may only cap harder, with a
large predicted gain (tune.guardrails). And the handler's `pause` ends when the watch fires."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from loop_helpers import Engine, Key, PodsAndConfigMaps

from slipstream.api import buckets, models, snapshot
from slipstream.controller import handlers, loop, stages, tuning
from slipstream.controller import settings as settings_

T0 = 100_000.0
JUMP_AT = T0 + 25.0


def window(now: float, giants: bool) -> snapshot.WorkloadSnapshot:
    """A valid 60 s window of 600 chat turns of 2k tokens; with `giants`, ten 350k-token
    prompts arrived too and three wait."""
    chat = snapshot.TenantWindow("chat", 10.0, snapshot.histogram_of([0.3] * 600, buckets.TTFT_BOUNDS_S),
                                 snapshot.histogram_of([2000.0] * 600, buckets.PROMPT_TOKENS))  # fmt: skip
    classes = {name: snapshot.SizeClassWindow(name) for name in buckets.SIZE_CLASS_NAMES}
    classes["le8k"] = snapshot.SizeClassWindow("le8k", 600.0, 1_200_000.0)
    if giants:
        classes["gt300k"] = snapshot.SizeClassWindow("gt300k", 7.0, 2_450_000.0, 0.0, 3.0, 1_050_000.0)
    mix = snapshot.TenantMix("chat", 10.0, tuple(classes.values()))
    return snapshot.WorkloadSnapshot("prod/kimi", now, 60.0, (chat,), queue_mix=(mix,))


class Clock:
    def __init__(self) -> None:
        self.t = T0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


class Phases:
    """The engines' metrics: chat only until `jump_at`, giants too from then."""

    def __init__(self, jump_at: float | None) -> None:
        self.jump_at = jump_at
        self.reads: list[float] = []

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snapshot.WorkloadSnapshot:
        self.reads.append(now)
        return window(now, self.jump_at is not None and now >= self.jump_at)


class Holds:
    """A recommender that never moves (counts the steps it was asked for)."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def without_twin(self, sd: Any, snap: Any, fleet: models.EngineSetting, now: float,
                     jumped: bool = False) -> tuning.Recommendation:
        self.asked.append(now)
        return tuning.Recommendation(fleet, False, "AtBest: hold")

    def recommend(self, *args: Any) -> tuning.Recommendation:
        raise AssertionError("no twin run expected")


def sd(port: int, status: dict[str, Any] | None = None, **tuning: Any) -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
        "spec": {"replicas": 1, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "port": port},
                 "tuning": {"mode": "Auto", "threshold": 0, "cooldownSeconds": 600, "intervalSeconds": 60,
                            **tuning},
                 "prometheus": {"url": "http://127.0.0.1:9090"}},
        "status": status or {},
    })  # fmt: skip


def run(jump_at: float | None, recommender: Any, status: dict[str, Any] | None = None, **tuning: Any
        ) -> tuple[bool, float, Clock, loop.StepOutcome, loop.StepOutcome]:  # fmt: skip
    """A step, the wait after it, and the next step: (fired, when the wait ended, the
    clock, the first and the second outcome)."""

    async def go() -> tuple[bool, float, Clock, loop.StepOutcome, loop.StepOutcome]:
        engine = Engine()
        port = int((await engine.start()).rsplit(":", 1)[1])
        try:
            clock = Clock()
            deps = loop.Deps(kube=PodsAndConfigMaps(port),  # type: ignore[arg-type]
                             config=settings_.ControllerSettings(engine_networks="127.0.0.0/8", mix_poll_seconds=10.0),
                             keys=Key(), observer=Phases(jump_at), recommender=recommender, clock=clock,  # type: ignore[arg-type]
                             sleep=clock.sleep)  # fmt: skip
            dep = sd(port, status, **tuning)
            memory = loop.Memory()
            first = await loop.step(deps, dep, memory)
            fired = await loop.until_mix_jump(deps, lambda: dep, memory, first.delay_s)
            ended = clock.t
            second = await loop.step(deps, dep, memory)
            return fired, ended, clock, first, second
        finally:
            await engine.runner.cleanup()

    return asyncio.run(go())


def reasons(outcome: loop.StepOutcome) -> list[str]:
    return [e.reason for e in outcome.events]


def test_a_mix_jump_makes_the_step_happen_before_the_timer() -> None:
    holds = Holds()
    fired, ended, clock, first, second = run(JUMP_AT, holds)
    assert first.delay_s == 60.0
    # Polls every 10 s: the first poll after the jump (+30 s) sees prompts larger than any
    # the reference held, which fires at once (tune.mixjump.NEW_SHARE) and ends the wait,
    # 30 s early.
    assert fired and ended == T0 + 30.0, clock.slept
    assert holds.asked == [T0, T0 + 30.0]
    assert "QueueMixChanged" in reasons(second) and "QueueMixChanged" not in reasons(first)
    event = next(e for e in second.events if e.reason == "QueueMixChanged")
    assert "gt300k" in event.message and "30 s before the timer" in event.message


class HoldsTheOtherWay(Holds):
    """Holds every step; a step a jump brought finds it going the other way (its best a
    looser cap: `tune.guardrails.other_way`)."""

    def without_twin(self, sd: Any, snap: Any, fleet: models.EngineSetting, now: float,
                     jumped: bool = False) -> tuning.Recommendation:
        self.asked.append(now)
        return tuning.Recommendation(fleet, False, "JumpNotHarder: hold", other_way=jumped)


def held_steps(jump_at: float, waits: int, holds: Holds | None = None,
               ) -> tuple[list[float], list[bool], list[loop.StepOutcome]]:  # fmt: skip
    """A step, then `waits` times the wait and the next step, all holding: (when the
    recommender was asked, whether each wait ended on a jump, every step's outcome)."""

    async def go() -> tuple[list[float], list[bool], list[loop.StepOutcome]]:
        engine = Engine()
        port = int((await engine.start()).rsplit(":", 1)[1])
        try:
            clock, recommender = Clock(), holds or Holds()
            deps = loop.Deps(kube=PodsAndConfigMaps(port),  # type: ignore[arg-type]
                             config=settings_.ControllerSettings(engine_networks="127.0.0.0/8", mix_poll_seconds=10.0),
                             keys=Key(), observer=Phases(jump_at), recommender=recommender, clock=clock,  # type: ignore[arg-type]
                             sleep=clock.sleep)  # fmt: skip
            dep, memory = sd(port), loop.Memory()
            outcomes, fired = [await loop.step(deps, dep, memory)], []
            for _ in range(waits):
                fired.append(await loop.until_mix_jump(deps, lambda: dep, memory, outcomes[-1].delay_s))
                outcomes.append(await loop.step(deps, dep, memory))
            return recommender.asked, fired, outcomes
        finally:
            await engine.runner.cleanup()

    return asyncio.run(go())


def test_a_retried_jump_steps_again_without_another_event() -> None:
    # The step the jump brought held (its window could not settle the jump), so the next
    # poll that still sees the jump brings another step (tune.mixjump.RETRIES); the jump
    # was announced once, and the retry is logged, not posted again.
    asked, fired, outcomes = held_steps(JUMP_AT, 2)
    assert asked == [T0, T0 + 30.0, T0 + 40.0] and fired == [True, True]
    assert [reasons(o).count("QueueMixChanged") for o in outcomes] == [0, 1, 0]


def test_a_jump_its_step_found_going_the_other_way_is_not_retried() -> None:
    # The jump's step held on a looser cap (the giants are gone: only the timer's step may
    # loosen, after the calm): no later look at the same jump would move, so the next wait
    # runs to the timer instead of bringing another step 10 s later.
    asked, fired, outcomes = held_steps(JUMP_AT, 2, HoldsTheOtherWay())
    assert asked == [T0, T0 + 30.0, T0 + 90.0] and fired == [True, False]
    assert [reasons(o).count("QueueMixChanged") for o in outcomes] == [0, 1, 0]


def test_a_jump_a_timer_step_saw_first_is_announced_once_at_its_first_firing(caplog: Any) -> None:
    # The giants come after the interval's last poll: the timer's step sees them first and
    # holds on its interval-long window (a jump it did not settle: the next look fires,
    # tune.mixjump), and that look comes at once, not a poll later (MixWatch.look_now): its
    # step judges the jump's own window. That firing is the jump's first announcement, so
    # its step posts the Event; the retry after that step held waits for the next poll.
    with caplog.at_level(logging.INFO, logger=loop.log.name):
        asked, fired, outcomes = held_steps(T0 + 55.0, 3)
    assert asked == [T0, T0 + 60.0, T0 + 60.0, T0 + 70.0] and fired == [False, True, True]
    assert [reasons(o).count("QueueMixChanged") for o in outcomes] == [0, 0, 1, 0]
    # The watch's turns are in the operator's log (what explains a late jump): the timer
    # step's hold grants the retry, the polls fire, the steps they brought grant more.
    turns = [r.getMessage() for r in caplog.records if "mix watch" in r.getMessage()]
    assert turns and "after a step: armed, 1 look(s) at a jump, 1 retry(ies); reference le8k 100%" in turns[0], turns
    assert any("after a poll: disarmed" in t for t in turns), turns


def test_a_steady_mix_waits_for_the_timer() -> None:
    fired, ended, clock, _, second = run(None, Holds())
    assert not fired and ended == T0 + 60.0
    assert clock.slept == [10.0] * 5 + [10.0]  # five polls, then the rest of the interval
    assert "QueueMixChanged" not in reasons(second)


def test_an_early_step_still_obeys_the_cooldown() -> None:
    # Promoted 100 s before T0, and the first step is the loop's first (an operator restarted
    # in the cooldown): the held step still gives the watch its reference, the jump fires, and
    # the cooldown (600 s) holds the early step unless it brings a harder cap with a large
    # predicted gain (tune.guardrails); maxConcurrency 1 leaves the twin no harder cap to
    # find, so its best candidate is an order at T 0, whatever it predicts.
    promoted = {"lastDecision": {"time": "1970-01-02T03:45:00Z", "to": {"threshold": 2048}, "reason": "r"},
                "rollout": {"phase": "Idle", "result": "Promoted", "finishedAt": "1970-01-02T03:45:00Z",
                            "candidate": {"threshold": 2048}}}  # fmt: skip
    twin = Recorded(stages.TwinRecommender(settings_.ControllerSettings()))
    fired, _, _, _, second = run(JUMP_AT, twin, promoted, maxConcurrency=1)
    assert fired
    assert len(twin.said) == 2 and twin.said[-1].reason.startswith("Cooldown"), twin.said
    assert "only a harder cap" in twin.said[-1].reason and twin.said[-1].judged, twin.said[-1]
    assert not twin.said[-1].move and not second.decision.in_flight and second.decision.action == "Hold"


class Recorded:
    """The operator's recommender, its answers kept."""

    def __init__(self, inner: stages.TwinRecommender) -> None:
        self.inner, self.said = inner, []  # type: ignore[var-annotated]

    def without_twin(self, *args: Any) -> tuning.Recommendation | None:
        got = self.inner.without_twin(*args)
        if got is not None:
            self.said.append(got)
        return got

    def recommend(self, *args: Any) -> tuning.Recommendation:
        self.said.append(got := self.inner.recommend(*args))
        return got


class Stopped:
    """`kopf.DaemonStopped` as `pause` uses it: `wait(delay)` returns after the delay."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def wait(self, delay: float) -> None:
        await asyncio.sleep(self.seconds)


def test_the_pause_ends_when_the_watch_fires() -> None:
    async def fires() -> bool:
        return True

    async def waits_out() -> bool:
        await asyncio.sleep(0)
        return False

    async def go() -> tuple[bool, bool, bool]:
        wake = asyncio.Event()
        early = await asyncio.wait_for(handlers.pause(Stopped(3600), wake, 3600, fires()), 30)  # type: ignore[arg-type]
        timer = await handlers.pause(Stopped(0.01), wake, 0.01, waits_out())  # type: ignore[arg-type]
        plain = await handlers.pause(Stopped(0.01), wake, 0.01)  # type: ignore[arg-type]
        return early, timer, plain

    assert asyncio.run(go()) == (True, False, False)


ANALYSING = {
    "threshold": 0, "mode": "ceiling", "schedulePolicy": "fcfs",
    "rollout": {"phase": "Analysis", "candidate": {"threshold": 0, "schedulePolicy": "srpt"},
                "baseline": {"threshold": 0, "schedulePolicy": "fcfs"}, "canaryPods": ["kimi-0"],
                "startedAt": "1970-01-02T03:46:40Z", "reason": "documents: srpt"},
}  # fmt: skip
"""An order-only candidate (chosen on the chat turns) in its analysis since T0, on the
one pod (which runs it)."""


def voided_run(rollout_poll_s: float, recommender: Any = None,
               ) -> tuple[list[float], list[loop.StepOutcome], list[dict[str, Any]]]:  # fmt: skip
    """Steps and waits as the tuning loop takes them, from T0 in the canary's analysis
    until two steps after the canary was voided: (when each step ran, the outcomes, what
    the engine was sent). The recommender holds unless one is given."""

    async def go() -> tuple[list[float], list[loop.StepOutcome], list[dict[str, Any]]]:
        engine = Engine()
        engine.info["schedule_policy"] = "srpt"
        port = int((await engine.start()).rsplit(":", 1)[1])
        try:
            clock = Clock()
            config = settings_.ControllerSettings(engine_networks="127.0.0.0/8", mix_poll_seconds=10.0,
                                                  rollout_poll_seconds=rollout_poll_s)  # fmt: skip
            deps = loop.Deps(kube=PodsAndConfigMaps(port), config=config, keys=Key(),  # type: ignore[arg-type]
                             observer=Phases(JUMP_AT), recommender=recommender or Holds(),  # type: ignore[arg-type]
                             clock=clock, sleep=clock.sleep)  # fmt: skip
            dep, memory = sd(port, ANALYSING, rollout={"analysisWindowSeconds": 300}), loop.Memory()
            at, outcomes = [], []
            while len(outcomes) < 40 and (not outcomes or "CanaryVoided" not in reasons(outcomes[-2 if len(outcomes) > 1 else -1])):
                at.append(clock.t)
                outcomes.append(await loop.step(deps, dep, memory))
                await loop.until_mix_jump(deps, lambda: dep, memory, outcomes[-1].delay_s)
            return at, outcomes, engine.sets
        finally:
            await engine.runner.cleanup()

    return asyncio.run(go())


def test_a_mix_jump_voids_a_canary_chosen_for_the_mix_before() -> None:
    # Steps every rollout poll (5 s) during the analysis; the first one after the giants
    # arrive (T0 + 25) sees them and voids the canary: the pod goes back to the fleet's
    # setting in that step, with Normal Events, and the watch steps again at its next poll
    # (the jump is retried: the voiding step held) without announcing it twice.
    at, outcomes, sent = voided_run(5.0)
    voiding = next(i for i, o in enumerate(outcomes) if "CanaryVoided" in reasons(o))
    assert at[voiding] == JUMP_AT, at
    assert reasons(outcomes[voiding]) == ["CanaryVoided", "QueueMixChanged", "RolledBack"], outcomes[voiding].events
    assert all(e.type == "Normal" for e in outcomes[voiding].events)
    voided, announced, _ = (e.message for e in outcomes[voiding].events)
    assert "le8k 100% -> le8k 26%, gt300k 74%" in voided and "schedulePolicy=srpt" in voided, voided
    assert "gt300k" in announced and "voiding the canary" in announced, announced
    assert sent == [{"long_prefill_token_threshold": 0, "long_prefill_mode": "ceiling", "schedule_policy": "fcfs"}]
    assert not outcomes[voiding].decision.in_flight and outcomes[voiding].decision.fleet.schedule_policy == "fcfs"
    assert at[voiding + 1] == JUMP_AT + 10.0 and "QueueMixChanged" not in reasons(outcomes[voiding + 1])
    assert all("CanaryVoided" not in reasons(o) for o in outcomes[:voiding])


CAP = models.EngineSetting(threshold=4096, mode="ceiling", schedule_policy="srpt")


class CapsOnJump:
    """A recommender that moves to a harder cap (`CAP`) on a step a jump brought, and holds
    otherwise; it keeps the rollout phase each step showed it."""

    def __init__(self) -> None:
        self.phases: list[tuple[float, bool, str]] = []

    def without_twin(self, sd: models.ServingDeployment, snap: Any, fleet: models.EngineSetting, now: float,
                     jumped: bool = False) -> tuning.Recommendation:  # fmt: skip
        rollout = sd.status.rollout
        self.phases.append((now, jumped, rollout.phase if rollout is not None else "-"))
        if jumped:
            return tuning.Recommendation(CAP, True, "giants: cap", gain=0.8)
        return tuning.Recommendation(fleet, False, "AtBest: hold")

    def recommend(self, *args: Any) -> tuning.Recommendation:
        raise AssertionError("no twin run expected")


def test_the_step_that_voids_a_canary_decides_on_the_new_mix() -> None:
    # The voiding step's tuner sees the canary as voided (not a rollout in flight), and its
    # harder cap skips a canary of its own: it goes to every pod in that same step, the
    # voided canary with it, and the fleet runs it when the step ends.
    caps = CapsOnJump()
    at, outcomes, sent = voided_run(5.0, caps)
    voiding = next(i for i, o in enumerate(outcomes) if "CanaryVoided" in reasons(o))
    assert at[voiding] == JUMP_AT, at
    assert (JUMP_AT, True, "Idle") in caps.phases, caps.phases
    assert all(phase == "Analysis" for t, jumped, phase in caps.phases if not jumped), caps.phases
    got = reasons(outcomes[voiding])
    assert got[:3] == ["CanaryVoided", "CanarySkipped", "QueueMixChanged"] and "ThresholdChanged" in got, got
    voided = outcomes[voiding].events[0].message
    assert "threshold=4096" in voided and "every pod" in voided and "gt300k" in voided, voided
    assert sent == [{"long_prefill_token_threshold": 4096, "long_prefill_mode": "ceiling", "schedule_policy": "srpt"}]
    decision = outcomes[voiding].decision
    assert decision.fleet == CAP and not decision.in_flight and decision.action == "Promoted", decision
    assert decision.state.result == "Promoted" and decision.state.baseline is not None
    assert decision.state.baseline.schedule_policy == "fcfs" and outcomes[voiding].patch["threshold"] == 4096
    assert outcomes[voiding].patch["lastDecision"]["to"]["threshold"] == 4096
    # The jump was answered: no retry brings another early step.
    assert "QueueMixChanged" not in reasons(outcomes[voiding + 1]) and at[voiding + 1] - at[voiding] == 60.0, at


def test_the_mix_polls_watch_a_canary_a_jump_would_void() -> None:
    # With a rollout poll longer than the mix poll, the polls during the analysis see the
    # jump first (T0 + 30) and bring the voiding step forward.
    at, outcomes, _ = voided_run(60.0)
    assert at[:2] == [T0, T0 + 30.0], at
    assert "CanaryVoided" in reasons(outcomes[1])


def test_the_event_names_the_rule_that_fired() -> None:
    from slipstream.tune import mixjump

    documents = mixjump.shares({"le60k": 1.0}, 100.0)
    watch = mixjump.MixWatch(documents, tops=(mixjump.top(documents),))
    giant = mixjump.shares({"le60k": 0.9, "gt300k": 0.1}, 100.0)
    assert giant is not None and documents is not None
    message, moved = loop.jump_message(giant, watch, "stepping now")
    assert message.startswith("the queue mix moved 0.05 from the one the last step decided on, and prompts larger "
                              "than it held carry 10% of the work (at least 5%): le60k 100% -> "), message
    assert moved == "le60k 100% -> le60k 90%, gt300k 10%" and message.endswith("; stepping now")
    chat = mixjump.shares({"le1k": 1.0}, 100.0)
    assert chat is not None
    message, _ = loop.jump_message(chat, watch, "x")
    assert message.startswith("the queue mix moved 0.50 from the one the last step decided on (at least 0.12): ")
