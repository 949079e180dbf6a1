"""``auto`` in the twin: the same tuner in the loop, seeing only what Prometheus would show.

``TwinAuto`` is a ``sim.policies.Controller``: the engine calls it every ``call_s`` twin
seconds with the first tokens since its last call (``RoundView.first_tokens``). It keeps
those of the last ``window_s`` seconds (up to 16 windows of them: a window that holds too
few first tokens is widened under ``tune.pooling``'s rule, as the operator's loop widens
the range it reads), builds the ``WorkloadSnapshot`` an operator would
read from Prometheus (``observed.snapshot_of``: SGLang's bucket bounds, no engine
internals, nothing from the future), runs ``tuner.tune_once`` and returns the new setting
on a Move, which the engine applies from the next pass on.

The timing is the operator's (``controller/loop.py``, ``rollout/machine.py``):

- a step every ``interval_s``, or earlier when the queue mix jumps (``mix_poll_s`` > 0:
  every poll judges the mix of the window's first tokens and the waiting requests, by
  size class, as the engines' size-class series show it; ``tune.mixjump``);
- a Move goes to the engine at once (the twin's one engine is the canary) and the rollout
  stays in flight for ``analysis_s`` (the canary's analysis window; the analysis itself is
  taken to pass): the tuner holds meanwhile, and its cooldown runs from the promotion
  (``tune.deployment.last_step_at``), not from the decision;
- a mix jump while a rollout that does not cap harder is in flight voids it
  (``rollout.machine.voidable``): the cooldown runs from then, the candidate is not tried
  again for ``max(cooldown, analysis)`` (the machine's ``retry_after_s``), and the jump's
  step comes at once, on the rollout as voided: it moves (a harder cap) or the engine goes
  back to the setting before the rollout, as the operator's voiding step does;
- the twin runs again only when it must (``reuse_s`` > 0: the tuner memo, ``tune.memo``,
  as the operator's ``tuner_reuse_seconds``): a step whose workload has not moved beyond
  sampling noise, under the same setting, within the last run's lifetime (``reuse_s``
  less up to a third), reuses that run's recommendation, and the guardrails judge the
  fresh snapshot with it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from slipstream.api import buckets
from slipstream.api.snapshot import NO_TRAFFIC
from slipstream.sim.policies import EngineConfig, FirstToken, Policy, RoundView, Setting
from slipstream.sim.profiles import Profile
from slipstream.tune import mixjump, observed, pooling
from slipstream.tune.candidates import concurrency
from slipstream.tune.guardrails import Decision, Hold, Move, TunerState, settles
from slipstream.tune.memo import Memo
from slipstream.tune.recommend import window_heterogeneity
from slipstream.tune.tuner import TunerSettings, tune_once


class TwinAuto:
    """The tuner as the twin's controller; ``decisions`` logs every interval's outcome."""

    def __init__(self, settings: TunerSettings, profile: Profile, config: EngineConfig,
                 start: Setting, window_s: float, deployment: str = "twin", *,
                 interval_s: float | None = None, analysis_s: float = 0.0, mix_poll_s: float = 0.0,
                 reuse_s: float = 0.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window must be > 0 s, got {window_s}")
        if analysis_s < 0 or mix_poll_s < 0 or reuse_s < 0:
            raise ValueError(f"analysis, mix poll and reuse must be >= 0 s, got {analysis_s}, "
                             f"{mix_poll_s} and {reuse_s}")
        self.settings = settings
        self.profile = profile
        self.config = config
        self.window_s = window_s
        self.deployment = deployment
        self.interval_s = interval_s if interval_s is not None else settings.guardrails.interval_s
        self.analysis_s = analysis_s
        self.mix_poll_s = mix_poll_s
        self.state = TunerState(start)
        self.decisions: list[tuple[float, Decision]] = []
        self.early_steps = 0
        """Steps taken before their timer because the queue mix jumped."""
        self._seen: deque[FirstToken] = deque()
        self._started: float | None = None
        self._next_step: float | None = None
        self._rollout: tuple[float, Setting] | None = None
        """(when it promotes, the setting) of the rollout in flight."""
        self._blocked: tuple[Setting, float] | None = None
        """A voided candidate and until when it is not tried again."""
        self.voided = 0
        """Rollouts a mix jump voided."""
        self._watch = mixjump.MixWatch()
        self.memo = Memo(max_age_s=reuse_s) if reuse_s > 0 else None
        """The last twin run and its fingerprint (``tune.memo``); None: a twin run every step."""

    @property
    def call_s(self) -> float:
        """Twin seconds between the engine's calls: the mix polls', else the interval."""
        return min(self.mix_poll_s, self.interval_s) if self.mix_poll_s > 0 else self.interval_s

    def __call__(self, view: RoundView) -> Setting | None:
        now = view.now_s
        if self._started is None:
            self._started = self._next_step = now
        self._seen.extend(view.first_tokens)
        while self._seen and self._seen[0].first_token_s <= now - pooling.MAX_FACTOR * self.window_s:
            self._seen.popleft()
        self._promote(now)
        assert self._next_step is not None
        due = now >= self._next_step - 1e-9
        jumped = voided = False
        if not due and self.mix_poll_s > 0 and (self._rollout is None or self._voidable()):
            mix = self._mix(view)
            self._watch, jumped = self._watch.see(mix)
            if jumped and self._rollout is not None:
                self._void(now)
                voided = True
            self.early_steps += jumped
            due = jumped
        if not due:
            return None
        setting = self._step_now(view, now, jumped)
        if setting is None and not jumped and self._rollout is None and self._watch.look_now:
            # The timer's step saw a jump and held on its long window (tune.mixjump).
            self._watch, jumped = self._watch.see(self._mix(view))
            self.early_steps += jumped
            setting = self._step_now(view, now, True) if jumped else None
        # A void puts the engine back on the setting before the rollout, unless this same
        # step moved on from it.
        return setting if setting is not None or not voided else self.state.current

    def _step_now(self, view: RoundView, now: float, jumped: bool) -> Setting | None:
        """One step of the tuner at ``now`` (``jumped``: the queue mix brought it forward):
        the setting it moves to, or None."""
        assert self._started is not None  # set by the first call
        self._next_step = now + self.interval_s
        # A window reaching back before the first call would count the time before any
        # traffic as idle and halve the rates (as increase() over a younger series would).
        window = min(self.window_s, now - self._started)
        if window <= 0:
            self.decisions.append((now, Hold(NO_TRAFFIC, "no time observed yet")))
            return None
        waiting = float(len(view.waiting_needs) + len(view.partial_sizes))
        window = self._pooled(now, window, jumped, waiting)
        snapshot = replace(observed.snapshot_of(self.deployment, self._seen, now, window), queue_depth=waiting)
        decision = tune_once(snapshot, replace(self.state, mix_jumped=jumped), self.settings, self.profile,
                             self.config, now, self.memo)
        self.state = self.state.saw(window_heterogeneity(snapshot, self.profile, self.settings.spec.chunked_prefill_size),
                                    now, self.settings.guardrails)
        self.decisions.append((now, decision))
        if self.mix_poll_s > 0:
            settled = settles(decision, self.settings.spec.chunked_prefill_size)
            self._watch = self._watch.stepped(self._mix(view), decision.recommendation is not None, settled, jumped)
        if isinstance(decision, Move) and self._blocked is not None and decision.to == self._blocked[0] \
                and now < self._blocked[1]:
            self.decisions[-1] = (now, Hold("RolledBack", "the candidate was voided; not tried again yet",
                                            decision.recommendation))  # fmt: skip
            return None
        if isinstance(decision, Move):
            if self.analysis_s > 0:
                self._rollout = (now + self.analysis_s, decision.to)
                self.state = replace(self.state, rollout_in_progress=True)
            else:
                self._step(decision.to, now)
            return decision.to
        return None

    def _pooled(self, now: float, window: float, jumped: bool, waiting: float) -> float:
        """The window this step judges (``tune.pooling``): the interval's, doubled while it
        holds fewer than the floor, never past the last change of the engine's setting (or
        the first call) nor 16 windows; a jump's own window (``tune.mixjump``) widens up to
        the interval's only, counting the requests waiting now."""
        assert self._started is not None
        since = max(self._started, self.state.last_step_at if self.state.last_step_at is not None else self._started)
        guard = self.settings.guardrails
        if jumped:  # the traffic since the jump (tune.mixjump), as the operator judges it
            windows = pooling.jump_ladder(mixjump.window_s(self.mix_poll_s, window), window, now, since)
            need, extra = min(guard.min_samples, guard.jump_min_samples), waiting
        else:
            windows, need, extra = pooling.ladder(window, now, since), guard.min_samples, 0.0
        return pooling.pick(windows, (f.first_token_s for f in self._seen), now, need, extra)[0]

    def _voidable(self) -> bool:
        """Whether a mix jump voids the rollout in flight: it does not cap harder than the
        setting before it (``rollout.machine.voidable``'s rule, which the tune stage may not
        import; tests/unit/test_rollout_machine.py checks that the two agree)."""
        assert self._rollout is not None
        c = self.config.chunked_prefill_size
        return concurrency(self._rollout[1], c) <= concurrency(self.state.current, c)

    def _void(self, now: float) -> None:
        """The rollout in flight voided by a mix jump: over, as a rollback at ``now`` (the
        cooldown runs from here, the candidate is not tried again for a while); the step
        the jump brings comes at once and decides on the new mix, as the operator's
        voiding step does (``rollout.machine``: a harder cap goes out in that step)."""
        assert self._rollout is not None
        _, candidate = self._rollout
        self._rollout = None
        guard = self.settings.guardrails
        self._blocked = (candidate, now + max(guard.cooldown_s, self.analysis_s))
        self.state = replace(self.state, rollout_in_progress=False, last_step_at=now)
        self.voided += 1

    def _promote(self, now: float) -> None:
        """The rollout in flight promotes once its analysis window has passed."""
        if self._rollout is not None and now >= self._rollout[0] - 1e-9:
            at, to = self._rollout
            self._rollout = None
            self._step(to, at)

    def _step(self, to: Setting, at: float) -> None:
        guard = self.settings.guardrails
        self.state = self.state.stepped(to, at, guard.dwell_cooldowns * guard.cooldown_s)

    def _mix(self, view: RoundView) -> mixjump.Mix | None:
        """The queue mix the size-class series would show now: the uncached tokens of the
        last interval's first tokens and of the requests with no first token yet (waiting
        or part-prefilled: what the engine simulator's queue gauges count), by size class."""
        work: dict[str, float] = {}
        since = view.now_s - self.interval_s  # the operator's mix is one interval's
        needs = [float(f.uncached_tokens) for f in self._seen if f.first_token_s > since]
        needs += [float(n) for n in view.waiting_needs + view.partial_sizes]
        for tokens in needs:
            name = buckets.size_class(tokens)
            work[name] = work.get(name, 0.0) + tokens
        return mixjump.shares(work, len(needs))

    def moves(self) -> list[tuple[float, Move]]:
        return [(t, d) for t, d in self.decisions if isinstance(d, Move)]

    def held(self) -> dict[str, int]:
        """How many decisions stayed, by reason (Cooldown, BelowMargin, Dwell, ...)."""
        counts: dict[str, int] = {}
        for _, d in self.decisions:
            if not isinstance(d, Move):
                counts[d.reason] = counts.get(d.reason, 0) + 1
        return dict(sorted(counts.items()))


def start_setting(policy: Policy) -> Setting:
    """The setting an ``auto[:T][/ORDER]`` policy starts from (off/fcfs for plain ``auto``)."""
    return Setting(policy.rule.threshold, policy.rule.mode, policy.order)
