"""The queue-mix jump detector (tune.mixjump): a jump fires once, noise does not, and the
hysteresis band keeps a mix that hovers near the threshold from firing again."""

from __future__ import annotations

import random

from slipstream.api import buckets, snapshot
from slipstream.tune import mixjump

NAMES = buckets.SIZE_CLASS_NAMES


def snap_of(sizes: list[float], waiting: list[float] = (), *, valid: bool = True,  # type: ignore[assignment]
            fallback: str | None = None) -> snapshot.WorkloadSnapshot:
    """A window whose first tokens had `sizes` uncached tokens and `waiting` wait now."""
    classes = []
    for name in NAMES:
        done = [s for s in sizes if buckets.size_class(s) == name]
        queued = [s for s in waiting if buckets.size_class(s) == name]
        classes.append(snapshot.SizeClassWindow(name, float(len(done)), float(sum(done)), 0.0,
                                                float(len(queued)), float(sum(queued))))  # fmt: skip
    mix = (snapshot.TenantMix("chat", len(sizes) / 60.0, tuple(classes)),) if fallback is None else ()
    return snapshot.WorkloadSnapshot("prod/kimi", 0.0, 60.0, invalid=None if valid else snapshot.NO_TRAFFIC,
                                     queue_mix=mix, mix_fallback=fallback)  # fmt: skip


def uniform(rng: random.Random, n: int) -> list[float]:
    """A steady phase: chat turns and documents (log-uniform 300 to 6,000 tokens)."""
    return [300 * 20 ** rng.random() for _ in range(n)]


def giants(rng: random.Random, n: int) -> list[float]:
    """The same with one request in ten a giant cold prompt (150k to 400k tokens)."""
    return [rng.uniform(150_000, 400_000) if rng.random() < 0.1 else s for s in uniform(rng, n)]


def test_the_distance_counts_how_far_the_work_moved() -> None:
    first, last = (1.0, 0, 0, 0, 0), (0, 0, 0, 0, 1.0)
    assert mixjump.distance(first, last) == 1.0 and mixjump.distance(first, first) == 0.0
    # Work crossing one boundary between neighbours moves it a quarter as much.
    assert abs(mixjump.distance((0, 0, 0, 1.0, 0), last) - 0.25) < 1e-12
    assert mixjump.distance(first, last) == mixjump.distance(last, first)


def test_a_jump_fires_once_and_rearms_only_after_the_mix_settles() -> None:
    # Giants -> uniform: the distance alone (no larger prompts), so two looks confirm it.
    rng = random.Random(1)
    before, after = mixjump.mix_of(snap_of(giants(rng, 200))), mixjump.mix_of(snap_of(uniform(rng, 200)))
    assert before is not None and after is not None
    assert mixjump.distance(before, after) >= mixjump.ENTER
    watch = mixjump.MixWatch().stepped(before)
    watch, fired = watch.see(after)
    assert not fired and watch.seen == 1  # the first look: not yet
    watch, fired = watch.see(after)
    assert fired and not watch.armed
    # The window keeps showing the new phase: no second firing, before or after the step
    # the firing caused (its mix is the new reference; the watch re-arms near it).
    watch, fired = watch.see(after)
    assert not fired
    watch = watch.stepped(after)
    watch, fired = watch.see(after)
    assert not fired and watch.armed
    # Back to the first phase: a jump again, fired once.
    watch, first = watch.see(before)
    watch, fired = watch.see(before)
    assert not first and fired
    assert not watch.see(before)[1] and not watch.see(before)[0].see(before)[1]


def test_a_step_that_sees_the_jump_first_keeps_the_old_reference() -> None:
    rng = random.Random(5)
    before, after = mixjump.mix_of(snap_of(giants(rng, 200))), mixjump.mix_of(snap_of(uniform(rng, 200)))
    assert before is not None and after is not None
    # The timer's step lands just after the phase change: its window has barely changed,
    # and as a reference it would hide the jump from every later poll.
    watch = mixjump.MixWatch().stepped(before).stepped(after)
    assert watch.decided == before and watch.seen == 1
    watch, fired = watch.see(after)
    assert fired
    # A step that confirms the jump is the step the jump asked for: its mix is the reference.
    stepped = mixjump.MixWatch().stepped(before).stepped(after).stepped(after)
    assert stepped.decided == after and not stepped.armed and not stepped.see(after)[1]


