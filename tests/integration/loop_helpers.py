"""Stand-ins for a loop step's Kubernetes API and admin-key source: one pod on loopback
(a pod IP the loop may contact must be loopback on a test machine) and the ConfigMap it
writes, in memory. Shared by the tests that run `controller.loop.step` against real HTTP."""

from __future__ import annotations

import copy
import json
from typing import Any

from aiohttp import web

from slipstream.api import models


class PodsAndConfigMaps:
    """The two Kubernetes reads and the one write of a step, in memory."""

    def __init__(self, port: int) -> None:
        self.pod = {"metadata": {"name": "kimi-0"},
                    "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.port = port

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.pod)]

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.configmaps.get(name))

    def apply(self, obj: dict[str, Any]) -> tuple[dict[str, Any], None, str]:
        self.configmaps[obj["metadata"]["name"]] = copy.deepcopy(obj)
        return obj, None, "created"


class Key:
    def key(self, sd: models.ServingDeployment) -> str:
        return "k3y"


class Engine:
    """An engine pod's admin API on loopback; records the settings sent. With ``answer``
    set, /get_server_info answers exactly that (status, body); without, it answers what the
    engine runs: ``info``, updated by each /set_internal_state."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] | None = None
        self.info: dict[str, Any] = {"long_prefill_token_threshold": 0, "long_prefill_mode": "ceiling",
                                     "schedule_policy": "fcfs"}  # fmt: skip
        self.sets: list[dict[str, Any]] = []

    async def start(self) -> str:
        async def info(request: web.Request) -> web.StreamResponse:
            status, body = self.answer or (200, json.dumps(self.info).encode())
            return web.Response(status=status, body=body, content_type="application/json")

        async def set_state(request: web.Request) -> web.StreamResponse:
            sent = (await request.json())["server_args"]
            self.sets.append(sent)
            self.info.update(sent)
            return web.json_response({"updated": True})

        app = web.Application()
        app.router.add_get("/get_server_info", info)
        app.router.add_get("/server_info", info)
        app.router.add_post("/set_internal_state", set_state)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"
