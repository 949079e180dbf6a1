"""The soak's plan and its verdicts, pure: what traffic, which faults when, and the checks.

``slipstream soak`` (``demo.soak``) runs the operator's closed loop on the local stack for
hours of twin time while faults are injected at random; this module decides what it does
and judges what it saw, with no I/O, so that every rule here is tested without a cluster.

The traffic is a diurnal mix (``diurnal_workload``): the demo's phase kinds (uniform chat,
documents, giants among short prompts: ``phases.SPECS``) in ``phase_s`` blocks, the kind
drawn by the hour of a day that starts at ``START_HOUR`` (more heterogeneous by day), and
each request kept with the probability of the hour's load (``diurnal_load``: lowest at
04:00, highest at 16:00), so both the rate and the mix move as they do over a day.

The faults (``plan_faults``): every kind of ``FAULT_KINDS`` at least once, in a seeded
order, at seeded times with at least ``min_gap_s`` between one fault's start and the
next's, none in the first ``warmup_s`` or the last ``tail_s``.

The checks (``judge``), each a ``SoakCheck`` that names what failed:

1. decisions: every ``CanaryStarted`` ends (``CanaryPassed``, ``RollingBack``, ``RolledBack``
   or ``CanaryVoided``) before the next one starts, and none is open at the end: no
   decision lost or duplicated;
2. no stuck rollout: no rollout in flight longer than ``stuck_s``, and none at the end;
3. the fleet accounted for after each fault: within one analysis window of its end every
   engine runs the status's setting, or, while a rollout is in flight, its candidate;
4. the operator's memory flat: the median RSS of the last quarter of its longest-lived
   process at most ``MEMORY_GROWTH`` over that of the second quarter (plus ``MEMORY_SLACK_MB``);
5. no move on missing data: no ``CanaryStarted``, ``CanarySkipped``, ``ThresholdChanged``
   or ``RolloutStarted`` from a Prometheus fault's start to one tuning interval after its
   end (the window the next step reads has the gap in it).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from slipstream.demo import phases
from slipstream.sim.workload import Request, Workload, build

FAULT_KINDS = (
    "kube-apiserver",
    "etcd",
    "prometheus-restart",
    "prometheus-outage",
    "operator-sigkill",
    "engine-pod-delete",
    "admin-timeout",
)
"""What the soak injects: a control-plane component restarted, Prometheus restarted or
stopped for a while, the operator SIGKILLed (mid-canary when one is in flight), an engine
pod deleted (its ReplicaSet makes another), one engine's admin endpoint hanging."""

HELD = {"prometheus-outage", "admin-timeout"}
"""Faults that last ``hold_s`` (the others end when the part is back)."""

PROMETHEUS_FAULTS = {"prometheus-restart", "prometheus-outage"}
"""Faults after which the next tuning window lacks data."""

DECISION_START = "CanaryStarted"
DECISION_ENDS = {"CanaryPassed", "RollingBack", "RolledBack", "CanaryVoided"}
MOVES = {"CanaryStarted", "CanarySkipped", "ThresholdChanged", "RolloutStarted"}
"""Events that start moving a setting."""

START_HOUR = 6.0
"""The twin clock's hour of the day at the soak's start: 12 hours then span morning,
midday peak and evening."""

DAY_KINDS = ((phases.HETEROGENEOUS, 0.5), (phases.DOCUMENTS, 0.3), (phases.UNIFORM, 0.2))
NIGHT_KINDS = ((phases.UNIFORM, 0.6), (phases.DOCUMENTS, 0.3), (phases.HETEROGENEOUS, 0.1))
"""Phase kinds by weight, 08:00-20:00 and outside."""

LOAD_RANGE = (0.3, 1.0)
"""Share of a phase's requests kept at the day's quietest and busiest hour."""

MEMORY_GROWTH = 0.10
MEMORY_SLACK_MB = 8.0


@dataclass(frozen=True)
class SoakFault:
    """One fault to inject ``at_s`` twin seconds into the load; held ones last ``hold_s``."""

    at_s: float
    kind: str
    hold_s: float = 0.0


@dataclass(frozen=True)
class FaultRun:
    """A fault as it happened (twin seconds since the load began)."""

    fault: SoakFault
    start_s: float
    end_s: float
    note: str = ""


@dataclass(frozen=True)
class FleetSample:
    """The status and every engine's setting at one moment (twin s since the load began).
    A setting is (threshold, mode, order); ``engines`` maps an engine URL to its own."""

    twin_s: float
    setting: tuple[int, str, str] | None
    rollout_phase: str
    candidate: tuple[int, str, str] | None
    engines: Mapping[str, tuple[int, str, str]]


@dataclass(frozen=True)
class MemorySample:
    twin_s: float
    pid: int
    rss_mb: float


@dataclass(frozen=True)
class SoakCheck:
    name: str
    ok: bool
    detail: str


@dataclass
class SoakLimits:
    """The bounds the checks hold the run to (twin seconds)."""

    analysis_s: float
    interval_s: float
    stuck_s: float
    slack_s: float = 0.0
    """Added to the fleet's bound: the samplers' period, a fault's end seen late."""


