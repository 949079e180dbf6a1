"""Async client of the engine's admin HTTP API.

`/get_server_info` returns the engine's server args and internal state;
`/set_internal_state` changes allow-listed server args in place (the Slipstream patch adds
`long_prefill_token_threshold`, `long_prefill_mode` and `schedule_policy` to the allowlist,
validated by the engine). Requests carry `Authorization: Bearer <admin API key>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from slipstream.api import models


class AdminError(RuntimeError):
    """The engine refused or failed an admin request."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {body[:500]}")
        self.url = url
        self.status = status
        self.body = body


def internal_state(setting: models.EngineSetting) -> dict[str, Any]:
    """The `server_args` the engine takes for one tuned setting."""
    return {
        "long_prefill_token_threshold": setting.threshold,
        "long_prefill_mode": setting.mode,
        "schedule_policy": setting.schedule_policy,
    }


def setting_of(server_info: dict[str, Any]) -> models.EngineSetting:
    """The tuned setting an engine reports in /get_server_info."""
    return models.EngineSetting(
        threshold=int(server_info.get("long_prefill_token_threshold") or 0),
        mode=server_info.get("long_prefill_mode") or "ceiling",
        schedule_policy=server_info.get("schedule_policy") or "fcfs",
    )


@dataclass(frozen=True)
class AdminClient:
    """One engine pod, e.g. `AdminClient("http://10.0.0.7:30000", api_key)`."""

    base_url: str
    api_key: str | None = None
    timeout_seconds: float = 10.0
    """A hot update is one RPC to the scheduler; 10 s is generous and bounds a stuck pod."""

    async def get_server_info(self) -> dict[str, Any]:
        return await self._request("GET", "/get_server_info")

    async def set_internal_state(self, server_args: dict[str, Any]) -> dict[str, Any]:
        result = await self._request("POST", "/set_internal_state", {"server_args": server_args})
        if isinstance(result, dict) and result.get("updated") is False:
            raise AdminError(self.base_url + "/set_internal_state", 200, str(result))
        return result

    async def apply(self, setting: models.EngineSetting) -> models.EngineSetting:
        """Set the tuned triple in place and return what the engine then reports."""
        await self.set_internal_state(internal_state(setting))
        return setting_of(await self.get_server_info())

    async def _request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        url = self.base_url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, url, json=body, headers=headers) as response,
        ):
            text = await response.text()
            if response.status >= 400:
                raise AdminError(url, response.status, text)
            return await response.json(content_type=None) if text else {}