def test_a_waiting_giant_counts_before_it_gets_its_first_token() -> None:
    rng = random.Random(2)
    chat = uniform(rng, 100)
    watch = mixjump.MixWatch().stepped(mixjump.mix_of(snap_of(chat)))
    waiting = mixjump.mix_of(snap_of(chat, waiting=[350_000.0, 380_000.0]))
    assert watch.see(waiting)[1]


def test_noise_around_a_steady_mix_does_not_fire() -> None:
    for make, n in ((uniform, 50), (giants, 400)):
        rng = random.Random(3)
        watch = mixjump.MixWatch().stepped(mixjump.mix_of(snap_of(make(rng, n))))
        worst = 0.0
        for _ in range(300):
            mix = mixjump.mix_of(snap_of(make(rng, n)))
            assert mix is not None and watch.decided is not None
            worst = max(worst, mixjump.distance(mix, watch.decided))
            watch, fired = watch.see(mix)
            assert not fired, (make.__name__, n, worst)
        assert worst > 0  # the windows did differ


def test_a_mix_hovering_inside_the_band_fires_once() -> None:
    # Every mix here holds the same largest class (le60k): only the distance moves.
    decided = (0.5, 0.45, 0.05, 0.0, 0.0)
    near, far, back = (0.5, 0.1, 0.4, 0.0, 0.0), (0.0, 0.5, 0.5, 0.0, 0.0), (0.4, 0.55, 0.05, 0.0, 0.0)
    assert mixjump.EXIT < mixjump.distance(near, decided) < mixjump.ENTER <= mixjump.distance(far, decided)
    watch = mixjump.MixWatch(decided)
    fired = []
    for mix in (far, near, far, far, near, far, far, near, far, far):
        watch, f = watch.see(mix)
        fired.append(f)
    # The second `far` in a row fires; after it, hovering fires nothing, however long.
    assert fired == [False, False, False, True, False, False, False, False, False, False]
    watch, f = watch.see(back)  # within EXIT of the decided mix: armed again
    assert not f and watch.armed
    assert watch.see(far)[0].see(far)[1]


def test_missing_or_thin_metrics_judge_nothing() -> None:
    rng = random.Random(4)
    sizes = uniform(rng, 100)
    assert mixjump.mix_of(None) is None
    assert mixjump.mix_of(snap_of(sizes, valid=False)) is None
    assert mixjump.mix_of(snap_of(sizes, fallback=snapshot.NO_MIX_SERIES)) is None
    assert mixjump.mix_of(snap_of(sizes[: int(mixjump.MIN_REQUESTS) - 1])) is None
    watch = mixjump.MixWatch().stepped(mixjump.mix_of(snap_of(sizes)))
    assert watch.see(None) == (watch, False)
    assert watch.stepped(None) == watch  # a step on no mix keeps the reference
    # No reference yet (no step has seen a mix): nothing to jump from.
    assert mixjump.MixWatch().see(mixjump.mix_of(snap_of(giants(rng, 100)))) == (mixjump.MixWatch(), False)


def documents(rng: random.Random, n: int) -> list[float]:
    """A steady phase of long documents (10K to 24K tokens, the ``le60k`` class)."""
    return [rng.uniform(10_000, 24_000) for _ in range(n)]


def test_giants_among_documents_are_a_jump_though_the_work_moved_little() -> None:
    rng = random.Random(6)
    docs = documents(rng, 96)  # a minute of two engines' documents
    watch = mixjump.MixWatch().stepped(mixjump.mix_of(snap_of(docs)))
    # One 175K-token giant waiting: a tenth of the work, one class up.
    mix = mixjump.mix_of(snap_of(documents(rng, 96), waiting=[175_000.0]))
    assert mix is not None and watch.decided is not None
    assert mixjump.distance(mix, watch.decided) < mixjump.ENTER  # the distance alone would miss it
    watch, fired = watch.see(mix)
    assert fired  # at the first look: a giant waiting is a fact, not a noisy share
    # Once giants are part of the decided mix, more of them are no jump.
    steady = mixjump.MixWatch().stepped(mix)
    assert not steady.see(mix)[0].see(mix)[1]


