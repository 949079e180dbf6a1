"""Per-pass cost of srpt's sort and prefix matching on the real SchedulePolicy.

    bash engine_image/test-env/setup.sh  # then, with that environment's python:
    PYTHONPATH=<env>/patched <env>/bin/python tests/engine/bench_srpt_cost.py

Queues 1,000 and 3,000 8K-token prompts on a harness engine (real RadixCache, real
SchedulePolicy.calc_priority, the call each scheduling pass makes) and prints the median
milliseconds per call for: srpt bounded (long_prefill.SRPT_REMATCH_MAX), srpt unbounded
(every waiting request re-matched, as before the bound), stock lpm and stock fcfs."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from sglang.srt.managers import long_prefill as lp  # noqa: E402


def per_pass_ms(policy: str, queued: int, limit: int | None, passes: int = 7) -> float:
    eng = h.make_engine(policy=policy, threshold=2048 if h.PATCHED else 0, kv_tokens=100_000)
    for i in range(queued):
        eng.add(8192, arrival=float(i) * 1e-3)
    saved = lp.SRPT_REMATCH_MAX
    if limit is not None:
        lp.SRPT_REMATCH_MAX = limit
    try:
        times = []
        for _ in range(passes):
            t = time.perf_counter()
            eng.s.policy.calc_priority(eng.s.waiting_queue, eng.s.running_batch)
            times.append((time.perf_counter() - t) * 1e3)
    finally:
        lp.SRPT_REMATCH_MAX = saved
    return statistics.median(times[1:])


def main() -> None:
    print(f"sglang {'0.5.23' if h.V0523 else '0.5.18'}, K = {lp.SRPT_REMATCH_MAX}")
    for queued in (1000, 3000):
        row = {
            "srpt bounded": per_pass_ms("srpt", queued, None),
            "srpt unbounded": per_pass_ms("srpt", queued, 10**9),
            "lpm": per_pass_ms("lpm", queued, None),
            "fcfs": per_pass_ms("fcfs", queued, None),
        }
        print(f"{queued} queued: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()))


if __name__ == "__main__":
    main()
