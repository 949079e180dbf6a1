"""The engine simulator's HTTP server (aiohttp): the patched engine's endpoints over a SimPod.

Serving: /v1/completions, /v1/chat/completions (SSE when ``stream``), /generate,
/v1/models, /health, /get_server_info and /server_info (secrets redacted). Admin
(``Authorization: Bearer <admin key>``): /set_internal_state, POST/GET /slipstream/faults.
Metrics: /metrics (with ``--enable-metrics``, as SGLang). Bodies over ``MAX_BODY_BYTES``
get 413, malformed ones 400, unknown paths 404: always a JSON error, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from slipstream.engine import args as engine_args
from slipstream.enginesim import admin, bodies, flags, metrics, shapes
from slipstream.enginesim.bodies import BodyError
from slipstream.enginesim.pod import SimPod, Tracked, TwinFailed

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest request body accepted: a 1M-token prompt as token ids fits; more is refused."""
TTFT_HEADER = shapes.TTFT_HEADER
STREAM_INTERVAL_S = 0.05
"""Wall seconds between SSE chunks while a stream decodes (bounds wake-ups per stream)."""

log = logging.getLogger("slipstream.enginesim")
POD = web.AppKey("pod", SimPod)
RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_body(status: int, message: str) -> dict[str, Any]:
    """SGLang's OpenAI-style ErrorResponse."""
    kind = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
            404: "NotFoundError", 405: "MethodNotAllowed", 413: "RequestTooLarge"}
    return {"object": "error", "message": message, "type": kind.get(status, "InternalServerError"),
            "param": None, "code": status}


@web.middleware
async def json_errors(request: web.Request, handler: RouteHandler) -> web.StreamResponse:
    """Every failure as one JSON body; the traceback goes to the log, never to the client."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        return web.json_response(error_body(413, f"body of {length} bytes is over the limit of "
                                            f"{MAX_BODY_BYTES} bytes"), status=413)
    try:
        return await handler(request)
    except BodyError as exc:
        return web.json_response(error_body(400, str(exc)), status=400)
    except TwinFailed as exc:
        return web.json_response(error_body(500, str(exc)), status=500)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason
        if exc.status == 413:
            message = f"body is over the limit of {MAX_BODY_BYTES} bytes"
        return web.json_response(error_body(exc.status, message), status=exc.status)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("engine-sim: %s %s failed", request.method, request.path)
        return web.json_response(error_body(500, "internal error in the engine simulator "
                                            "(see its log)"), status=500)


async def read_json(request: web.Request) -> dict[str, Any]:
    return bodies.parse_json(await request.read())


def admin_refusal(request: web.Request) -> web.Response | None:
    """401 without the right bearer key, 403 when the server has none (never unguarded)."""
    key = request.app[POD].cfg.admin_api_key
    if not key:
        return web.json_response({"error": (
            "This endpoint requires the admin API key, but this server was started without one: "
            f"set {engine_args.ADMIN_API_KEY_ENV} or --admin-api-key-file")}, status=403)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), key.encode()):
        return web.json_response({"error": "Unauthorized"}, status=401)
    return None


async def admin_fault(request: web.Request, write: bool = False) -> web.StreamResponse | None:
    """The injected admin fault, if any: 500, a request never answered, or a dropped
    connection; `write-error` is a 500 for changes only (``write``), the reads answering."""
    pod = request.app[POD]
    fault = pod.faults.admin
    if fault == "error" or (fault == "write-error" and write):
        return web.json_response(error_body(500, "injected admin fault"), status=500)
    if fault == "timeout":
        await pod.closing.wait()
        return web.json_response(error_body(503, "engine simulator shutting down"), status=503)
    if fault == "refuse":
        if request.transport is not None:
            request.transport.abort()  # the client sees the connection reset, no answer
        return web.Response(status=503)
    return None


async def health(request: web.Request) -> web.Response:
    failure = request.app[POD].failure
    if failure is not None:
        return web.json_response(error_body(503, failure), status=503)
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    name = request.app[POD].cfg.model_name
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "sglang", "root": name}]})


async def server_info(request: web.Request) -> web.StreamResponse:
    """Open to any client, as SGLang's (its secrets are redacted)."""
    refused = await admin_fault(request)
    if refused is not None:
        return refused
    pod = request.app[POD]
    extra = {"profile": pod.profile.name, "time_scale": pod.clock.time_scale,
             "pod_name": pod.cfg.pod_name, "twin_now_s": pod.clock.now(),
             "requests_served": pod.served, "requests_in_flight": pod.in_flight}
    return web.json_response(admin.server_info(pod.cfg, pod.live, pod.driver.partials, extra,
                                               pod.driver.kv_pool_tokens))


