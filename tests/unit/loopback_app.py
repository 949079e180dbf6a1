"""Serve an aiohttp app on 127.0.0.1 and a free port, for tests of HTTP clients."""

from __future__ import annotations

from aiohttp import web


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    """(runner to clean up, base URL)."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"