def test_steady_documents_never_fire() -> None:
    rng = random.Random(7)
    watch = mixjump.MixWatch().stepped(mixjump.mix_of(snap_of(documents(rng, 50))))
    for _ in range(300):
        watch, fired = watch.see(mixjump.mix_of(snap_of(documents(rng, 50))))
        assert not fired


def test_a_step_that_cannot_judge_its_window_is_retried_at_the_next_look() -> None:
    rng = random.Random(8)
    before, after = mixjump.mix_of(snap_of(uniform(rng, 200))), mixjump.mix_of(snap_of(giants(rng, 200)))
    assert before is not None and after is not None
    watch = mixjump.MixWatch().stepped(before)
    watch, fired = watch.see(after)  # larger prompts: the first look fires
    assert fired
    # The step the jump asked for held ModelMismatch (a window straddling the change): the old
    # reference stays and the next look fires again, RETRIES times at most.
    for k in range(mixjump.RETRIES):
        watch = watch.stepped(after, settled=False, brought=True)
        assert watch.decided == before and watch.retries == k + 1
        watch, fired = watch.see(after)
        assert fired, k
    watch = watch.stepped(after, settled=False, brought=True)  # retries spent: the step's window is the reference
    assert watch.decided == after and not watch.see(after)[1]
    # A judged step ends the retries as before.
    judged = mixjump.MixWatch().stepped(before).see(after)[0].stepped(after)
    assert judged.decided == after and judged.retries == 0


def test_a_step_that_judged_nothing_leaves_a_jump_to_fire_later() -> None:
    rng = random.Random(9)
    before, after = mixjump.mix_of(snap_of(uniform(rng, 200))), mixjump.mix_of(snap_of(giants(rng, 200)))
    watch = mixjump.MixWatch().stepped(before)
    # A rollout in flight: its steps hold before the twin runs, every few seconds, and polls
    # pause. None of them takes the new mix as the reference, nor spends a retry.
    for _ in range(10):
        watch = watch.stepped(after, judged=False)
    assert watch.decided == before and watch.retries == 0
    watch, fired = watch.see(after)
    assert fired


def test_random_giants_with_quiet_windows_between_are_one_regime() -> None:
    rng = random.Random(10)
    quiet = mixjump.mix_of(snap_of(documents(rng, 96)))
    giant = mixjump.mix_of(snap_of(documents(rng, 96), waiting=[175_000.0]))
    watch = mixjump.MixWatch().stepped(giant)  # a step decided on a window with a giant
    watch = watch.stepped(quiet)  # the next one had none
    # The next giant is no jump: the references remember what the last few held.
    assert not watch.see(giant)[0].see(giant)[1]
    # After TOP_MEMORY quiet references the giants are gone as far as the watch knows.
    for _ in range(mixjump.TOP_MEMORY):
        watch = watch.stepped(quiet)
    assert watch.see(giant)[1]


def test_a_timer_step_that_holds_on_a_jump_leaves_it_to_the_next_look() -> None:
    rng = random.Random(11)
    before, after = mixjump.mix_of(snap_of(uniform(rng, 200))), mixjump.mix_of(snap_of(giants(rng, 200)))
    watch = mixjump.MixWatch().stepped(before).stepped(after, settled=False)
    assert watch.decided == before and watch.retries == 1
    assert watch.look_now  # at once: its step judges the jump's window, not the interval's
    fired, now = watch.see(after)
    assert now and not fired.look_now
    # The step that look brought held too: the retry waits for a poll's newer traffic.
    assert not fired.stepped(after, settled=False, brought=True).look_now
    # Steady traffic, or a jump a step settled, asks for no early look.
    assert not mixjump.MixWatch().stepped(before).stepped(before, settled=False).look_now
    # The same step had it moved: its window is the reference, nothing left to fire.
    moved = mixjump.MixWatch().stepped(before).stepped(after)
    assert moved.decided == after and not moved.see(after)[1]


