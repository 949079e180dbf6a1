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

- it fires when the distance to the decided mix reaches ``ENTER`` (0.25), at most once:
  after firing it is disarmed;
- it re-arms only when a poll finds the mix within ``EXIT`` (0.10) of the mix last
  decided on (the regular steps keep updating that reference), so a transition that keeps
  moving for a whole window (the window filling with the new phase) fires once, and noise
  around a steady mix (within ``EXIT`` .. ``ENTER``) never fires;
- a window with fewer than ``MIN_REQUESTS`` requests in it (finished or waiting), an
  invalid snapshot or one without the queue-mix series never fires and changes nothing:
  missing metrics never move anything, not even the clock.

The constants are chosen by reasoning, not fitted on a run: ``ENTER`` is a quarter of the
largest move (for example 40% of the work moving from ``le8k`` to ``le300k``, or two 400k
prompts arriving in a window of 600 chat turns of 2k tokens); ``tests/unit/test_mixjump.py``
checks that a uniform-to-giants jump fires and that window-to-window noise of a steady
phase (50 uniform requests, or 400 with one in ten a giant) never does, on synthetic
windows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from slipstream.api import buckets
from slipstream.api.snapshot import WorkloadSnapshot

ENTER = 0.25
"""Distance (``distance``) from the decided mix at which the watch fires."""
EXIT = 0.10
"""Distance within which it re-arms (below ``ENTER``: the hysteresis band)."""
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
    """The mix the last step decided on, and whether a jump from it may fire."""

    decided: Mix | None = None
    armed: bool = True

    def see(self, mix: Mix | None) -> tuple[MixWatch, bool]:
        """(the watch after this poll, whether to step now)."""
        if mix is None or self.decided is None:
            return self, False
        d = distance(mix, self.decided)
        if self.armed and d >= ENTER:
            return replace(self, armed=False), True
        if not self.armed and d <= EXIT:
            return replace(self, armed=True), False
        return self, False

    def stepped(self, mix: Mix | None) -> MixWatch:
        """After a step: its mix is the new reference (a step on no mix keeps the old one).
        Arming is left as it was: a jump that fired re-arms only once a poll sees the mix
        settle near the one decided on."""
        return self if mix is None else MixWatch(mix, self.armed)


def describe(mix: Mix) -> str:
    """`le1k 12%, le8k 80%, gt300k 8%`: the classes with work in them."""
    return ", ".join(f"{name} {share:.0%}" for name, share in zip(buckets.SIZE_CLASS_NAMES, mix, strict=True)
                     if share >= 0.005) or "no work"
