"""kopf's connections to the kube-apiserver are bounded (controller.clients.apisession), and the
blocking client keeps as many connections as the threads that share it (controller.clients.kube)."""

from __future__ import annotations

import asyncio

import kopf
from aiohttp import web

from slipstream.controller.clients import apisession
from slipstream.controller.clients import kube as kube_


def info(server: str) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=server, token="t0ken", scheme="Bearer", default_namespace="ops")


async def most_connections_at_once(limit: int, requests: int) -> tuple[int, set[str]]:
    """`requests` at once through a bounded session to a server that holds each one until
    all that can arrive have arrived; the most connections it saw open at once."""
    peers: set[tuple[str, int]] = set()
    most = 0
    authorizations: set[str] = set()
    arrived = asyncio.Event()
    inside = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal most, inside
        peers.add(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        authorizations.add(request.headers.get("Authorization", ""))
        inside += 1
        most = max(most, inside)
        if inside >= min(limit, requests):
            arrived.set()
        await asyncio.wait_for(arrived.wait(), 10)
        inside -= 1
        return web.json_response({"kind": "Status"})

    app = web.Application()
    app.router.add_get("/api", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    context = apisession.bounded(info(f"http://127.0.0.1:{port}"), limit)
    try:
        async def one() -> int:
            async with context.aiohttp_session.get(f"http://127.0.0.1:{port}/api") as response:
                return response.status

        statuses = await asyncio.gather(*(one() for _ in range(requests)))
        assert statuses == [200] * requests
        assert context.server == f"http://127.0.0.1:{port}" and context.default_namespace == "ops"
    finally:
        await context.aiohttp_session.close()
        await runner.cleanup()
    return max(most, 0), authorizations


def test_kopfs_session_holds_at_most_the_limit_of_connections_with_the_same_credentials() -> None:
    most, authorizations = asyncio.run(most_connections_at_once(limit=10, requests=40))
    assert most == 10, f"{most} requests were in flight at once"
    assert authorizations == {"Bearer t0ken"}


def test_the_limit_leaves_room_for_kopfs_watch_streams() -> None:
    most, _ = asyncio.run(most_connections_at_once(limit=1, requests=20))
    assert most == apisession.MIN_CONNECTIONS


def test_the_blocking_client_keeps_a_connection_per_thread_that_shares_it() -> None:
    assert kube_.Kube(info("https://127.0.0.1:1"), pool_size=40).pool.connection_pool_kw["maxsize"] == 40