def fired_on_the_first_giant(rng: random.Random) -> tuple[mixjump.MixWatch, mixjump.Mix]:
    """A watch whose reference is documents and whose poll just fired on the first giant
    waiting among them: (the watch after the poll, the poll's mix)."""
    docs = mixjump.mix_of(snap_of(documents(rng, 96)))
    first = mixjump.mix_of(snap_of(documents(rng, 96), waiting=[175_000.0]))
    assert docs is not None and first is not None
    watch, fired = mixjump.MixWatch().stepped(docs).see(first)
    assert fired
    return watch, first


def test_a_step_that_moved_on_a_jump_does_not_fire_again_while_the_window_fills() -> None:
    rng = random.Random(12)
    watch, first = fired_on_the_first_giant(rng)
    filled = mixjump.mix_of(snap_of(giants(rng, 200)))  # a minute later: short turns and giants
    assert filled is not None
    watch = watch.stepped(first, settled=True, brought=True)
    assert watch.decided == first and not watch.armed
    assert mixjump.distance(filled, first) >= mixjump.ENTER
    assert not watch.see(filled)[1] and not watch.see(filled)[0].see(filled)[1]
    # A timer step on the filled window is the new reference; the watch re-arms near it.
    watch = watch.stepped(filled)
    watch, fired = watch.see(filled)
    assert not fired and watch.armed


def test_a_step_a_jump_brought_that_moved_disarms_though_its_own_window_lacks_the_giant() -> None:
    # The poll saw the first giant waiting; the step it brought read a window that did not
    # (the step's own read came a moment later, its window narrower). It moved all the same:
    # the move answered the poll's jump, so the next poll that sees the giant does not fire.
    rng = random.Random(13)
    fired, first = fired_on_the_first_giant(rng)
    step = mixjump.mix_of(snap_of(documents(rng, 96)))
    assert step is not None
    watch = fired.stepped(step, settled=True, brought=True)
    assert watch.decided == step and not watch.armed
    assert not watch.see(first)[1]
    # Held instead of moved, the same step leaves the jump to fire at the next look.
    assert fired.stepped(step, settled=False, brought=True).see(first)[1]


def test_only_a_step_the_jump_brought_announces_it() -> None:
    rng = random.Random(12)
    before, after = mixjump.mix_of(snap_of(uniform(rng, 200))), mixjump.mix_of(snap_of(giants(rng, 200)))
    # A timer step saw the jump first and held: the next look fires, unannounced so far.
    timer = mixjump.MixWatch().stepped(before).stepped(after, settled=False)
    assert not timer.announced
    watch, fired = timer.see(after)
    assert fired and not watch.announced
    # The step that firing brought held too: the next firing is a retry of an announced jump.
    retried = watch.stepped(after, settled=False, brought=True)
    assert retried.announced and retried.see(after)[1]
    # A step that moved takes a new reference, and the next jump is a new one.
    assert not retried.stepped(after, brought=True).announced


def test_a_jump_the_other_way_is_settled_without_a_retry() -> None:
    rng = random.Random(13)
    capped, calm = mixjump.mix_of(snap_of(giants(rng, 200))), mixjump.mix_of(snap_of(uniform(rng, 200)))
    watch = mixjump.MixWatch().stepped(capped)  # a step decided on giants
    for _ in range(mixjump.CONFIRM - 1):
        watch, fired = watch.see(calm)
        assert not fired
    watch, fired = watch.see(calm)
    assert fired  # the giants are gone
    # Its step held on a looser cap (tune.guardrails.other_way): that settles it, as a move would.
    settled = watch.stepped(calm, settled=True, brought=True)
    assert settled.decided == calm and settled.retries == 0 and not settled.armed
    assert not settled.see(calm)[1]
    # Held for another reason, the jump is retried at the next look.
    retried = watch.stepped(calm, settled=False, brought=True)
    assert retried.decided == capped and retried.retries == 1 and retried.see(calm)[1]

