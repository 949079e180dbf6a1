"""Helpers of observe's integration tests: the Prometheus binary (fails with the install
command when missing, never skips), polling with a deadline, and a fake Prometheus for the
answers a real one cannot give.

The fixtures live here, not in a conftest.py, and test modules import them: a second
``conftest`` module beside tests/cluster's would shadow its ``from conftest import ...``
when both folders are collected in one run.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qs, urlparse

import pytest

from slipstream.localkube import ports
from slipstream.localkube import prometheus as localprom

T = TypeVar("T")


def wait_for(fetch: Callable[[], T], ok: Callable[[T], bool], *, deadline_s: float, what: str) -> T:
    """Call ``fetch`` until ``ok`` holds for its value; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = fetch()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {deadline_s:.0f} s; last: {value!r}")
        time.sleep(0.2)


Responder = Callable[[str], tuple[int, bytes, float]]
"""query -> (HTTP status, body, seconds to wait before answering)."""


class FakePrometheus:
    """A tiny HTTP server on loopback that answers /api/v1/query as told.

    Only for the answers a real Prometheus cannot be made to give (a 500, garbage, NaN
    where a count belongs, a scalar): everything else is tested against the real server.
    """

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests = 0
        self.last_headers: dict[str, str] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake.requests += 1
                fake.last_headers = dict(self.headers)
                query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                status, body, delay = fake.responder(query)
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((ports.LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{ports.LOOPBACK}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def vector_body(result: list[dict[str, object]]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    missing: str | None = None
    try:
        return localprom.binary()
    except localprom.PrometheusMissingError as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)


@pytest.fixture
def fake_prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus(lambda q: (200, b"{}", 0.0))
    yield fake
    fake.stop()


