"""Helpers for the engine simulator's tests: start one on 127.0.0.1 (a free port), call it."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from slipstream.enginesim import flags, server

KEY = "k3y-for-tests"
ADMIN = {"Authorization": f"Bearer {KEY}"}


def config(*argv: str, key: str | None = KEY) -> flags.SimConfig:
    return flags.parse(["--host", "127.0.0.1", "--port", "0", "--enable-metrics",
                        "--tokenizer-metrics-allowed-custom-labels", "tenant", *argv],
                       {"SLIPSTREAM_ADMIN_API_KEY": key} if key else {})


async def with_sim(check: Callable[[str, aiohttp.ClientSession], Awaitable[Any]], *argv: str,
                   key: str | None = KEY) -> Any:
    running = await server.start(config(*argv, key=key))
    try:
        async with aiohttp.ClientSession() as session:
            return await check(running.url, session)
    finally:
        await running.close()


def tenant(name: str) -> dict[str, str]:
    return {"x-custom-labels": json.dumps({"tenant": name})}


def sse_events(raw: str) -> list[Any]:
    """The data payloads of an SSE body, '[DONE]' kept as a string."""
    out: list[Any] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
