"""One control interval of the tuner: gate, recommend, decide (the controller's one call).

``tune_once`` is what the operator's controller and the twin's ``auto`` both call each
interval, so the closed loop in a cluster and in the twin run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from slipstream.api.snapshot import WorkloadSnapshot
from slipstream.sim.policies import EngineConfig
from slipstream.sim.profiles import Profile
from slipstream.tune import guardrails, recommend
from slipstream.tune.candidates import TuningSpec, concurrency
from slipstream.tune.guardrails import Decision, GuardrailSettings, TunerState
from slipstream.tune.memo import Memo, fingerprint
from slipstream.tune.recommend import RecommenderSettings


@dataclass(frozen=True, slots=True)
class TunerSettings:
    """Everything the tuner needs besides the snapshot and its state."""

    spec: TuningSpec = field(default_factory=TuningSpec)
    guardrails: GuardrailSettings = field(default_factory=GuardrailSettings)
    recommender: RecommenderSettings = field(default_factory=RecommenderSettings)


JUMP_MODES = ("ceiling", "reflex")
"""The modes a step the queue mix brought forward may choose (``TunerState.mix_jumped``).
Its window is the short one since the jump: it holds the first few of the larger prompts
that fired it, too few to tell the modes apart. A floor gives the partial prefills a pass's
idle budget, which on such a window reads as a gain; over the phase it lets the giants take
the passes the short requests behind them wait for. The ceiling bounds what they take, the
safe side of the unequal costs (tune.guardrails: a jump moves only to a harder cap). The
timer's step, on a full window, may refine the mode. A reflex spec tunes the reflex alone
(``candidates.modes_for``), so its jump steps rank it."""


def for_step(state: TunerState, settings: TunerSettings) -> TunerSettings:
    """The settings this step's twin run is made under: on a step the mix brought forward,
    only the ceiling modes (`JUMP_MODES`); a reused run must have been made the same way,
    so the memo's key (the recommender's settings) tells the two apart. The bounds a jump
    step ranks within are narrowed apart, by `ranked_spec`, because only the ranking may be
    narrowed: the guardrails judge the step against the whole spec."""
    if not state.mix_jumped:
        return settings
    modes = tuple(m for m in settings.recommender.modes if m in JUMP_MODES) or settings.recommender.modes
    return replace(settings, recommender=replace(settings.recommender, modes=modes))


def ranked_spec(state: TunerState, spec: TuningSpec) -> TuningSpec:
    """The bounds the twin ranks candidates within: the spec's, except on a step the queue
    mix brought forward while the fleet runs one prefill at a time and the spec allows a
    cap: then only the caps (beside the current setting and the baseline, which every
    ranking runs). Such a step may move only to a harder cap (``tune.guardrails``,
    JumpNotHarder), and a best it may not take (another order alone, which can rank first
    on a window holding only the first giant) would hold it while the giants queue, until
    a retry or the timer. Ranking what it may do finds the best cap; the guardrails still
    ask it to gain enough. Only from one prefill at a time: there is no looser setting for
    the jump to be going towards, while from a cap a jump may be the giants going, and the
    whole spec is ranked so that its looser best shows (``guardrails.other_way``) and the
    jump is settled rather than retried."""
    uncapped = concurrency(state.current, spec.chunked_prefill_size) == 1
    if not (state.mix_jumped and uncapped and spec.max_concurrency >= 2):
        return spec
    return replace(spec, min_concurrency=max(spec.min_concurrency, 2))


def without_twin(snapshot: WorkloadSnapshot, state: TunerState, settings: TunerSettings,
                 profile: Profile | None, config: EngineConfig | None, now: float,
                 memo: Memo | None = None) -> Decision | None:
    """This interval's decision when it needs no twin run: a guardrail holds beforehand,
    or ``memo`` has the twin's run for this workload (not moved, same key, young enough);
    the guardrails then judge this snapshot with the reused recommendation. None: the twin
    must run (``with_twin``). Cheap (no simulation), so the controller calls it on its
    event loop and sends only real twin runs to its tuner pool. Without a memo or a
    profile (not loaded yet) only the gate is checked."""
    held = guardrails.gate(snapshot, state, settings.guardrails, now)
    if held is not None:
        return held
    if state.overloaded:  # no twin run: a backlog makes its p99 predictions meaningless
        return guardrails.under_overload(state, settings.spec)
    if memo is None or profile is None:
        return None
    settings = for_step(state, settings)
    rec = memo.get(snapshot.deployment, _key(state, settings, profile, config),
                   fingerprint(snapshot, settings.recommender.calibration_min_samples), now)
    if rec is None:
        return None
    return guardrails.decide(snapshot, rec, state, settings.spec, settings.guardrails, now)


def with_twin(snapshot: WorkloadSnapshot, state: TunerState, settings: TunerSettings,
              profile: Profile, config: EngineConfig | None, now: float,
              memo: Memo | None = None) -> Decision:
    """This interval's decision with a fresh twin run (unless a guardrail holds beforehand),
    stored in ``memo`` for later intervals; never reads the memo. CPU-bound (~0.2-0.8 s)."""
    held = guardrails.gate(snapshot, state, settings.guardrails, now)
    if held is not None:
        return held
    if state.overloaded:
        return guardrails.under_overload(state, settings.spec)
    settings = for_step(state, settings)
    # Kept whole only until judged: a decision carries what the guardrails read
    # (`Ranking.kept`), the same whether it was computed now or reused later.
    rec = recommend.recommend(snapshot, state.current, ranked_spec(state, settings.spec), profile, config,
                              settings.recommender).kept()
    if memo is not None:
        memo.put(snapshot.deployment, _key(state, settings, profile, config),
                 fingerprint(snapshot, settings.recommender.calibration_min_samples), now, rec)
    return guardrails.decide(snapshot, rec, state, settings.spec, settings.guardrails, now)


def tune_once(snapshot: WorkloadSnapshot, state: TunerState, settings: TunerSettings,
              profile: Profile, config: EngineConfig | None, now: float,
              memo: Memo | None = None) -> Decision:
    """This interval's decision; the twin runs only when no guardrail holds beforehand and,
    with a ``memo``, only when the workload moved since its last run (``tune.memo``).
    ``without_twin`` then ``with_twin``: the same decision as calling them apart."""
    decided = without_twin(snapshot, state, settings, profile, config, now, memo)
    if decided is not None:
        return decided
    return with_twin(snapshot, state, settings, profile, config, now, memo)


def _key(state: TunerState, settings: TunerSettings, profile: Profile,
         config: EngineConfig | None) -> tuple[object, ...]:
    """What a reused run must have been made under, equal: the setting, the bounds it
    ranked within (``ranked_spec``), the recommender's settings, the twin's profile and
    engine config."""
    return (state.current, ranked_spec(state, settings.spec), settings.recommender, profile, config)
