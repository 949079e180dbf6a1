"""One simulated engine pod without its HTTP layer: the twin driven by the wall clock.

Requests are submitted at the twin time they arrive; a pump task advances the twin to the
clock and releases each request's first token and completion when the twin clock reaches
them, recording the metrics a real engine records at those moments (a request whose
client left once it had tokens still counts; one still waiting is dropped, as SGLang
aborts it). A ``/set_internal_state`` change is applied to the twin between passes, so
the TTFTs that follow come from the new setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
from dataclasses import dataclass, field

from slipstream.enginesim import admin, driver, flags
from slipstream.enginesim.bodies import Incoming
from slipstream.enginesim.clock import Clock
from slipstream.enginesim.metrics import EngineMetrics
from slipstream.sim import profiles
from slipstream.sim.policies import EngineConfig, Setting
from slipstream.sim.workload import Request

log = logging.getLogger("slipstream.enginesim")


class TwinFailed(RuntimeError):
    """The twin raised; the simulated engine serves no more requests."""


MAX_TICK_S = 0.05
"""Longest wall sleep of the pump while requests are in flight (a new arrival wakes it)."""
MIN_TICK_S = 0.002


@dataclass(eq=False)
class Tracked:
    """A request in flight: its twin job and the moments its client waits for."""

    rid: str
    inc: Incoming
    labels: dict[str, str]
    arrival_s: float
    job: driver.JobView
    multiplier: float
    first: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ttft_s: float = -1.0
    e2e_s: float = -1.0
    rejected: bool = False
    """The twin refused the request (it cannot fit the KV pool): released with no tokens."""

    def shift(self) -> float:
        """Extra delay from an injected TTFT multiplier (applies to every later token too)."""
        f = self.job.first_token_s
        return (f - self.arrival_s) * (self.multiplier - 1.0) if f >= 0 else 0.0

    def tokens_at(self, now_s: float) -> int:
        """Output tokens the client may have by twin time ``now_s`` (all of them once done)."""
        if self.done.is_set():
            return self.inc.output_tokens
        if not self.first.is_set():
            return 0
        n = self.job.tokens_out(now_s - self.shift())
        return max(1, min(n, self.inc.output_tokens - 1))


def engine_config(cfg: flags.SimConfig) -> EngineConfig:
    """The twin's fixed settings from the engine flags (the twin's defaults elsewhere)."""
    base = EngineConfig()
    return dataclasses.replace(
        base,
        chunked_prefill_size=cfg.chunked_prefill_size,
        page_size=cfg.page_size,
        cache_tokens=cfg.cache_tokens if cfg.cache_tokens is not None else base.cache_tokens,
        srpt_aging_tokens_per_s=cfg.srpt_aging_tokens_per_s,
        reflex_hold_s=cfg.reflex_hold_s,
        max_partial_prefills=cfg.max_partial_prefills,
        kv_pool_tokens=cfg.max_total_tokens,
    )


class SimPod:
    """The twin, its settings, metrics and faults for one engine pod."""

    def __init__(self, cfg: flags.SimConfig, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.clock = clock or Clock(cfg.time_scale)
        self.live = admin.Live(cfg.threshold, cfg.mode, cfg.schedule_policy, cfg.max_partial_prefills,
                               cfg.reflex_hold_s)
        self.faults = admin.Faults()
        self.profile = profiles.load(cfg.profile)
        self.driver = driver.make_driver(self._setting(), self.profile, engine_config(cfg))
        self.metrics = EngineMetrics(cfg.model_name, cfg.allowed_labels)
        self.closing = asyncio.Event()
        self._pending: list[Tracked] = []
        self._wake = asyncio.Event()
        self._ids = itertools.count()
        self._pump: asyncio.Task[None] | None = None
        self.served = 0
        self.failure: str | None = None
        """Why the twin stopped (then /health is 503 and requests get 500), else None."""

    def _setting(self) -> Setting:
        return Setting(self.live.threshold, self.live.mode, self.live.schedule_policy)

    def start(self) -> None:
        self._pump = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.closing.set()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump

    def fail(self, reason: str) -> None:
        """Stop serving: every waiting client is released (and answered with an error)."""
        self.failure = reason
        for t in self._pending:
            t.first.set()
            t.done.set()
        self._pending = []

    def submit(self, inc: Incoming, labels: dict[str, str]) -> Tracked:
        """A request arriving now (twin time); TwinFailed once the twin has failed."""
        if self.failure is not None:
            raise TwinFailed(self.failure)
        now = self.clock.now()
        rid = f"{next(self._ids):08x}"
        # The twin takes arrivals from its own clock on: one arriving during a pass in
        # flight is seen when that pass ends (as the scheduler would); TTFT counts from now.
        at = max(now, self.driver.now_s)
        req = Request(rid, labels.get("tenant", ""), at, inc.prompt_tokens, inc.output_tokens,
                      inc.blocks, inc.block_sizes, inc.warm_blocks)
        job = self.driver.submit(req)
        self.metrics.arrived(labels)
        tracked = Tracked(rid, inc, labels, now, job, self.ttft_multiplier())
        self._pending.append(tracked)
        self._wake.set()
        return tracked

    def ttft_multiplier(self) -> float:
        """The injected TTFT multiplier for a request arriving now (`Faults`)."""
        f = self.faults
        at = f.ttft_multiplier_at_threshold
        return f.ttft_multiplier if at is None or at == self.live.threshold else 1.0

    def abort(self, tracked: Tracked) -> bool:
        """The client went away before its first token: drop the request if the twin has
        not given it any tokens yet (as SGLang aborts it); True if it was dropped."""
        if tracked.first.is_set() or not self.driver.abort(tracked.rid):
            return False
        self._pending.remove(tracked)
        self.metrics.aborted(tracked.labels)
        return True

    def set_state(self, updates: dict[str, object]) -> str | None:
        """/set_internal_state: the refusal's reason, or None once applied to the twin."""
        live, reason = admin.apply_updates(self.live, updates, self.cfg.chunked_prefill_size,
                                           self.cfg.page_size, self.cfg.sglang_version)
        if reason is None:
            d = self.driver
            d.advance(self.clock.now())
            self.live = live
            d.apply(self._setting())
            # The partials cap is an engine setting the twin reads every pass.
            d.config = dataclasses.replace(d.config, max_partial_prefills=live.max_partial_prefills,
                                           reflex_hold_s=live.reflex_hold_s)
            self._wake.set()
        return reason

    def scrape(self) -> bytes:
        d = self.driver
        d.advance(self.clock.now())
        pool = d.kv_pool_tokens
        usage = d.kv_in_use / pool if pool else 0.0
        self.metrics.scheduler(d.decoding, d.waiting, d.partials, self.live.threshold,
                               self.live.mode, self.live.schedule_policy, self.live.max_partial_prefills,
                               usage)
        self.metrics.rounds(d.long_rounds, d.capped_rounds)
        labels = {t.rid: t.labels for t in self._pending}
        self.metrics.queue_mix([(labels[rid], size) for rid, size in d.unserved() if rid in labels])
        return self.metrics.exposition()

    def step(self) -> float:
        """Advance the twin to now; release what is due; the twin time of the next thing due."""
        now = self.clock.now()
        self.driver.advance(now)
        due = math.inf
        still: list[Tracked] = []
        for t in self._pending:
            job = t.job
            if not t.first.is_set():
                if job.rejected:
                    t.rejected = True
                    t.first.set()
                    t.done.set()
                    continue
                if job.first_token_s < 0:
                    still.append(t)
                    continue
                at = job.first_token_s + t.shift()
                if at > now:
                    due = min(due, at)
                    still.append(t)
                    continue
                t.ttft_s = at - t.arrival_s
                self.metrics.late(now - at)
                self.metrics.first_token(t.labels, t.inc.stream, t.ttft_s, t.inc.prompt_tokens, job.cached)
                t.first.set()
            if job.finished_s >= 0 and job.finished_s + t.shift() <= now:
                t.e2e_s = job.finished_s + t.shift() - t.arrival_s
                self.metrics.late(now - (job.finished_s + t.shift()))
                self.metrics.finished(t.labels, t.inc.stream, t.inc.prompt_tokens, job.cached,
                                      t.inc.output_tokens, t.e2e_s)
                self.served += 1
                t.done.set()
                continue
            if job.finished_s >= 0:
                due = min(due, job.finished_s + t.shift())
            still.append(t)
        self._pending = still
        if self.driver.now_s > now:
            due = min(due, self.driver.now_s)
        return due

    async def _run(self) -> None:
        while True:
            try:
                due = self.step()
            except Exception as exc:  # a twin bug must not leave clients waiting forever
                log.exception("engine-sim: the twin failed; refusing requests from now on")
                self.fail(f"the simulated engine failed: {type(exc).__name__}: {exc}")
                return
            if self._pending:
                wait = MAX_TICK_S if math.isinf(due) else self.clock.wall_until(due)
                wait = min(MAX_TICK_S, max(MIN_TICK_S, wait))
            else:
                wait = None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    @property
    def in_flight(self) -> int:
        return len(self._pending)