async def set_internal_state(request: web.Request) -> web.StreamResponse:
    refused = admin_refusal(request) or await admin_fault(request, write=True)
    if refused is not None:
        return refused
    pod = request.app[POD]
    updates = admin.server_args_of(await read_json(request))
    reason = pod.set_state(updates)
    if reason is not None:
        log.warning("engine-sim%s: set_internal_state refused: %s", _pod(pod), reason)
    else:
        log.info("engine-sim%s: long-prefill settings updated: %s", _pod(pod), updates)
    body = {"updated": reason is None, "reason": reason, "server_args": updates}
    return web.json_response(body, status=200 if reason is None else 400)


async def faults(request: web.Request) -> web.Response:
    refused = admin_refusal(request)
    if refused is not None:
        return refused
    pod = request.app[POD]
    if request.method == "POST":
        pod.faults = admin.faults_of(await read_json(request), pod.faults)
        log.warning("engine-sim%s: faults now %s", _pod(pod), pod.faults)
    f = pod.faults
    return web.json_response({"ttft_multiplier": f.ttft_multiplier,
                              "ttft_multiplier_at_threshold": f.ttft_multiplier_at_threshold,
                              "admin": f.admin, "metrics": f.metrics})


async def prometheus(request: web.Request) -> web.Response:
    pod = request.app[POD]
    if pod.faults.metrics == "error":
        return web.json_response(error_body(500, "injected metrics fault"), status=500)
    if pod.faults.metrics == "garbage":
        return web.Response(body=b"sglang:num_queue_reqs{{{ not prometheus \x00 text\n",
                            headers={"Content-Type": metrics.CONTENT_TYPE})
    return web.Response(body=pod.scrape(), headers={"Content-Type": metrics.CONTENT_TYPE})


def serving(kind: str, parse: Callable[[dict[str, Any]], bodies.Incoming]) -> RouteHandler:
    async def handle(request: web.Request) -> web.StreamResponse:
        pod = request.app[POD]
        inc = parse(await read_json(request))
        bodies.check_length(inc, pod.cfg.context_length, pod.driver.kv_pool_tokens)
        labels = bodies.tenant_labels(request.headers.get(pod.cfg.labels_header), pod.cfg.allowed_labels)
        tracked = pod.submit(inc, labels)
        shape = shapes.Shapes(kind, tracked.rid, pod.cfg.model_name, inc)
        try:
            if not inc.stream:
                await _until(pod, tracked.done)
                if tracked.e2e_s < 0:
                    _refused(pod, tracked)
                return web.json_response(shape.full(tracked.job.cached, tracked.e2e_s),
                                         headers={TTFT_HEADER: f"{tracked.ttft_s:.6f}"})
            return await _stream(request, pod, tracked, shape)
        except asyncio.CancelledError:  # the client went away
            pod.abort(tracked)
            raise

    return handle


