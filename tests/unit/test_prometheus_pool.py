"""The Prometheus client keeps a connection for every thread that may query it at once.

Under load the operator logged urllib3's "Connection pool is full, discarding connection"
for a pool of 10: requests' default adapter, which prometheus-api-client mounts for the URL,
while the canary reads of every deployment in a rollout share one client from the
operator's worker threads (`ControllerSettings.worker_threads`, 32). Each query beyond the
pool opened a connection and threw it away.
"""

from __future__ import annotations

import concurrent.futures
import http.server
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from slipstream.controller import settings as settings_
from slipstream.controller import stages

ANSWER = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


class SlowPrometheus(http.server.BaseHTTPRequestHandler):
    """Answers every query with an empty vector after 50 ms, so that queries overlap."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        time.sleep(0.05)  # the server's own pace, not a readiness wait
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    do_POST = do_GET

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[int]]]:
    """The server's URL and the number of TCP connections it accepted so far."""
    accepted = [0]

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self):  # type: ignore[no-untyped-def]
            accepted[0] += 1
            return super().get_request()

    server = Server(("127.0.0.1", 0), SlowPrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", accepted
    finally:
        server.shutdown()
        server.server_close()


def test_every_worker_thread_querying_at_once_reuses_its_connection(
    prometheus: tuple[str, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    url, accepted = prometheus
    config = settings_.ControllerSettings()
    client = stages.fleet_observer(config).observer(url, 300.0, "tenant").client
    threads = config.worker_threads
    start = threading.Barrier(threads)

    def queries() -> None:
        start.wait(timeout=10)
        for _ in range(3):
            client.query("up", time.time())

    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(queries) for _ in range(threads)]:
            future.result(timeout=30)
    client.close()
    full = [r.getMessage() for r in caplog.records if "Connection pool is full" in r.getMessage()]
    assert not full, f"{len(full)} connections discarded, e.g. {full[0]}"
    assert accepted[0] <= threads, f"{accepted[0]} connections for {threads} threads: some were not reused"
