"""The rollout's edge: reading and setting the engines through their admin API, all pods at once.

Each pod's call is bounded by the admin client's timeout and runs concurrently with the
others, so one slow or dead pod costs one timeout, not one per pod, and never blocks
another deployment (each deployment's loop calls this on its own). Failures are returned
as data (`machine.Pod` with an error), never raised: the state machine decides what a
failure means (retry, roll back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import aiohttp

from slipstream.api import models
from slipstream.engine import admin
from slipstream.rollout import machine

Client = Callable[[str], admin.AdminClient]
"""Pod name -> an admin client of that pod (its address and the admin key)."""


def failure(error: BaseException) -> str:
    """A short, key-free reason for a failed admin call."""
    if isinstance(error, admin.AdminError):
        return f"HTTP {error.status}"
    if isinstance(error, asyncio.TimeoutError | TimeoutError):
        return "timed out"
    if isinstance(error, aiohttp.ClientConnectorError):
        return "connection refused"
    if isinstance(error, aiohttp.ClientError | ValueError | TypeError | KeyError):
        return f"bad answer ({type(error).__name__})"
    return type(error).__name__


async def read_one(name: str, client: admin.AdminClient) -> machine.Pod:
    try:
        info = await client.get_server_info()
        pool, problem = admin.kv_pool_of(info)
        return machine.Pod(name, admin.reported_setting(info), version=admin.version_of(info),
                           kv_pool_tokens=pool, kv_pool_problem=problem)
    except Exception as error:  # every failure is data for the machine
        return machine.Pod(name, None, f"reading its setting failed: {failure(error)}")


async def set_one(name: str, client: admin.AdminClient, setting: models.EngineSetting) -> machine.Pod:
    try:
        await client.set_internal_state(admin.internal_state(setting))
    except Exception as error:
        return machine.Pod(name, None, f"/set_internal_state failed: {failure(error)}")
    return await read_one(name, client)


async def read(pods: list[str], client: Client) -> list[machine.Pod]:
    """What each pod reports it runs."""
    return list(await asyncio.gather(*(read_one(name, client(name)) for name in pods)))


async def apply(targets: Mapping[str, models.EngineSetting], client: Client) -> dict[str, machine.Pod]:
    """Set each pod's setting in place, then read back what it runs now."""
    results = await asyncio.gather(*(set_one(name, client(name), s) for name, s in targets.items()))
    return {pod.name: pod for pod in results}