async def _until(pod: SimPod, event: asyncio.Event) -> None:
    if not event.is_set():
        closing = asyncio.ensure_future(pod.closing.wait())
        waiting = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait((closing, waiting), return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            waiting.cancel()
    if not event.is_set():
        raise web.HTTPServiceUnavailable(reason="engine simulator shutting down")


def _refused(pod: SimPod, t: Tracked) -> None:
    """A request released without tokens: the twin refused it, or the twin failed."""
    if t.rejected:
        raise BodyError(f"the request ({t.inc.prompt_tokens} prompt + {t.inc.output_tokens} output "
                        "tokens) cannot fit the engine's KV pool")
    raise TwinFailed(pod.failure or "the simulated engine failed")


async def _stream(request: web.Request, pod: SimPod, t: Tracked, shape: shapes.Shapes) -> web.StreamResponse:
    await _until(pod, t.first)
    if t.ttft_s < 0:
        _refused(pod, t)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", TTFT_HEADER: f"{t.ttft_s:.6f}"})
    await response.prepare(request)
    sent = 0
    while True:
        last = t.done.is_set()
        n = t.tokens_at(pod.clock.now())
        for event in shape.chunk(n - sent, sent, last, t.job.cached, t.e2e_s):
            await response.write(event)
        sent = n
        if last:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(t.done.wait(), STREAM_INTERVAL_S)
        if pod.closing.is_set() or pod.failure is not None:
            break
    await response.write(shapes.DONE)
    await response.write_eof()
    return response


def _pod(pod: SimPod) -> str:
    return f"[{pod.cfg.pod_name}]" if pod.cfg.pod_name else ""


def build_app(pod: SimPod) -> web.Application:
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
    app[POD] = pod
    r = app.router
    r.add_get("/health", health)
    r.add_get("/health_generate", health)
    r.add_get("/v1/models", models)
    r.add_get("/get_server_info", server_info)
    r.add_get("/server_info", server_info)
    r.add_route("POST", "/set_internal_state", set_internal_state)
    r.add_route("PUT", "/set_internal_state", set_internal_state)
    r.add_get("/slipstream/faults", faults)
    r.add_post("/slipstream/faults", faults)
    if pod.cfg.enable_metrics:
        r.add_get("/metrics", prometheus)
    r.add_post("/v1/completions", serving("completion", bodies.completion))
    r.add_post("/v1/chat/completions", serving("chat", bodies.chat))
    r.add_post("/generate", serving("generate", bodies.generate))
    return app


@dataclass
class Running:
    """A started simulator: its URL, and ``close()`` to stop it."""

    pod: SimPod
    runner: web.AppRunner
    url: str
    port: int

    async def close(self) -> None:
        await self.pod.stop()
        await self.runner.cleanup()


async def start(cfg: flags.SimConfig) -> Running:
    """Start one simulator on ``cfg.host:cfg.port`` (port 0: a free one) in the running loop."""
    pod = SimPod(cfg)
    pod.start()
    runner = web.AppRunner(build_app(pod), handler_cancellation=True, access_log=None,
                           shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.host, cfg.port)
        await site.start()
    except BaseException:
        await pod.stop()
        await runner.cleanup()
        raise
    port = runner.addresses[0][1]
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    return Running(pod, runner, f"http://{host}:{port}", port)


class InThread:
    """A simulator on its own event loop in a daemon thread, for synchronous callers
    (tests that scrape it with Prometheus or drive it with blocking clients)::

        sim = InThread(flags.parse(["--port", "0", "--enable-metrics"]))
        ... sim.url ...
        sim.close()
    """

    def __init__(self, cfg: flags.SimConfig, start_timeout_s: float = 30.0) -> None:
        import concurrent.futures
        import threading

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="engine-sim", daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(start(cfg), self.loop)
        try:
            self.running = future.result(start_timeout_s)
        except (Exception, concurrent.futures.TimeoutError):
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            raise
        self.url = self.running.url
        self.pod = self.running.pod

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> InThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def serve_forever(cfg: flags.SimConfig) -> None:
    running = await start(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    c = cfg
    setting = f"T={c.threshold} mode={c.mode} order={c.schedule_policy}"
    print(f"engine-sim{_pod(running.pod)} listening on {running.url} ({setting}, "
          f"profile {running.pod.profile.name}, time scale {c.time_scale:g}, admin key "
          f"{'set' if c.admin_api_key else 'NOT set: settings cannot change'})", flush=True)
    try:
        await stop.wait()
    finally:
        await running.close()


def main(ns: Any, extra: list[str]) -> int:
    """``slipstream engine-sim``: validate the flags, then serve until SIGINT/SIGTERM."""
    cfg = flags.config_from(ns)
    ignored = flags.ignored_flags(extra)
    if ignored:
        print(f"engine-sim: ignoring launch_server flags the simulator does not model: "
              f"{' '.join(ignored)}", file=sys.stderr, flush=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    asyncio.run(serve_forever(cfg))
    return 0


__all__ = ["MAX_BODY_BYTES", "InThread", "Running", "build_app", "main", "start"]
