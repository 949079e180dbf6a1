"""Deciding on little data: the window a step judges, widened until it holds enough (pure).

A step judges the last interval (``base_s``). At honest load on long prompts an engine
gives fewer first tokens a minute than ``GuardrailSettings.min_samples`` (50), and a
fixed floor would hold ``TooFewSamples`` for ever (on ``examples/workloads/little-data.yaml``
at 70% busy, 34 of 35 decisions did, and Auto stayed stock). So the step pools evidence
across intervals under one rule, the same in the operator's loop (the Prometheus range it
reads), the twin's ``auto`` and the offline loop (``demo.offline.closed_loop``):

- the windows tried are ``base_s`` x 1, 2, 4, 8, ... (``ladder``), the first that holds
  ``need`` samples is judged (``choose``); none: the widest, held ``TooFewSamples``;
- a window never reaches back past ``since``, the last change of the fleet's setting (the
  last step's promotion or rollback, ``tune.deployment.last_step_at``; the first traffic
  when there was none): a window must see one setting, or its p99 mixes two and the twin,
  which replays the window under the current setting, explains neither; the base window
  itself is always read (as before this rule);
- and never past ``MAX_FACTOR`` (16) intervals: at a 60 s interval 16 minutes, beyond which
  the traffic a window averages over is no longer the traffic of now.

Why this is sound: under one setting and steady traffic the first tokens of consecutive
intervals are draws from one distribution, so the p99 of k intervals pooled is the p99 of
``sum(counts)`` draws, and what ``min_samples`` asks for (a p99 that is not the maximum
of a handful) is a count of draws, not a span of time; the rates are the pooled count
over the pooled span. What pooling gives up is speed: a widened window averages over older
traffic. That is what the queue-mix watch (``tune.mixjump``) is for: it judges the mix of
the interval and the waiting queue now, whatever the first-token count, and a jump brings a
step on the jump's own window. Powers of two: at most ``log2(MAX_FACTOR) + 1`` (5) windows
to read, each at most twice the shortest that would have done, and the operator's reads of
one window are shared by every deployment with the same interval (``observe.fleet``).

A step the queue mix brought forward (``jumped``) counts differently (``evidence``): the
question there is whether giants came, not a fine p99, and the giants still prefilling
have no first token yet; so its samples are the window's first tokens plus the requests
waiting now (what the watch counted to fire: ``mixjump.MIN_REQUESTS``). Its window widens
too, but only up to the interval (``jump_ladder``): the window the watch saw the jump in,
and reaching further back would be the old phase the jump's short window leaves out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from slipstream.api.snapshot import WorkloadSnapshot

MAX_FACTOR = 16
"""The widest window, in base windows (intervals)."""


def ladder(base_s: float, now: float, since: float | None, max_s: float | None = None) -> tuple[float, ...]:
    """The windows a step may judge, shortest first: ``base_s`` x 1, 2, 4, ... while a
    window stays within ``now - since`` (``since`` None: no change to respect) and within
    ``max_s`` (default ``MAX_FACTOR`` x ``base_s``). ``base_s`` is always the first."""
    if not base_s > 0:
        raise ValueError(f"the base window must be > 0 s, got {base_s}")
    limit = MAX_FACTOR * base_s if max_s is None else max_s
    if since is not None:
        limit = min(limit, now - since)
    out = [base_s]
    while (wider := 2 * out[-1]) <= limit * (1 + 1e-9):
        out.append(wider)
    return tuple(out)


def jump_ladder(jump_s: float, interval_s: float, now: float, since: float | None) -> tuple[float, ...]:
    """The windows of a step a queue-mix jump brought forward: from the jump's own window
    (``mixjump.window_s``) up to the interval, no further (module doc)."""
    windows = ladder(jump_s, now, since, interval_s)
    if windows[-1] < interval_s and (since is None or now - since >= interval_s):
        windows += (interval_s,)
    return windows


def choose(counts: Sequence[float], need: float) -> int:
    """The index of the first window whose count reaches ``need``; -1 when none does (the
    step then judges the last window read and holds ``TooFewSamples``)."""
    return next((i for i, n in enumerate(counts) if n >= need), -1)


def evidence(snapshot: WorkloadSnapshot, jumped: bool = False) -> float:
    """The samples a snapshot holds for the floor: its first tokens, and on a step a jump
    brought forward also the requests waiting now (the queue-mix series, else the queue
    depth); NaN counts as none."""
    first = snapshot.requests if math.isfinite(snapshot.requests) else 0.0
    if not jumped:
        return first
    waiting = sum(m.queued for m in snapshot.queue_mix) if snapshot.queue_mix else (snapshot.queue_depth or 0.0)
    return first + (waiting if math.isfinite(waiting) else 0.0)


def pick(windows: Sequence[float], first_token_times: Iterable[float], now: float, need: float,
         waiting: float = 0.0) -> tuple[float, bool]:
    """(the window judged, whether it holds ``need``) from the first tokens' times, for a
    caller that has them all (the twin's loops): each window's count is the first tokens in
    ``(now - window, now]``, plus ``waiting`` (0 on a timer step)."""
    times = [t for t in first_token_times if t <= now]
    counts = [sum(1 for t in times if t > now - w) + waiting for w in windows]
    i = choose(counts, need)
    return (windows[i], True) if i >= 0 else (windows[-1], False)
