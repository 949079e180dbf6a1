"""``slipstream load``: replay traces against OpenAI-compatible servers, time-scaled.

Each trace request is sent at its (rate- and time-scaled) arrival as a streaming
``/v1/completions`` call with the tenant in the custom-labels header, its sizes, prefix
block ids and warm blocks (``Request.warm_blocks``: leading blocks the engine simulator
places in its prefix cache on arrival, as the twin does) in the ``slipstream`` field (the
engine simulator's exact input), and, by
default, a prompt of as many words as the trace has tokens, built from the block ids so
shared prefixes are shared text (a real server caches them too, but only what it
computed itself: it cannot know a warm block). Requests go round robin over the targets
in arrival order (request k to the (k mod n)-th of the targets listed at its send, sorted
as the callable gives them), which is how the twin's fleet model spreads them
(``slipstream.demo.offline.split``). TTFT is the wall time to
the first streamed token times the time scale, i.e. in twin seconds when the target is an
engine simulator running at the same ``--time-scale`` (which also states the exact value
in a response header, preferred when present). The run stops by itself: at the
trace's end, after ``max_requests``, or after ``duration_s`` wall seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import aiohttp

from slipstream.engine import metrics as engine_metrics
from slipstream.enginesim import shapes
from slipstream.sim import traces
from slipstream.sim.metrics import nearest_rank
from slipstream.sim.workload import Request

Targets = Sequence[str] | Callable[[], Sequence[str]]
"""Base URLs, or a callable giving the current ones (e.g. the ready pods of a Service)."""
DRAIN_S = 60.0
"""Wall seconds the requests in flight get to finish once sending stops."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request: TTFT in twin seconds (wall x time scale), NaN when it failed."""

    tenant: str
    rid: str
    ttft_s: float
    ok: bool
    error: str = ""
    target: str = ""
    late_s: float = 0.0
    """Twin seconds the request was sent after its arrival time (the load fell behind)."""


class LoadError(ValueError):
    """Bad options for a replay; the message names the option."""


def prompt_words(req: Request) -> str:
    """As many words as the prompt has tokens; equal blocks give equal text."""
    return " ".join(" ".join([f"b{b:x}"] * size) for b, size in zip(req.blocks, req.block_sizes, strict=True))


def body_of(req: Request, model: str, prompt: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt_words(req) if prompt == "words" else "x",
        "max_tokens": max(1, req.output_tokens),
        "stream": True,
        "slipstream": {"prompt_tokens": req.prompt_tokens, "blocks": list(req.blocks),
                       "block_sizes": list(req.block_sizes), "warm_blocks": req.warm_blocks},
    }


def summary_line(outcomes: Sequence[Outcome], elapsed_s: float, in_flight: int) -> str:
    tenants: dict[str, list[float]] = {}
    failed = 0
    for o in outcomes:
        if o.ok:
            tenants.setdefault(o.tenant, []).append(o.ttft_s)
        else:
            failed += 1
    parts = [f"{name or '-'}: n={len(v)} p50={nearest_rank(v, 50):.2f}s p99={nearest_rank(v, 99):.2f}s"
             for name, v in sorted(tenants.items())]
    return (f"[{elapsed_s:7.1f}s] TTFT (twin s) " + (" | ".join(parts) or "no answers yet")
            + f"  (in flight {in_flight}, failed {failed})")


class _Replay:
    def __init__(self, targets: Targets, time_scale: float, headers: dict[str, str], model: str,
                 prompt: str, timeout_s: float) -> None:
        self.targets = targets
        self.time_scale = time_scale
        self.headers = headers
        self.model = model
        self.prompt = prompt
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.outcomes: list[Outcome] = []
        self.in_flight = 0

    def pick(self, index: int) -> str | None:
        """Round robin in request order: the request at ``index`` (its place in arrival
        order) goes to the ``index mod n``-th of the n targets listed now, as
        ``slipstream.demo.offline.split`` spreads requests over the twin's engines; a
        request that found no target takes its turn with it, so the rest keep theirs."""
        urls = list(self.targets() if callable(self.targets) else self.targets)
        if not urls:
            return None
        return urls[index % len(urls)].rstrip("/")

    async def send(self, session: aiohttp.ClientSession, req: Request, due: float, index: int = 0) -> None:
        """Send ``req`` (the ``index``-th in arrival order), due at monotonic time ``due``;
        its Outcome says how late it went."""
        late = max(0.0, time.monotonic() - due) * self.time_scale
        target = self.pick(index)
        if target is None:
            self.outcomes.append(Outcome(req.tenant, req.rid, math.nan, False, "no target ready", late_s=late))
            return
        headers = {**self.headers,
                   engine_metrics.CUSTOM_LABELS_HEADER: json.dumps({"tenant": req.tenant})}
        self.in_flight += 1
        start = time.monotonic()
        ttft = math.nan
        try:
            async with session.post(target + "/v1/completions", json=body_of(req, self.model, self.prompt),
                                    headers=headers, timeout=self.timeout) as resp:
                if resp.status >= 400:
                    text = (await resp.text())[:200]
                    self.outcomes.append(Outcome(req.tenant, req.rid, math.nan, False,
                                                 f"HTTP {resp.status}: {text}", target, late))
                    return
                async for line in resp.content:
                    if math.isnan(ttft) and line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                        ttft = (time.monotonic() - start) * self.time_scale
                # A simulator's exact value beats the wall measurement, which carries the
                # HTTP and event-loop delays times the time scale.
                exact = resp.headers.get(shapes.TTFT_HEADER)
                if exact is not None and not math.isnan(ttft):
                    with contextlib.suppress(ValueError):
                        ttft = float(exact)
            ok = not math.isnan(ttft)
            self.outcomes.append(Outcome(req.tenant, req.rid, ttft, ok, "" if ok else "no token streamed",
                                         target, late))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.outcomes.append(Outcome(req.tenant, req.rid, math.nan, False,
                                         f"{type(exc).__name__}: {exc}"[:200], target, late))
        finally:
            self.in_flight -= 1


