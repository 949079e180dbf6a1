"""``auto`` in the twin: the same tuner in the loop, seeing only what Prometheus would show.

``TwinAuto`` is a ``sim.policies.Controller``: the engine calls it every ``interval_s``
twin seconds with the first tokens since its last call (``RoundView.first_tokens``). It
keeps those of the last ``window_s`` seconds, builds the ``WorkloadSnapshot`` an operator
would read from Prometheus (``observed.snapshot_of``: SGLang's bucket bounds, no engine
internals, nothing from the future), runs ``tuner.tune_once`` and returns the new setting
on a Move, which the engine applies from the next pass on (an in-place rollout that
completes at once: the twin has no canaries).
"""

from __future__ import annotations

from collections import deque

from slipstream.api.snapshot import NO_TRAFFIC
from slipstream.sim.policies import EngineConfig, FirstToken, Policy, RoundView, Setting
from slipstream.sim.profiles import Profile
from slipstream.tune import observed
from slipstream.tune.guardrails import Decision, Hold, Move, TunerState
from slipstream.tune.tuner import TunerSettings, tune_once


class TwinAuto:
    """The tuner as the twin's controller; ``decisions`` logs every interval's outcome."""

    def __init__(self, settings: TunerSettings, profile: Profile, config: EngineConfig,
                 start: Setting, window_s: float, deployment: str = "twin") -> None:
        if window_s <= 0:
            raise ValueError(f"window must be > 0 s, got {window_s}")
        self.settings = settings
        self.profile = profile
        self.config = config
        self.window_s = window_s
        self.deployment = deployment
        self.state = TunerState(start)
        self.decisions: list[tuple[float, Decision]] = []
        self._seen: deque[FirstToken] = deque()
        self._started: float | None = None

    def __call__(self, view: RoundView) -> Setting | None:
        now = view.now_s
        if self._started is None:
            self._started = now
        self._seen.extend(view.first_tokens)
        while self._seen and self._seen[0].first_token_s <= now - self.window_s:
            self._seen.popleft()
        # A window reaching back before the first call would count the time before any
        # traffic as idle and halve the rates (as increase() over a younger series would).
        window = min(self.window_s, now - self._started)
        if window <= 0:
            self.decisions.append((now, Hold(NO_TRAFFIC, "no time observed yet")))
            return None
        snapshot = observed.snapshot_of(self.deployment, self._seen, now, window)
        decision = tune_once(snapshot, self.state, self.settings, self.profile, self.config, now)
        self.decisions.append((now, decision))
        if isinstance(decision, Move):
            guard = self.settings.guardrails
            self.state = self.state.stepped(decision.to, now, guard.dwell_cooldowns * guard.cooldown_s)
            return decision.to
        return None

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
