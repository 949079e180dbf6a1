"""Async client of the engine's admin HTTP API.

`/get_server_info` returns the engine's server args and internal state;
`/set_internal_state` changes allow-listed server args in place (the Slipstream patch adds
`long_prefill_token_threshold`, `long_prefill_mode` and `schedule_policy` to the allowlist,
validated by the engine). Requests carry `Authorization: Bearer <admin API key>`.

Answers are read with a bound (`MAX_ANSWER_BYTES`) and must be JSON objects: an oversized,
non-JSON or unusable answer raises `BadAnswer` (a ValueError naming the URL), an HTTP error
`AdminError`; network failures and timeouts propagate as aiohttp/asyncio raise them.
"""

from __future__ import annotations

import json
import math
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


class BadAnswer(ValueError):
    """The engine answered with something that is not a usable admin answer."""


MAX_ANSWER_BYTES = 1 << 20
"""Largest admin answer read (server info is a few KiB); more is refused, not buffered."""


def internal_state(setting: models.EngineSetting) -> dict[str, Any]:
    """The `server_args` the engine takes for one tuned setting."""
    return {
        "long_prefill_token_threshold": setting.threshold,
        "long_prefill_mode": setting.mode,
        "schedule_policy": setting.schedule_policy,
    }


def reported_setting(server_info: dict[str, Any]) -> models.EngineSetting:
    """The tuned setting an engine reports in /get_server_info; BadAnswer if unusable.

    Every SGLang server info names long_prefill_token_threshold (null or 0: off): an answer
    without it ({} or an empty 200 from a proxy) is not server info, and reading it as T = 0
    would have the loop "set back" an engine whose setting it does not know."""
    if "long_prefill_token_threshold" not in server_info:
        keys = ", ".join(sorted(map(str, server_info))[:8]) or "none"
        raise BadAnswer(f"server info holds no long_prefill_token_threshold (keys: {keys}): not an engine's server info")
    threshold = server_info.get("long_prefill_token_threshold") or 0
    try:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ValueError(f"long_prefill_token_threshold is {threshold!r}, not a number")
        return models.EngineSetting(
            threshold=int(threshold),
            mode=server_info.get("long_prefill_mode") or "ceiling",
            schedule_policy=server_info.get("schedule_policy") or "fcfs",
        )
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadAnswer(f"server info holds no usable setting: {str(exc)[:300]}") from None


KV_POOL_KEY = "max_total_num_tokens"
"""The engine's KV pool in tokens, in /get_server_info: SGLang puts its scheduler's init
info there (``Scheduler.get_init_info``, DP rank 0), the pool after weights and
activations, whatever ``--max-total-tokens`` or ``--mem-fraction-static`` asked for."""
MAX_KV_POOL_TOKENS = 10_000_000_000
"""Largest pool read as one (the twin's bound on ``kv_pool_tokens``, ``sim.bounds``)."""


def kv_pool_of(server_info: dict[str, Any]) -> tuple[int | None, str]:
    """(the KV pool in tokens, "") as an engine reports it, or (None, why) when its answer
    holds no usable one: missing, null, not a whole number (a string, a bool, 40000.5), or
    outside 1..``MAX_KV_POOL_TOKENS``. Never raises: a garbled pool is never read as a size
    (0 would mean "no memory limit" to the twin)."""
    value = server_info.get(KV_POOL_KEY)
    if value is None:
        return None, f"no {KV_POOL_KEY} in its server info"
    whole = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if isinstance(value, bool) or not whole or not 1 <= value <= MAX_KV_POOL_TOKENS:
        return None, f"{KV_POOL_KEY} is {str(value)[:40]!r}, not a token count"
    return int(value), ""


def version_of(server_info: dict[str, Any]) -> str:
    """The SGLang version an engine reports (``version``, SGLang's ``__version__``), "" when
    it reports none or something that is not a short string."""
    version = server_info.get("version")
    return version.strip()[:64] if isinstance(version, str) else ""


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
        return reported_setting(await self.get_server_info())

    async def _request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        url = self.base_url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, url, json=body, headers=headers) as response,
        ):
            raw = bytearray()
            while chunk := await response.content.read(MAX_ANSWER_BYTES + 1 - len(raw)):
                raw += chunk
                if len(raw) > MAX_ANSWER_BYTES:
                    raise BadAnswer(f"{url}: answer over {MAX_ANSWER_BYTES} bytes (HTTP {response.status})")
            text = raw.decode("utf-8", errors="replace")
            if response.status >= 400:
                raise AdminError(url, response.status, text)
        return _json_object(url, text)


def _json_object(url: str, text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        obj = json.loads(text)
    except ValueError:
        raise BadAnswer(f"{url}: answer is not JSON: {text[:200]!r}") from None
    if not isinstance(obj, dict):
        raise BadAnswer(f"{url}: answer is a JSON {type(obj).__name__}, not an object")
    return obj