async def replay_async(
    requests: Sequence[Request],
    targets: Targets,
    time_scale: float = 1.0,
    *,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    headers: dict[str, str] | None = None,
    model: str = "default",
    prompt: str = "words",
    report_every_s: float | None = 5.0,
    out: TextIO | None = None,
    timeout_s: float = 600.0,
    drain_s: float = DRAIN_S,
    stop: Callable[[], bool] | None = None,
) -> list[Outcome]:
    """Send ``requests`` at their arrivals / (rate_scale x time_scale) wall seconds; returns
    one Outcome per request sent, in completion order. ``stop`` (e.g. a threading.Event's
    ``is_set``) ends the sending early, checked at least every 0.1 s; the requests in
    flight then get ``drain_s`` to finish."""
    if not time_scale > 0 or not rate_scale > 0:
        raise LoadError(f"time scale and rate scale must be > 0, got {time_scale} and {rate_scale}")
    if duration_s is not None and not duration_s > 0:
        raise LoadError(f"duration must be > 0 seconds, got {duration_s}")
    if max_requests is not None and max_requests < 1:
        raise LoadError(f"max requests must be >= 1, got {max_requests}")
    if prompt not in ("words", "field"):
        raise LoadError(f"prompt must be 'words' or 'field', got {prompt!r}")
    stream = out if out is not None else sys.stdout
    run = _Replay(targets, time_scale, dict(headers or {}), model, prompt, timeout_s)
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    if max_requests is not None:
        ordered = ordered[:max_requests]
    t0 = time.monotonic()
    first = ordered[0].arrival_s if ordered else 0.0
    deadline = t0 + duration_s if duration_s is not None else math.inf
    tasks: set[asyncio.Task[None]] = set()

    async def report() -> None:
        while report_every_s:
            await asyncio.sleep(report_every_s)
            print(summary_line(run.outcomes, time.monotonic() - t0, run.in_flight), file=stream, flush=True)

    connector = aiohttp.TCPConnector(limit=1000)
    async with aiohttp.ClientSession(connector=connector) as session:
        reporter = asyncio.create_task(report())
        try:
            for index, req in enumerate(ordered):
                at = t0 + (req.arrival_s - first) / (rate_scale * time_scale)
                if at >= deadline or not await _wait_until(at, stop):
                    break
                task = asyncio.create_task(run.send(session, req, at, index))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                _, late = await asyncio.wait(set(tasks), timeout=drain_s)
                for task in late:
                    task.cancel()
                for task in late:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
    if report_every_s:
        print(summary_line(run.outcomes, time.monotonic() - t0, 0), file=stream, flush=True)
    return run.outcomes


async def _wait_until(at: float, stop: Callable[[], bool] | None) -> bool:
    """Sleep until monotonic time ``at``; False if ``stop`` said so first."""
    while True:
        if stop is not None and stop():
            return False
        delay = at - time.monotonic()
        if delay <= 0:
            return True
        await asyncio.sleep(min(delay, 0.1) if stop is not None else delay)


def replay(requests: Sequence[Request], targets: Targets, time_scale: float = 1.0,
           **options: Any) -> list[Outcome]:
    """``replay_async`` in a fresh event loop (from synchronous code)."""
    return asyncio.run(replay_async(requests, targets, time_scale, **options))


def parse_headers(items: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise LoadError(f"--header {item!r}: use NAME:VALUE, e.g. 'Authorization:Bearer KEY'")
        headers[key.strip()] = value.strip()
    return headers


def main(args: Any) -> int:
    """``slipstream load``: exit 0 when some requests were answered, 1 when none were."""
    for url in args.target:
        if not url.startswith(("http://", "https://")):
            raise LoadError(f"--target {url!r}: give a base URL such as http://127.0.0.1:30000")
    workload = traces.load_many(args.trace, args.tenant)
    outcomes = replay(workload.requests, args.target, args.time_scale, rate_scale=args.rate_scale,
                      duration_s=args.duration, max_requests=args.max_requests,
                      headers=parse_headers(args.header), model=args.model, prompt=args.prompt,
                      report_every_s=args.report_every)
    if args.json:
        by_tenant: dict[str, list[float]] = {}
        for o in outcomes:
            if o.ok:
                by_tenant.setdefault(o.tenant, []).append(o.ttft_s)
        print(json.dumps({
            "sent": len(outcomes),
            "failed": sum(1 for o in outcomes if not o.ok),
            "tenants": {t: {"n": len(v), "ttft_p50_s": nearest_rank(v, 50), "ttft_p99_s": nearest_rank(v, 99)}
                        for t, v in sorted(by_tenant.items())},
        }, indent=1))
    if not any(o.ok for o in outcomes):
        first_error = next((o.error for o in outcomes if o.error), "nothing was sent")
        print(f"slipstream load: no request was answered ({len(outcomes)} sent); first error: "
              f"{first_error}", file=sys.stderr)
        return 1
    return 0
