"""Per-pass cost of srpt's sort and prefix matching on the real SchedulePolicy.

    bash engine_image/test-env/setup.sh  # then, with that environment's python:
    PYTHONPATH=<env>/patched <env>/bin/python tests/engine/bench_srpt_cost.py

Queues 1,000 and 3,000 8K-token prompts on a harness engine (real RadixCache, real
SchedulePolicy.calc_priority, the call each scheduling pass makes) and prints the median
milliseconds per call (and the least) for: srpt bounded (long_prefill.SRPT_REMATCH_MAX), the same with
the prefix match replaced by a no-op (what is left: keying, the loop over the kept keys and
the sort; the difference is the K prefix matches), srpt unbounded (every waiting request
re-matched, as before the bound), stock lpm and stock fcfs; and stock lpm at 128 queued,
where it prefix-matches every waiting request: the same K matches srpt makes per pass."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from sglang.srt.managers import long_prefill as lp  # noqa: E402
from sglang.srt.managers import schedule_policy as sp  # noqa: E402

MATCH_NAME = "match_kv_cache" if h.V0523 else "match_prefix_for_req"
"""The prefix-match function calc_priority calls, per version (as test_issue19.py)."""


def per_pass_ms(
    policy: str, queued: int, limit: int | None, passes: int = 21, match: bool = True
) -> tuple[float, float]:
    """(median, least) milliseconds of ``passes - 1`` calc_priority calls (the first, which
    keys every request, left out). The least is the code's own cost; the median also
    holds what other processes on a shared machine took from it."""
    eng = h.make_engine(policy=policy, threshold=2048 if h.PATCHED else 0, kv_tokens=100_000)
    for i in range(queued):
        eng.add(8192, arrival=float(i) * 1e-3)
    saved, real_match = lp.SRPT_REMATCH_MAX, getattr(sp, MATCH_NAME)
    if limit is not None:
        lp.SRPT_REMATCH_MAX = limit
    if not match:
        setattr(sp, MATCH_NAME, lambda *a, **kw: None)
    try:
        times = []
        for _ in range(passes):
            t = time.perf_counter()
            eng.s.policy.calc_priority(eng.s.waiting_queue, eng.s.running_batch)
            times.append((time.perf_counter() - t) * 1e3)
    finally:
        lp.SRPT_REMATCH_MAX = saved
        setattr(sp, MATCH_NAME, real_match)
    return statistics.median(times[1:]), min(times[1:])


def main() -> None:
    print(f"sglang {'0.5.23' if h.V0523 else '0.5.18'}, K = {lp.SRPT_REMATCH_MAX}")
    for queued in (1000, 3000):
        row = {
            "srpt bounded": per_pass_ms("srpt", queued, None),
            "of it without the prefix matches": per_pass_ms("srpt", queued, None, match=False),
            "srpt unbounded": per_pass_ms("srpt", queued, 10**9),
            "lpm": per_pass_ms("lpm", queued, None),
            "fcfs": per_pass_ms("fcfs", queued, None),
        }
        print(f"{queued} queued (median, least of 20 passes): "
              + ", ".join(f"{k} {med:.1f} ms ({least:.1f})" for k, (med, least) in row.items()))
    # Stock's own cost of the same K prefix matches: lpm matches every waiting request up
    # to 128 waiting (its limit), so at 128 it pays what srpt pays at any length.
    med, least = per_pass_ms("lpm", lp.SRPT_REMATCH_MAX, None)
    print(f"{lp.SRPT_REMATCH_MAX} queued, stock lpm (matches all {lp.SRPT_REMATCH_MAX}): "
          f"{med:.1f} ms ({least:.1f})")


if __name__ == "__main__":
    main()
