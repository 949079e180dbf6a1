"""Whether the queue mix jumped since the last decision: the loop's early-step trigger (pure).

The tuning loop steps once per interval. A phase change (giant cold prompts start to
arrive, or stop) shows in the engines' queue-mix series at once, and waiting for the timer
costs up to a whole interval before the tuner even looks. So between steps the loop polls
its snapshot (the fleet read it shares with every deployment on the same Prometheus,
reused for ``reuse_s``: at most one fleet read per ``reuse_s`` per Prometheus, whatever
the number of deployments polling) and asks ``MixWatch.see``
whether the size-class mix moved far from the one the last step decided on; if so, it
steps now. The step is an ordinary step: the guardrails (cooldown, minimum samples,
missing metrics, a rollout in flight) still decide whether anything moves.

The mix is the share of prefill work per size class (``api.buckets.SIZE_CLASSES``): the
uncached tokens of the requests that got their first token in the window plus those of
the requests waiting now, summed over tenants. Work, not request counts: one giant prompt
costs the queue what hundreds of chat turns cost, and is exactly what the threshold is
about; and waiting tokens count, so a giant that starves in the queue shows while it
starves. The distance is the earth mover's distance between the two share vectors over the
ordered classes, divided by the largest possible move (four class steps): 0 is the same
mix, 1 all the work moved from the smallest class to the largest. Unlike a distance that
treats classes as unordered, work that merely crosses the boundary between two
neighbouring classes (giants of 250k and of 350k tokens, ``le300k`` and ``gt300k``) moves it
little, and work that moves from chat turns to giant prompts moves it much: what the
threshold is about.

The rule, with hysteresis so that it cannot flap:

- it fires when ``CONFIRM`` (2) looks in a row (polls, or the timer's step and a poll)
  find the distance to the decided mix at least ``ENTER`` (0.12), at most once: after
  firing it is disarmed; a step that sees the jump first keeps the old reference;
- it re-arms only when a poll finds the mix within ``EXIT`` (0.05) of the mix last
  decided on (the regular steps keep updating that reference), so a transition that keeps
  moving for a whole window (the window filling with the new phase) fires once, and noise
  around a steady mix (within ``EXIT`` .. ``ENTER``) never fires;
- a window with fewer than ``MIN_REQUESTS`` requests in it (finished or waiting), an
  invalid snapshot or one without the queue-mix series never fires and changes nothing:
  missing metrics never move anything, not even the clock.

``ENTER`` and ``CONFIRM`` are in-sample: chosen on the demo's phases
(``scripts/closed-loop-offline.py --mix-poll 10``, and ``slipstream loopbench``'s live
runs), whose uniform-to-heterogeneous change moves the distance to 0.16-0.24 once two
giants are in the window (30-45% of the work from ``le8k`` to ``le300k``), but to only
0.13-0.15 while the first giant is the window's only one, as read live from Prometheus: a
trigger above that waits for the second giant. The value is in-sample (chosen on those
runs); ``tests/unit/test_mixjump.py`` checks it elsewhere, on synthetic windows: a
uniform-to-giants jump fires, and the window-to-window noise of steady phases (50 uniform
requests: at most 0.04; 400 with one in ten a giant: at most 0.06) never does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from slipstream.api import buckets
from slipstream.api.snapshot import WorkloadSnapshot

ENTER = 0.12
"""Distance (``distance``) from the decided mix at which the watch fires."""
EXIT = 0.05
"""Distance within which it re-arms (below ``ENTER``: the hysteresis band)."""
CONFIRM = 2
"""Looks in a row (polls, or a step and a poll) that must see the jump before it fires: the
first poll after a phase change sees a window the new phase has barely entered, on which
the tuner cannot yet tell (the demo's heterogeneous phase 10 s in: heterogeneity 0.09)."""
MIN_REQUESTS = 20.0
"""Requests (first tokens in the window plus waiting now) a mix needs to be judged."""

Mix = tuple[float, ...]
"""Share of prefill work per ``buckets.SIZE_CLASS_NAMES`` class; sums to 1."""


def shares(work: Mapping[str, float], requests: float) -> Mix | None:
    """Shares of ``work`` (size class -> uncached tokens), or None when too thin to judge:
    fewer than ``MIN_REQUESTS`` requests, or no work at all."""
    total = sum(max(0.0, work.get(c, 0.0)) for c in buckets.SIZE_CLASS_NAMES)
    if requests < MIN_REQUESTS or total <= 0:
        return None
    return tuple(max(0.0, work.get(c, 0.0)) / total for c in buckets.SIZE_CLASS_NAMES)


def mix_of(snap: WorkloadSnapshot | None) -> Mix | None:
    """The snapshot's mix; None when it is invalid, has no queue-mix series, or is thin."""
    if snap is None or not snap.valid or snap.mix_fallback is not None or not snap.queue_mix:
        return None
    work: dict[str, float] = {}
    requests = 0.0
    for tenant in snap.queue_mix:
        for c in tenant.classes:
            work[c.name] = work.get(c.name, 0.0) + c.uncached_tokens + c.queued_tokens
            requests += c.first_tokens + c.queued
    return shares(work, requests)


def distance(a: Sequence[float], b: Sequence[float]) -> float:
    """Earth mover's distance between two share vectors over the ordered classes, over the
    largest possible (all work from the first class to the last): 0 to 1."""
    moved, carried = 0.0, 0.0
    for x, y in zip(a[:-1], b[:-1], strict=True):
        carried += x - y
        moved += abs(carried)
    return moved / max(1, len(a) - 1)


@dataclass(frozen=True)
class MixWatch:
    """The mix the last step decided on, whether a jump from it may fire, and how many
    looks in a row (polls or steps) have seen the mix at least ``ENTER`` from it."""

    decided: Mix | None = None
    armed: bool = True
    seen: int = 0

    def see(self, mix: Mix | None) -> tuple[MixWatch, bool]:
        """(the watch after this poll, whether to step now)."""
        if mix is None or self.decided is None:
            return self, False
        d = distance(mix, self.decided)
        if self.armed and d >= ENTER:
            if self.seen + 1 >= CONFIRM:
                return replace(self, armed=False, seen=0), True
            return replace(self, seen=self.seen + 1), False
        if not self.armed and d <= EXIT:
            return replace(self, armed=True, seen=0), False
        return replace(self, seen=0), False

    def stepped(self, mix: Mix | None) -> MixWatch:
        """After a step on `mix`: it counts as a look, and becomes the new reference unless
        it is the first look at a jump not yet confirmed (the step was on a window that
        the new phase has barely entered; its reference would hide the jump). A step on
        no mix keeps the watch as it was."""
        if mix is None:
            return self
        watch, _ = self.see(mix)  # a jump the step confirms is the step's: no firing after it
        if watch.seen > 0:
            return watch
        return MixWatch(mix, watch.armed)


def describe(mix: Mix) -> str:
    """`le1k 12%, le8k 80%, gt300k 8%`: the classes with work in them."""
    return ", ".join(f"{name} {share:.0%}" for name, share in zip(buckets.SIZE_CLASS_NAMES, mix, strict=True)
                     if share >= 0.005) or "no work"
