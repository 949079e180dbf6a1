"""Whether this operator process is serving: the `/readyz` endpoint.

kopf's own health endpoint (`--liveness`) answers as soon as the process runs, including
while kopf's peering keeps it paused: a standby replica, or a process restarted after a
SIGKILL, which waits until its killed predecessor's peering entry expires (up to
`peering_lifetime_seconds`) and handles nothing meanwhile. `/readyz` says which:

- ``serving``: kopf's startup handlers ran and no peer holds it paused: it reconciles and tunes;
- ``paused``: kopf's peering pauses it in favour of another entry (a standby, or the entry
  of a killed process that has not expired yet);
- ``starting``: before kopf's startup handlers ran, or before its first peering decision.

`/readyz` answers 200 only when serving (what `slipstream cluster status` asks).
`/readyz?standby=ok` also answers 200 when paused: the chart's readiness probe, because
with two replicas one always stands by, and a probe that failed on it would hold every
rollout of the operator Deployment (and `kubectl rollout status`) forever. The body says
the state either way.

kopf exposes its pause only in its log (`kopf._core.engines.peering`: "Pausing operations in
favour of ...", "Resuming operations after the pause"), so that is what is read; the
messages are pinned by tests/cluster/test_hardening.py against the kopf the project pins.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Literal

State = Literal["starting", "paused", "serving"]

PEERING_LOGGER = "kopf._core.engines.peering"
PAUSING = "Pausing operations"
PAUSING_ALL = "Pausing all operators"
"""kopf's line when a peer has the same priority (every replica draws its own at random)."""
RESUMING = "Resuming operations"


@dataclass
class Serving:
    """This process's state as kopf's startup and peering decide it (thread-safe)."""

    peering: bool
    """Whether kopf runs with peering: it starts paused until its first peering decision."""
    started: bool = False
    paused: bool = field(init=False)
    why: str = ""
    since: float = field(default_factory=time.time)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.paused = self.peering
        self.why = "waiting for kopf's first peering decision" if self.peering else ""

    def state(self) -> State:
        with self._lock:
            if not self.started:
                return "starting"
            return "paused" if self.paused else "serving"

    def mark_started(self) -> None:
        with self._lock:
            self.started, self.since = True, time.time()

    def note(self, message: str) -> None:
        """One line of kopf's peering log."""
        with self._lock:
            if message.startswith((PAUSING, PAUSING_ALL)):
                self.paused, self.why, self.since = True, message, time.time()
            elif message.startswith(RESUMING):
                self.paused, self.why, self.since = False, "", time.time()

    def report(self) -> dict[str, object]:
        state = self.state()
        with self._lock:
            return {"state": state, "why": self.why if state != "serving" else "", "since": self.since}


class PeeringLog(logging.Handler):
    """Feeds kopf's peering log lines to a `Serving`."""

    def __init__(self, serving: Serving) -> None:
        super().__init__(level=logging.INFO)
        self.serving = serving

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.serving.note(record.getMessage())
        except Exception:  # a log handler must never raise into kopf
            self.handleError(record)


def watch_peering(serving: Serving) -> PeeringLog:
    """Attach to kopf's peering logger (at INFO, whatever the root level is)."""
    handler = PeeringLog(serving)
    logger = logging.getLogger(PEERING_LOGGER)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler


def answer(serving: Serving, query: str) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of `/readyz?<query>`."""
    report = serving.report()
    standby_ok = urllib.parse.parse_qs(query).get("standby") == ["ok"]
    ok = report["state"] == "serving" or (standby_ok and report["state"] == "paused")
    return (200 if ok else 503), json.dumps(report).encode()


def serve(serving: Serving, address: str, port: int) -> http.server.ThreadingHTTPServer:
    """`/readyz` on ``address:port`` in a daemon thread; returns the server (port 0: any)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path, _, query = self.path.partition("?")
            code, body = answer(serving, query) if path == "/readyz" else (404, b'{"error": "not found"}')
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            pass  # a probe every few seconds is not worth a log line

    server = http.server.ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="slipstream-readyz", daemon=True).start()
    return server
