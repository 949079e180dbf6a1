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

The distance undervalues one kind of jump: giants arriving among long prompts. Among
16K-token documents (the ``le60k`` class) a 175K-token giant is one class up and a tenth
of a minute's work, a distance of 0.03; yet it is exactly what the threshold is for. So a
look also counts as a jump when prompts larger than any the decided mix held carry
``NEW_SHARE`` (5%) of the work: work in classes above the decided mix's largest class
(the largest with at least ``NEW_SHARE`` of its work), or of the ``TOP_MEMORY`` references
before it. Only a rise counts: giants that stop leave the window one interval later, and
the distance (or the timer) sees that.

The rule, with hysteresis so that it cannot flap:

- it fires when ``CONFIRM`` (2) looks in a row (polls, or the timer's step and a poll)
  find the distance to the decided mix at least ``ENTER`` (0.12), or at the first look
  that finds larger prompts than it held (above: a giant waiting is a fact, not a noisy
  share, and every second it waits uncapped costs the requests behind it), at most once:
  after firing it is disarmed; a step that sees the jump first keeps the old reference;
- it re-arms only when a poll finds the mix within ``EXIT`` (0.05) of the mix last
  decided on, with no larger prompts than it held, (the regular steps keep updating that reference), so a transition that keeps
  moving for a whole window (the window filling with the new phase) fires once, and noise
  around a steady mix (within ``EXIT`` .. ``ENTER``) never fires;
- a window with fewer than ``MIN_REQUESTS`` requests in it (finished or waiting), an
  invalid snapshot or one without the queue-mix series never fires and changes nothing:
  missing metrics never move anything, not even the clock;
- a step on a window that shows a jump and did not move (its window barely holds the new
  traffic, or straddles the change, half old traffic and half new, so the twin cannot
  explain it: ``ModelMismatch``) does not take the jump's mix as its reference: the
  watch fires again at the next look that still sees the jump, up to ``RETRIES`` times a
  jump, instead of leaving the new phase to the timer a whole interval later; when that
  step was the timer's (the jump's first sight), the next look is at once
  (``MixWatch.look_now``), not a poll later; except a
  step that found the jump going the other way (``tune.guardrails.other_way``: the giants
  are gone, its best a looser cap, which waits for the timer and the calm), which settles
  it as a move would: no later look at the same jump would move.

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
NEW_SHARE = 0.05
"""Share of the window's prefill work in classes above the decided mix's largest class at
which a look counts as a jump whatever the distance; also the share a class needs to count
as held. One giant among a minute of two engines' documents is about a tenth of the work;
5% leaves room for a smaller giant or a longer window. A false jump costs one early step
(one twin run); the guardrails still decide."""
RETRIES = 3
"""Steps a jump may be retried at the next look when its step did not settle it
(``MixWatch.stepped(judged=False)``): a window a poll later holds more of the new phase,
and at the demo's 10 s polls three retries reach 30 s past the jump. Bounded, so a jump
the tuner never acts on costs at most this many extra steps (twin runs)."""
TOP_MEMORY = 3
"""References (judged steps) whose largest class ``larger`` remembers: giants that come at
random leave some windows without one, and a reference taken in such a gap would make the
next giant a jump each time (a step, a twin run and an Event, all saying the same). Three
steps are the calm a cap waits before it is loosened (``tune.guardrails``, one 180 s
cooldown at 60 s intervals): giants gone that long are gone as far as the tuner knows."""
WINDOW_POLLS = CONFIRM + 1
"""A step a jump brought forward judges the last ``WINDOW_POLLS`` polls (``window_s``), not
the whole interval: the jump began after the look before the first that saw it, and a
window reaching back further is mostly the old traffic (a minute of documents with one
giant at its end reads as documents, and the twin then picks the setting for those)."""
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


def window_s(poll_s: float, interval_s: float) -> float:
    """The window a step a jump brought forward judges (``WINDOW_POLLS``), at most the
    interval's."""
    return min(interval_s, WINDOW_POLLS * poll_s) if poll_s > 0 else interval_s


def top(mix: Sequence[float]) -> int:
    """The largest class holding at least ``NEW_SHARE`` of the work (-1: none)."""
    return max((i for i, share in enumerate(mix) if share >= NEW_SHARE), default=-1)


def larger(mix: Sequence[float], decided: Sequence[float], held: int = -1) -> float:
    """Share of ``mix``'s work in classes above the largest class ``decided`` held (or
    ``held``, when larger): prompts larger than the reference held."""
    return sum(mix[max(top(decided), held) + 1:])