def diurnal_load(twin_s: float, start_hour: float = START_HOUR) -> float:
    """Share of requests kept at ``twin_s``: LOAD_RANGE's low at 04:00, high at 16:00."""
    hour = (start_hour + twin_s / 3600.0) % 24.0
    lo, hi = LOAD_RANGE
    return lo + (hi - lo) * (1.0 - math.cos(2.0 * math.pi * (hour - 4.0) / 24.0)) / 2.0


def kind_at(rng: random.Random, twin_s: float, start_hour: float = START_HOUR) -> str:
    hour = (start_hour + twin_s / 3600.0) % 24.0
    table = DAY_KINDS if 8.0 <= hour < 20.0 else NIGHT_KINDS
    return rng.choices([k for k, _ in table], weights=[w for _, w in table])[0]


def diurnal_workload(seed: int, duration_s: float, phase_s: float = 1800.0, replicas: int = 2,
                     start_hour: float = START_HOUR) -> tuple[Workload, list[phases.Phase]]:  # fmt: skip
    """``duration_s`` twin seconds of the diurnal mix, in phases of ``phase_s``, the twin
    clock starting at ``start_hour`` of the day."""
    rng = random.Random(f"slipstream-soak-traffic-{seed}")
    requests: list[Request] = []
    spans: list[phases.Phase] = []
    start, index = 0.0, 0
    while start < duration_s - 1e-9:
        length = min(phase_s, duration_s - start)
        kind = kind_at(rng, start, start_hour)
        name = f"{index + 1}-{kind}"
        part = phases.phase_workload(
            kind, length, replicas, seed=seed * 1000 + index + 1, base=index * 8
        )
        for r in part.requests:
            if rng.random() < diurnal_load(start + r.arrival_s, start_hour):
                requests.append(replace(r, rid=f"{name}/{r.rid}", arrival_s=r.arrival_s + start))
        spans.append(phases.Phase(name, kind, start, start + length))
        start, index = start + length, index + 1
    return build("soak", requests, " -> ".join(p.name for p in spans)), spans


def plan_faults(seed: int, duration_s: float, *, min_gap_s: float, warmup_s: float, tail_s: float,
                hold_s: float) -> list[SoakFault]:  # fmt: skip
    """Seeded faults over (warmup_s, duration_s - tail_s): as many as fit ``min_gap_s``
    apart (at least one of each kind), the kinds a shuffled cycle of ``FAULT_KINDS``, each
    start drawn within its slot. Raises when not every kind fits."""
    span = duration_s - tail_s - warmup_s
    count = int(span // min_gap_s)
    if count < len(FAULT_KINDS):
        raise ValueError(f"{len(FAULT_KINDS)} faults {min_gap_s:g} s apart need {len(FAULT_KINDS) * min_gap_s:g} "
                         f"twin s between warm-up and tail; this run has {span:g} (lengthen it or lower the gap)")  # fmt: skip
    rng = random.Random(f"slipstream-soak-faults-{seed}")
    kinds: list[str] = []
    while len(kinds) < count:
        cycle = list(FAULT_KINDS)
        rng.shuffle(cycle)
        kinds += cycle
    slot = span / count
    out = []
    for i, kind in enumerate(kinds[:count]):
        # Within the slot, leaving min_gap_s to the next slot's earliest start.
        at = warmup_s + i * slot + rng.uniform(0.0, max(slot - min_gap_s, 0.0))
        out.append(SoakFault(round(at, 1), kind, hold_s if kind in HELD else 0.0))
    return out


def _events_by_time(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, str]]:
    return sorted((float(e["_twin_s"]), str(e.get("reason", ""))) for e in events)


def check_decisions(events: Sequence[Mapping[str, Any]]) -> SoakCheck:
    """Rule 1: every CanaryStarted ends before the next starts, and none is left open."""
    open_at: float | None = None
    starts = ends = 0
    problems = []
    for at, reason in _events_by_time(events):
        if reason == DECISION_START:
            starts += 1
            if open_at is not None:
                problems.append(
                    f"CanaryStarted at {at:.0f} s while the one of {open_at:.0f} s had not ended"
                )
            open_at = at
        elif reason in DECISION_ENDS and open_at is not None:
            ends += 1
            open_at = None
    if open_at is not None:
        problems.append(f"the canary started at {open_at:.0f} s never ended")
    detail = f"{starts} canaries started, {ends} ended" + (
        f"; {'; '.join(problems)}" if problems else ""
    )
    return SoakCheck("decisions", not problems, detail)


def rollout_spans(samples: Sequence[FleetSample]) -> list[tuple[float, float]]:
    """(start, end) twin s of each stretch of samples with a rollout in flight; an
    unfinished one ends at the last sample."""
    out: list[tuple[float, float]] = []
    since: float | None = None
    for s in samples:
        busy = s.rollout_phase not in ("", "Idle")
        if busy and since is None:
            since = s.twin_s
        elif not busy and since is not None:
            out.append((since, s.twin_s))
            since = None
    if since is not None:
        out.append((since, samples[-1].twin_s))
    return out


