"""The twin as the simulator drives it: submit, advance to the wall clock, apply a setting.

``Driver`` is the subset of the twin's steppable engine (``slipstream.sim.engine.Engine``,
docs/DESIGN.md) the HTTP layer needs; ``make_driver`` builds one. Until the steppable engine
is on main, ``ReplayEngine`` stands in: it re-runs ``simulate`` over every request received
so far, replaying the setting changes at the twin times they were made. That is exact (the
twin is causal: a pass that starts before a request arrives never depends on it) but costs
one full re-simulation per batch of arrivals, so it suits tests, not hours of traffic.
"""

from __future__ import annotations

import math
from typing import Protocol

from slipstream.sim import engine, policies
from slipstream.sim.policies import EngineConfig, RoundView, Setting
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Request, build


class JobView(Protocol):
    """What the server reads of one request (``slipstream.sim.engine.Job`` has all of it)."""

    first_token_s: float
    finished_s: float
    cached: int

    def tokens_out(self, at_s: float) -> int: ...


class Driver(Protocol):
    now_s: float

    def submit(self, req: Request) -> JobView: ...
    def advance(self, until_s: float) -> None: ...
    def apply(self, setting: Setting) -> None: ...
    @property
    def waiting(self) -> int: ...
    @property
    def partials(self) -> int: ...
    @property
    def decoding(self) -> int: ...


def policy_for(setting: Setting, config: EngineConfig) -> policies.Policy:
    """The twin policy an engine started with ``setting`` runs (T = 0 is stock)."""
    name = "stock" if setting.threshold == 0 else f"{setting.mode}:{setting.threshold}"
    if setting.order != "fcfs":
        name += f"/{setting.order}"
    return policies.parse(name, config)


def make_driver(setting: Setting, profile: Profile, config: EngineConfig) -> Driver:
    """The twin engine for one simulated pod: the steppable Engine where the twin has it."""
    steppable = getattr(engine, "Engine", None)
    if steppable is None:
        return ReplayEngine(setting, profile, config)
    driven: Driver = steppable(policy_for(setting, config), profile, config)
    return driven


class ReplayJob:
    """A request's outcome as of the latest re-simulation (-1 = not known yet)."""

    __slots__ = ("req", "first_token_s", "finished_s", "cached")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.first_token_s = -1.0
        self.finished_s = -1.0
        self.cached = 0

    def tokens_out(self, at_s: float) -> int:
        """Output tokens by twin time ``at_s``, spread evenly between first and last token."""
        first, last, total = self.first_token_s, self.finished_s, max(1, self.req.output_tokens)
        if first < 0 or at_s < first:
            return 0
        if last >= 0 and at_s >= last:
            return total
        if last <= first:
            return 1
        return min(total, 1 + math.floor((total - 1) * (at_s - first) / (last - first)))


class ReplayEngine:
    """Stand-in for the steppable twin: replays everything received so far (see module doc)."""

    def __init__(self, setting: Setting, profile: Profile, config: EngineConfig) -> None:
        self.now_s = 0.0
        self._start = setting
        self._profile = profile
        self._config = config
        self._reqs: list[Request] = []
        self._jobs: dict[str, ReplayJob] = {}
        self._changes: list[tuple[float, Setting]] = []
        self._dirty = False
        policy_for(setting, config)  # refuse a bad start setting now, not on first traffic

    def submit(self, req: Request) -> ReplayJob:
        if req.arrival_s < self.now_s:
            raise ValueError(f"request {req.rid} arrives at {req.arrival_s} before now {self.now_s}")
        if req.rid in self._jobs:
            raise ValueError(f"request id {req.rid} was submitted already")
        job = ReplayJob(req)
        self._reqs.append(req)
        self._jobs[req.rid] = job
        self._dirty = True
        return job

    def apply(self, setting: Setting) -> None:
        policy_for(setting, self._config)
        self._changes.append((self.now_s, setting))
        self._dirty = True

    def advance(self, until_s: float) -> None:
        self.now_s = max(self.now_s, until_s)
        if self._dirty and self._reqs:
            self._replay()
        self._dirty = False

    def _replay(self) -> None:
        changes = list(self._changes)

        def replay_settings(view: RoundView) -> Setting | None:
            due = None
            while changes and changes[0][0] <= view.now_s:
                due = changes.pop(0)[1]
            return due

        policy = policy_for(self._start, self._config)
        policy.controller = replay_settings
        policy.interval_s = 0.0
        result = engine.simulate(build("engine-sim", self._reqs), policy, self._profile, self._config)
        for done in result.jobs:
            job = self._jobs[done.rid]
            job.first_token_s = done.first_token_s
            job.finished_s = done.finished_s
            job.cached = done.cached

    def _in_prefill(self) -> int:
        now = self.now_s
        return sum(1 for j in self._jobs.values()
                   if j.req.arrival_s <= now and not 0 <= j.first_token_s <= now)

    @property
    def waiting(self) -> int:
        return self._in_prefill() - self.partials

    @property
    def partials(self) -> int:
        """Approximation (the replay does not keep per-pass state): as many as may run."""
        setting = self._changes[-1][1] if self._changes else self._start
        room = self._config.chunked_prefill_size // setting.threshold if setting.threshold else 1
        return min(self._in_prefill(), max(1, room))

    @property
    def decoding(self) -> int:
        now = self.now_s
        return sum(1 for j in self._jobs.values() if 0 <= j.first_token_s <= now < j.finished_s)
