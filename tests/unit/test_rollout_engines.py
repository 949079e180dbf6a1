"""The rollout's edge against real HTTP servers on 127.0.0.1: reads and sets all pods at once,
and every failure (5xx, timeout, refused, garbage) comes back as data, never raised."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import loopback_app
from aiohttp import web

from slipstream.api import models
from slipstream.engine import admin
from slipstream.localkube import ports
from slipstream.rollout import engines


async def serve(behaviour: str) -> tuple[web.AppRunner, str, dict[str, Any]]:
    state: dict[str, Any] = {"long_prefill_token_threshold": 4096, "long_prefill_mode": "ceiling",
                             "schedule_policy": "fcfs", "admin_api_key": None}  # fmt: skip

    async def info(request: web.Request) -> web.StreamResponse:
        if behaviour == "garbage":
            return web.Response(text="<html>not json</html>")
        return web.json_response(state)

    async def set_state(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != "Bearer k3y":
            return web.json_response({"error": "unauthorized"}, status=401)
        if behaviour == "error":
            return web.json_response({"error": "boom"}, status=503)
        if behaviour == "slow":
            await asyncio.sleep(2)
        state.update((await request.json())["server_args"])
        return web.json_response({"updated": True})

    app = web.Application()
    app.router.add_get("/get_server_info", info)
    app.router.add_post("/set_internal_state", set_state)
    runner, url = await loopback_app.start(app)
    return runner, url, state


def test_every_failure_is_data_and_pods_are_called_at_once() -> None:
    async def run() -> None:
        servers = {name: await serve(name) for name in ("ok", "error", "slow", "garbage")}
        urls = {name: url for name, (_, url, _) in servers.items()}
        urls["refused"] = f"http://127.0.0.1:{ports.free_ports(1)[0]}"
        urls["wrong-key"] = urls["ok"]

        def client(pod: str) -> admin.AdminClient:
            return admin.AdminClient(urls[pod], "nope" if pod == "wrong-key" else "k3y", timeout_seconds=1.0)

        try:
            read = {p.name: p for p in await engines.read(sorted(urls), client)}
            assert read["ok"].setting == models.EngineSetting(threshold=4096) and read["ok"].error == ""
            assert read["refused"].setting is None and "connection refused" in read["refused"].error
            assert read["garbage"].setting is None and "bad answer" in read["garbage"].error

            new = models.EngineSetting(threshold=2048, schedule_policy="srpt")
            began = time.monotonic()
            done = await engines.apply({pod: new for pod in urls}, client)
            took = time.monotonic() - began
            assert done["ok"].setting == new and servers["ok"][2]["long_prefill_token_threshold"] == 2048
            assert "HTTP 503" in done["error"].error and done["error"].setting is None
            assert "timed out" in done["slow"].error
            assert "HTTP 401" in done["wrong-key"].error
            assert "connection refused" in done["refused"].error
            assert took < 2.5, f"pods were called one after another ({took:.1f} s)"
        finally:
            for runner, _, _ in servers.values():
                await runner.cleanup()

    asyncio.run(run())
