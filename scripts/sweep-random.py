"""Auto judged per phase on randomized phased workloads, at several timer offsets, on the twin.

Each seed is one workload of ``slipstream.demo.randomized`` (3-5 phases of chat, documents,
giants among short prompts, mixed sizes, bursts or cached agents, 30-120% of the fleet's
prefill capacity). Per seed every constant within the demo's bounds in any mode
(``offline.CONSTANTS``: stock, and T 4096 as ceiling, floor or reflex, in every order) runs
once over the whole workload; per (seed, offset) the twin's model of the operator's loop
(``offline.closed_loop``, timer at that offset, the fleet starting on ``--start``: the
demo's reflex by default, or stock for the ceiling and floor tuner) runs Auto, judged by
``offline.judge``: the whole run against the best static setting over the whole run, each
phase against its oracle (the static setting best in that phase), the first
``offline.FIRST_S`` after each phase change against the oracle's first seconds, and
against Off (stock) where Off is more than twice the best static.

Prints one line per (seed, offset), then the worst case of each figure over the sweep and
whether the targets hold: whole <= 1.05x the best static; every phase <= 1.25x its oracle;
Auto <= 0.5x Off wherever Off > 2x the best static. Exits 0 whatever the verdict, unless
``--check`` is given (then 1 when a target fails).

    PYTHONPATH=operator .venv/bin/python scripts/sweep-random.py --seeds 0-19 --offsets 0,20,40 --jobs 2 \\
        --json /tmp/sweep.json
    PYTHONPATH=operator .venv/bin/python scripts/sweep-random.py --seeds 3,7 --offsets 0 --check

Cost (measured 2026-12-06 at e41a8f5 on a 2-core machine shared with other work, load
average 3-9): the 20-seed x 3-offset sweep on ``--jobs 2`` took 40 min 38 s wall and 2,745
CPU seconds (statics 503, loops 2,242), about 23 min on two free cores; one seed's static
settings 1-297 CPU s, one closed loop 3-183 CPU s (most of it the tuner's twin replays,
which grow with a window's requests and queue; seed 0, the heaviest, 54K requests and
~180 s a loop). Lines print as runs finish; the per-line time is CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from dataclasses import asdict

from slipstream.demo import offline, randomized

WHOLE_VS_BEST = 1.05
PHASE_VS_ORACLE = 1.25
VS_OFF = 0.5
OFF_BAD = 2.0
"""Auto is held to ``VS_OFF`` x Off only where Off is more than this many times the best static."""


def numbers(text: str) -> list[int]:
    """``0-19``, ``3,7,9`` or both (``0-4,9``) as a sorted list of whole numbers."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def statics_of(seed: int) -> tuple[int, dict[str, offline.SpanFigures], float]:
    """One seed's static figures, and the CPU seconds they took (the workload's build included)."""
    t0 = time.process_time()
    workload, spans = randomized.random_phases(seed)
    return seed, offline.static_figures(workload, spans), time.process_time() - t0


STARTS = {"reflex": offline.REFLEX_START, "stock": offline.STOCK}
"""``--start``: where the fleet starts, and so which modes Auto tunes (``candidates.modes_for``)."""


def loop_of(task: tuple[int, float, dict[str, offline.SpanFigures], str]
            ) -> tuple[int, float, offline.RunJudgement, float]:  # fmt: skip
    """One (seed, offset): Auto judged, and the CPU seconds it took."""
    seed, offset, statics, start = task
    t0 = time.process_time()
    workload, spans = randomized.random_phases(seed)
    lset = offline.LoopSettings(start=STARTS[start])
    return seed, offset, offline.judge_loop(workload, spans, offset, statics, lset), time.process_time() - t0


def held_to_off(j: offline.RunJudgement) -> bool:
    return j.off_vs_best > OFF_BAD


def line(seed: int, offset: float, j: offline.RunJudgement, took_s: float) -> str:
    worst = j.worst_phase()
    first = j.worst_first()
    first_text = (f"{first.name} {first.first_s:.2f} s ({first.first_vs_oracle:.2f}x oracle's)"
                  if first else "-")  # fmt: skip
    off_text = f"{j.vs_off:.2f} (Off {j.off_vs_best:.1f}x best)" if held_to_off(j) else "-"
    return (f"seed {seed:3d} offset {offset:3g}: whole {j.auto_s:6.2f} s = {j.vs_best:5.2f}x best static "
            f"({j.best_static} {j.best_static_s:.2f} s); worst phase {worst.name} {worst.vs_oracle:5.2f}x "
            f"oracle ({worst.oracle} {worst.oracle_s:.2f} s); worst first {offline.FIRST_S:g} s {first_text}; "
            f"Auto/Off {off_text}; {j.moves} move(s), {took_s:.0f} s CPU")  # fmt: skip


