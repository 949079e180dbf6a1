"""Overload: the offered prefill work exceeds what the fleet serves (pure).

No setting of T, mode or order makes a fleet serve more prefill work than it can: when the
waiting queue grows window after window while the fleet serves what it served before, the
p99 TTFT is queueing and more replicas are what it needs. The twin's p99 predictions mean
nothing then (it replays a window from empty engines, not from the backlog), so the tuner
stops ranking by them and takes the setting with the most prefill throughput
(``guardrails.throughput_setting``), and the controller says so (condition ``Overloaded``,
one Event when it turns true).

The rule, on one ``Reading`` per control interval (``remember`` keeps them at least
``min_gap_s`` apart: steps during a rollout come every few seconds, and a jump's early
step is not a window of its own):

- the last ``RISES`` + 1 readings all carry the queue-mix series (finite): missing or
  garbled data is never an overload;
- the backlog (the tokens of the requests waiting, all tenants: ``queued_tokens`` of the
  queue-mix series) rose at each of the last ``RISES`` (3) readings, and ends at least
  ``GROWTH`` (2x) its first value: one giant prefilling delays the queue behind it for
  one window or two, not three growing ones;
- and the prefill throughput served (uncached tokens of the window's first tokens per
  second) did not rise by more than ``FLAT`` (10%) over them: a fleet with spare capacity
  serves a growing queue faster; one at capacity does not.

Steady or falling backlog, or a fleet catching up, is not an overload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slipstream.api.snapshot import WorkloadSnapshot

RISES = 3
"""Consecutive readings whose backlog must have risen."""
GROWTH = 2.0
"""Least factor the backlog grows by over them."""
FLAT = 0.1
"""Most the served prefill rate may rise over them (fraction) and still be at capacity."""
KEEP = RISES + 1


@dataclass(frozen=True, slots=True)
class Reading:
    """One window's backlog and served prefill rate; None where the series are missing."""

    at: float
    backlog_tokens: float | None
    served_tokens_per_s: float | None


def reading(snapshot: WorkloadSnapshot) -> Reading:
    """The snapshot's backlog and served rate (None without the queue-mix series, or when a
    value is not finite: an invalid read, an engine without the patch)."""
    mixes = snapshot.queue_mix
    if not mixes or snapshot.mix_fallback is not None or snapshot.invalid not in (None, "TooFewSamples"):
        return Reading(snapshot.taken_at, None, None)
    backlog = sum(c.queued_tokens for m in mixes for c in m.classes)
    served = sum(c.uncached_tokens for m in mixes for c in m.classes) / snapshot.window_s
    ok = math.isfinite(backlog) and math.isfinite(served) and backlog >= 0 and served >= 0
    return Reading(snapshot.taken_at, backlog if ok else None, served if ok else None)


def remember(readings: Sequence[Reading], new: Reading, min_gap_s: float) -> tuple[Reading, ...]:
    """The last ``KEEP`` readings with ``new`` appended, unless it comes less than
    ``min_gap_s`` after the last one (then the history stays as it was)."""
    if readings and new.at - readings[-1].at < min_gap_s:
        return tuple(readings)
    return (*readings, new)[-KEEP:]


def overloaded(readings: Sequence[Reading]) -> str:
    """Why the fleet is overloaded (the condition's message), or "" when it is not or the
    readings cannot tell (module doc)."""
    if len(readings) < KEEP:
        return ""
    last = readings[-KEEP:]
    backlog = [r.backlog_tokens for r in last]
    served = [r.served_tokens_per_s for r in last]
    if any(b is None for b in backlog) or any(s is None for s in served):
        return ""
    b = [float(x) for x in backlog if x is not None]
    s = [float(x) for x in served if x is not None]
    rising = all(later > earlier for earlier, later in zip(b, b[1:], strict=False))
    if not (rising and b[-1] >= GROWTH * b[0] and b[-1] > 0):
        return ""
    if max(s[1:]) > (1 + FLAT) * s[0]:
        return ""  # serving more as the queue grows: spare capacity, catching up
    span = last[-1].at - last[0].at
    return (f"the waiting queue grew from {b[0]:,.0f} to {b[-1]:,.0f} prefill tokens over {RISES} windows "
            f"({span:.0f} s) while the fleet served {s[-1]:,.0f} tokens/s, no more than before: the offered "
            "prefill work exceeds what it can serve, the p99 TTFT is queueing, and no threshold fixes that; "
            "more replicas are needed (spec.replicas)")