def jumped(mix: Sequence[float], decided: Sequence[float], held: int = -1) -> bool:
    """Whether ``mix`` is a jump from ``decided``: moved at least ``ENTER``, or larger
    prompts than it (or the references before it: ``held``) held carry at least
    ``NEW_SHARE`` of the work."""
    return distance(mix, decided) >= ENTER or larger(mix, decided, held) >= NEW_SHARE


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
    retries: int = 0
    """Steps of the current jump that could not judge their window (``stepped``)."""
    announced: bool = False
    """A step this jump brought has run (and the loop posted its Event): a later firing on
    the same reference is a retry. A timer step that saw the jump first and held is not
    one: the firing after it is the jump's first announcement."""
    tops: tuple[int, ...] = ()
    """The largest class held by each of the last ``TOP_MEMORY`` references (``larger``
    compares with the largest of them)."""

    @property
    def look_now(self) -> bool:
        """A regular step saw a jump first and did not settle it (``stepped``): its window
        was the whole interval, mostly the old traffic. The next look comes at once, not a
        poll later: it fires on the same jump, and the step it brings judges the jump's own
        shorter window (``WINDOW_POLLS``). Only then: a step a jump brought that held
        already judged that window, and its retry waits for a poll's newer traffic."""
        return self.armed and self.retries > 0 and not self.announced and self.seen >= CONFIRM - 1

    def see(self, mix: Mix | None) -> tuple[MixWatch, bool]:
        """(the watch after this poll, whether to step now)."""
        if mix is None or self.decided is None:
            return self, False
        held = max(self.tops, default=-1)
        if self.armed and jumped(mix, self.decided, held):
            if self.seen + 1 >= CONFIRM or larger(mix, self.decided, held) >= NEW_SHARE:
                return replace(self, armed=False, seen=0), True
            return replace(self, seen=self.seen + 1), False
        if not self.armed and distance(mix, self.decided) <= EXIT and larger(mix, self.decided, held) < NEW_SHARE:
            return replace(self, armed=True, seen=0), False
        return replace(self, seen=0), False

    def stepped(self, mix: Mix | None, judged: bool = True, settled: bool = True, brought: bool = False) -> MixWatch:
        """After a step on `mix`: it counts as a look, and becomes the new reference unless
        it is the first look at a jump not yet confirmed (the step was on a window that
        the new phase has barely entered; its reference would hide the jump), or the step
        did not settle a jump its window shows (``settled`` False): then the
        old reference stays and the next look that sees the jump fires, ``RETRIES`` times at
        most (a window a poll later holds more of the new traffic); one that moved on a jump
        leaves the watch disarmed until the mix settles near its window. A step that judged
        nothing (``judged`` False: a guardrail held before the twin ran, a rollout in
        flight) leaves the watch as it was unless a jump brought it (``brought``), so a jump
        during a rollout fires once the rollout is over; with no reference yet, its mix
        becomes the reference. A step settles a jump when it moves, or when it finds the jump
        going the other way (giants gone, its best a looser cap, which waits for the timer
        and the calm: ``tune.guardrails.other_way``). A step on no mix keeps the watch as it
        was."""
        if mix is None:
            return self
        if not judged and not brought:
            # The first look still gives the watch its reference: a deployment that starts
            # in a cooldown (after an operator restart, say) would otherwise never see a jump.
            return self if self.decided is not None else MixWatch(mix, tops=(top(mix),))
        held = max(self.tops, default=-1)
        jump = self.decided is not None and jumped(mix, self.decided, held)
        if jump and not settled and (brought or self.armed) and self.retries < RETRIES:
            return replace(self, armed=True, seen=CONFIRM - 1, retries=self.retries + 1,
                           announced=self.announced or brought)  # fmt: skip
        watch, _ = self.see(mix)  # a jump the step confirms is the step's: no firing after it
        if watch.seen > 0:
            return watch
        # A step that settled answered the change it saw (in its own window, or in the poll's
        # that brought it: the step's window may not show the giant the poll saw waiting); a
        # window still filling with the new traffic would read as a jump from it until it
        # settles (EXIT re-arms it).
        answered = settled and (jump or brought)
        return MixWatch(mix, watch.armed and not answered, tops=(*self.tops, top(mix))[-TOP_MEMORY:])


def describe(mix: Mix) -> str:
    """`le1k 12%, le8k 80%, gt300k 8%`: the classes with work in them."""
    return ", ".join(f"{name} {share:.0%}" for name, share in zip(buckets.SIZE_CLASS_NAMES, mix, strict=True)
                     if share >= 0.005) or "no work"