def summary(rows: list[tuple[int, float, offline.RunJudgement]]) -> tuple[list[str], bool]:
    """The worst case of each figure over the sweep, and whether every target held."""
    def at(key: str, seed: int, offset: float) -> str:
        return f"{key} (seed {seed}, offset {offset:g})"

    whole = max(rows, key=lambda r: r[2].vs_best)
    phase = max(rows, key=lambda r: r[2].worst_phase().vs_oracle)
    firsts = [r for r in rows if r[2].worst_first() is not None]
    held = [r for r in rows if held_to_off(r[2])]
    wp = phase[2].worst_phase()
    lines = [f"WORST CASE over {len(rows)} run(s):",
             f"  whole run: {whole[2].vs_best:.2f}x the best static, "
             + at(f"{whole[2].auto_s:.2f} s against {whole[2].best_static} {whole[2].best_static_s:.2f} s", *whole[:2]),
             f"  phase: {wp.vs_oracle:.2f}x its oracle, "
             + at(f"{wp.name} ({wp.kind}) {wp.auto_s:.2f} s against {wp.oracle} {wp.oracle_s:.2f} s", *phase[:2])]
    if firsts:
        first = max(firsts, key=lambda r: r[2].worst_first().first_vs_oracle)  # type: ignore[union-attr]
        wf = first[2].worst_first()
        assert wf is not None
        lines.append(f"  first {offline.FIRST_S:g} s after a change: {wf.first_vs_oracle:.2f}x the oracle's, "
                     + at(f"{wf.name} ({wf.kind}) {wf.first_s:.2f} s against {wf.first_oracle_s:.2f} s", *first[:2]))
        slowest = max(firsts, key=lambda r: r[2].worst_first_s())
        lines.append(f"  first {offline.FIRST_S:g} s after a change, slowest: "
                     + at(f"{slowest[2].worst_first_s():.2f} s", *slowest[:2]))
    if held:
        off = max(held, key=lambda r: r[2].vs_off)
        lines.append(f"  Auto/Off where Off > {OFF_BAD:g}x the best static ({len(held)} run(s)): "
                     + at(f"{off[2].vs_off:.2f}", *off[:2]))
    else:
        lines.append(f"  Auto/Off: no run had Off > {OFF_BAD:g}x the best static")
    checks = [
        (f"whole <= {WHOLE_VS_BEST}x best static", whole[2].vs_best <= WHOLE_VS_BEST),
        (f"every phase <= {PHASE_VS_ORACLE}x its oracle", wp.vs_oracle <= PHASE_VS_ORACLE),
        (f"Auto <= {VS_OFF}x Off where Off > {OFF_BAD:g}x best static",
         all(r[2].vs_off <= VS_OFF for r in held)),
    ]
    lines += [f"  target {name}: {'holds' if ok else 'FAILS'}" for name, ok in checks]
    return lines, all(ok for _, ok in checks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-19", help="seeds: ranges and lists, 0-19 or 3,7 (default %(default)s)")
    ap.add_argument("--offsets", default="0,20,40", help="timer offsets, twin s, comma-separated (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default %(default)s)")
    ap.add_argument("--start", choices=sorted(STARTS), default="reflex",
                    help="the fleet's starting setting: the demo's reflex:4096/srpt (a reflex spec) or "
                    "stock (the ceiling and floor tuner) (default %(default)s)")
    ap.add_argument("--json", default=None, metavar="OUT", help="write every judgement and the summary to OUT")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    args = ap.parse_args()
    seeds = numbers(args.seeds)
    offsets = [float(o) for o in args.offsets.split(",")]
    t0 = time.monotonic()
    rows: list[tuple[int, float, offline.RunJudgement]] = []
    timings: dict[str, float] = {}
    """CPU seconds per task: the machine's cost, whatever else shares it (wall is that too)."""
    with multiprocessing.get_context("fork").Pool(max(1, args.jobs)) as pool:
        statics = {}
        for seed, figures, took in pool.imap(statics_of, seeds):
            statics[seed] = figures
            timings[f"statics {seed}"] = took
        tasks = [(seed, offset, statics[seed], args.start) for seed in seeds for offset in offsets]
        for seed, offset, judged, took in pool.imap(loop_of, tasks):
            rows.append((seed, offset, judged))
            timings[f"loop {seed} {offset:g}"] = took
            print(line(seed, offset, judged, took), flush=True)
    wall = time.monotonic() - t0
    lines, ok = summary(rows)
    cpu = {stage: sum(v for k, v in timings.items() if k.startswith(stage)) for stage in ("statics", "loop")}
    lines.append(f"wall {wall:.0f} s on {args.jobs} process(es); CPU: statics {cpu['statics']:.0f} s, "
                 f"loops {cpu['loop']:.0f} s (the slowest loop {max(v for k, v in timings.items() if k.startswith('loop')):.0f} s)")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"seeds": seeds, "offsets": offsets, "wall_s": wall, "timings_s": timings,
                       "runs": [{"seed": s, "offset": o, **asdict(j), "vs_best": j.vs_best, "vs_off": j.vs_off,
                                 "worst_phase_vs_oracle": j.worst_phase().vs_oracle} for s, o, j in rows],
                       "summary": lines, "targets_hold": ok}, out, indent=1)
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
