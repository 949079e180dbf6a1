"""A minimal stand-in for an engine's admin API, for the rollout's cluster tests until the
engine simulator (`slipstream engine-sim`) is on main: `/get_server_info` (secrets
redacted), `/set_internal_state` (admin key required, same validation as the patch),
`/health`, and `POST /slipstream/faults` with the simulator's `{"admin": "ok" | "error" |
"timeout"}` so the tests can move to the simulator unchanged.

Each stub listens on 127.0.0.1 and a free port, in a thread of the test process.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class EngineStub:
    def __init__(self, key: str, threshold: int, chunk: int = 8192, page: int = 64) -> None:
        self.key = key
        self.state: dict[str, Any] = {
            "long_prefill_token_threshold": threshold, "long_prefill_mode": "ceiling", "schedule_policy": "fcfs",
            "chunked_prefill_size": chunk, "page_size": page, "admin_api_key": None,
        }  # fmt: skip
        self.admin = "ok"
        self.sets = 0
        self.unauthorized = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""

    # the server

    async def _info(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.state)

    async def _set(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            self.unauthorized += 1
            return web.json_response({"error": "admin key required"}, status=401)
        if self.admin == "error":
            return web.json_response({"error": "injected"}, status=503)
        if self.admin == "timeout":
            await asyncio.sleep(60)
        args = (await request.json()).get("server_args", {})
        t = args.get("long_prefill_token_threshold", self.state["long_prefill_token_threshold"])
        if not isinstance(t, int) or t < 0 or t % self.state["page_size"] or t > self.state["chunked_prefill_size"]:
            return web.json_response({"updated": False, "message": f"invalid threshold {t}"})
        self.state.update({k: v for k, v in args.items() if k in self.state})
        self.sets += 1
        return web.json_response({"updated": True, "server_args": args})

    async def _faults(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.json_response({"error": "admin key required"}, status=401)
        self.admin = (await request.json()).get("admin", "ok")
        return web.json_response({"admin": self.admin})

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/get_server_info", self._info)
        app.router.add_get("/server_info", self._info)
        app.router.add_post("/set_internal_state", self._set)
        app.router.add_post("/slipstream/faults", self._faults)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def start(self) -> EngineStub:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def threshold(self) -> int:
        return int(self.state["long_prefill_token_threshold"])
