"""The twin as the simulator drives it: submit, advance to the wall clock, apply a setting.

``Driver`` is the part of the twin's steppable engine (``slipstream.sim.engine.Engine``)
the HTTP layer uses, so the server depends on that surface only; ``make_driver`` builds
the engine for one simulated pod from the setting it starts with.
"""

from __future__ import annotations

from typing import Protocol

from slipstream.sim import engine, policies
from slipstream.sim.policies import EngineConfig, Setting
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Request


class JobView(Protocol):
    """What the server reads of one request (``slipstream.sim.engine.Job``)."""

    first_token_s: float
    finished_s: float
    cached: int
    rejected: bool

    def tokens_out(self, at_s: float) -> int: ...


class Driver(Protocol):
    now_s: float
    decoding: int
    config: EngineConfig
    kv_pool_tokens: int | None
    long_rounds: int
    """Prefill passes of the patch's long-prefill path so far; ``capped_rounds`` of them
    under the cap T (``sglang:long_prefill_rounds_total``)."""
    capped_rounds: int

    def submit(self, req: Request) -> JobView: ...
    def advance(self, until_s: float) -> None: ...
    def apply(self, setting: Setting) -> None: ...
    def abort(self, rid: str) -> bool: ...
    def partial_needs(self) -> list[tuple[str, int]]: ...
    def unserved(self) -> list[tuple[str, int]]: ...
    @property
    def waiting(self) -> int: ...
    @property
    def partials(self) -> int: ...
    @property
    def kv_in_use(self) -> int: ...


def policy_for(setting: Setting, config: EngineConfig) -> policies.Policy:
    """The twin policy an engine started with ``setting`` runs (T = 0 is stock)."""
    name = "stock" if setting.threshold == 0 else f"{setting.mode}:{setting.threshold}"
    if setting.order != "fcfs":
        name += f"/{setting.order}"
    return policies.parse(name, config)


def make_driver(setting: Setting, profile: Profile, config: EngineConfig) -> Driver:
    """The twin engine for one simulated pod."""
    return engine.Engine(policy_for(setting, config), profile, config)
