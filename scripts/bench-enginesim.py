"""Measure one engine simulator under the load generator: wall time and CPU (server + client).

Usage: .venv/bin/python scripts/bench-enginesim.py [N_REQUESTS] [TIME_SCALE]
Replays the first N requests of the shared Mooncake conversation trace (--prompt field)
against one simulator on 127.0.0.1 in this process; prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path

from slipstream.enginesim import flags, load, server
from slipstream.sim import traces

TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake_fast25/conversation_trace.jsonl"


async def main(n: int, scale: float) -> None:
    cfg = flags.parse(["--port", "0", "--enable-metrics", "--time-scale", str(scale)], {})
    running = await server.start(cfg)
    try:
        reqs = traces.load(TRACE, "conv").requests[:n]
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        outs = await load.replay_async(reqs, [running.url], scale, prompt="field", report_every_s=None)
        wall, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_SELF)
    finally:
        await running.close()
    print(json.dumps({"requests": n, "ok": sum(o.ok for o in outs), "time_scale": scale,
                      "trace_span_s": round(reqs[-1].arrival_s - reqs[0].arrival_s, 1),
                      "wall_s": round(wall, 2),
                      "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2)}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300,
                     float(sys.argv[2]) if len(sys.argv) > 2 else 20.0))
