"""The engine admin client against a small aiohttp server standing in for the engine."""

from __future__ import annotations

import asyncio
from typing import Any

import loopback_app
import pytest
from aiohttp import web

from slipstream.api import models
from slipstream.engine import admin


async def with_engine(check: Any, refuse: bool = False) -> Any:
    state: dict[str, Any] = {"long_prefill_token_threshold": 4096, "long_prefill_mode": "ceiling",
                             "schedule_policy": "fcfs", "chunked_prefill_size": 8192}  # fmt: skip
    seen: list[str | None] = []

    async def info(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response(state)

    async def set_state(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer k3y":
            return web.json_response({"error": "unauthorized"}, status=401)
        body = await request.json()
        if refuse:
            return web.json_response({"updated": False, "message": "threshold not page-aligned"})
        state.update(body["server_args"])
        return web.json_response({"updated": True, "server_args": body["server_args"]})

    app = web.Application()
    app.router.add_get("/get_server_info", info)
    app.router.add_post("/set_internal_state", set_state)
    runner, url = await loopback_app.start(app)
    try:
        return await check(url, seen)
    finally:
        await runner.cleanup()


def test_apply_sets_the_triple_and_reads_it_back() -> None:
    async def check(url: str, seen: list[str | None]) -> None:
        client = admin.AdminClient(url, "k3y")
        before = admin.reported_setting(await client.get_server_info())
        assert before == models.EngineSetting(threshold=4096)
        after = await client.apply(models.EngineSetting(threshold=2048, mode="floor", schedule_policy="srpt"))
        assert after == models.EngineSetting(threshold=2048, mode="floor", schedule_policy="srpt")
        assert seen == ["Bearer k3y"] * 3

    asyncio.run(with_engine(check))


def test_wrong_key_and_refusal_raise() -> None:
    async def wrong_key(url: str, seen: list[str | None]) -> None:
        with pytest.raises(admin.AdminError) as raised:
            await admin.AdminClient(url, "nope").apply(models.EngineSetting(threshold=0))
        assert raised.value.status == 401

    async def refused(url: str, seen: list[str | None]) -> None:
        with pytest.raises(admin.AdminError, match="page-aligned"):
            await admin.AdminClient(url, "k3y").set_internal_state({"long_prefill_token_threshold": 100})

    asyncio.run(with_engine(wrong_key))
    asyncio.run(with_engine(refused, refuse=True))


def test_internal_state_names() -> None:
    assert admin.internal_state(models.EngineSetting(threshold=1024, mode="floor")) == {
        "long_prefill_token_threshold": 1024, "long_prefill_mode": "floor", "schedule_policy": "fcfs"}  # fmt: skip