def check_stuck(samples: Sequence[FleetSample], limits: SoakLimits) -> SoakCheck:
    """Rule 2: no rollout in flight longer than ``stuck_s``, none in flight at the end."""
    spans = rollout_spans(samples)
    longest = max((b - a for a, b in spans), default=0.0)
    ended = not samples or samples[-1].rollout_phase in ("", "Idle")
    ok = longest <= limits.stuck_s and ended
    detail = (
        f"{len(spans)} rollouts, longest in flight {longest:.0f} s (bound {limits.stuck_s:.0f} s)"
    )
    return SoakCheck(
        "no stuck rollout", ok, detail + ("" if ended else "; one still in flight at the end")
    )


def accounted(s: FleetSample) -> bool:
    """Every engine answers and runs the status's setting, or the rollout's candidate
    while one is in flight."""
    if s.setting is None or not s.engines:
        return False
    allowed = {s.setting}
    if s.rollout_phase not in ("", "Idle") and s.candidate is not None:
        allowed.add(s.candidate)
    return all(v in allowed for v in s.engines.values())


def settle_times(faults: Sequence[FaultRun], samples: Sequence[FleetSample]) -> list[float | None]:
    """Per fault, twin s from its end to the first sample (at or after it) whose fleet is
    accounted for; None if none is."""
    out: list[float | None] = []
    for run in faults:
        after = [s for s in samples if s.twin_s >= run.end_s]
        first = next((s for s in after if accounted(s)), None)
        out.append(None if first is None else first.twin_s - run.end_s)
    return out


def check_fleet(
    faults: Sequence[FaultRun], samples: Sequence[FleetSample], limits: SoakLimits
) -> SoakCheck:
    """Rule 3: within one analysis window (plus the samplers' slack) of each fault's end."""
    bound = limits.analysis_s + limits.slack_s
    times = settle_times(faults, samples)
    late = [f"{r.fault.kind} at {r.start_s:.0f} s: {'never' if t is None else f'{t:.0f} s'}"
            for r, t in zip(faults, times, strict=True) if t is None or t > bound]  # fmt: skip
    worst = max((t for t in times if t is not None), default=0.0)
    detail = f"slowest {worst:.0f} s after a fault's end (bound {bound:.0f} s)" + (
        f"; late: {'; '.join(late)}" if late else ""
    )
    return SoakCheck("fleet accounted for", not late, detail)


def check_memory(samples: Sequence[MemorySample]) -> SoakCheck:
    """Rule 4, on the operator process that lived longest (a SIGKILL starts a new one)."""
    by_pid: dict[int, list[MemorySample]] = {}
    for m in samples:
        by_pid.setdefault(m.pid, []).append(m)
    if not by_pid:
        return SoakCheck("memory flat", False, "no memory sample")
    run = max(by_pid.values(), key=lambda ms: ms[-1].twin_s - ms[0].twin_s)
    if len(run) < 8:
        return SoakCheck(
            "memory flat",
            False,
            f"{len(run)} samples of the longest-lived operator: too few to judge",
        )
    q = len(run) // 4
    second = statistics.median(m.rss_mb for m in run[q : 2 * q])
    last = statistics.median(m.rss_mb for m in run[3 * q :])
    bound = second * (1 + MEMORY_GROWTH) + MEMORY_SLACK_MB
    span_h = (run[-1].twin_s - run[0].twin_s) / 3600.0
    detail = (f"operator pid {run[0].pid} over {span_h:.1f} twin h: median RSS {second:.1f} MB (2nd quarter) -> "
              f"{last:.1f} MB (last quarter), bound {bound:.1f} MB; peak {max(m.rss_mb for m in run):.1f} MB")  # fmt: skip
    return SoakCheck("memory flat", last <= bound, detail)


def check_missing_data(faults: Sequence[FaultRun], events: Sequence[Mapping[str, Any]],
                       limits: SoakLimits) -> SoakCheck:  # fmt: skip
    """Rule 5: no move from a Prometheus fault's start to an interval after its end."""
    windows = [
        (r.start_s, r.end_s + limits.interval_s)
        for r in faults
        if r.fault.kind in PROMETHEUS_FAULTS
    ]
    moved = [f"{reason} at {at:.0f} s" for at, reason in _events_by_time(events)
             if reason in MOVES and any(a <= at <= b for a, b in windows)]  # fmt: skip
    detail = f"{len(windows)} windows without data" + (
        f"; moved: {', '.join(moved)}" if moved else ", nothing moved"
    )
    return SoakCheck("no move on missing data", not moved, detail)


def judge(faults: Sequence[FaultRun], events: Sequence[Mapping[str, Any]], fleet: Sequence[FleetSample],
          memory: Sequence[MemorySample], limits: SoakLimits) -> list[SoakCheck]:  # fmt: skip
    return [
        check_decisions(events),
        check_stuck(fleet, limits),
        check_fleet(faults, fleet, limits),
        check_memory(memory),
        check_missing_data(faults, events, limits),
    ]
