"""Readiness by polling health endpoints against a deadline.

A fixed sleep is either too short on a loaded CI machine or wasted time on a
fast one; polling the component's own health endpoint answers exactly when it
is ready, and checking the process between polls turns a crash into an
immediate error with its log instead of a time-out.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request

from slipstream.localkube import processes

POLL_INTERVAL_S = 0.2
"""Seconds between polls: start-up takes seconds, so 0.2 s costs nothing."""

REQUEST_TIMEOUT_S = 2.0
"""Per-request timeout, short so one hung request cannot eat the deadline."""


def wait_healthy(
    component: processes.Component,
    url: str,
    *,
    deadline_s: float,
    context: ssl.SSLContext | None = None,
    expect: str | None = None,
) -> None:
    """Poll ``url`` until it answers 200 (and contains ``expect``, if given).

    Raises ComponentError, with the component's log tail and the last answer,
    if the process exits or ``deadline_s`` seconds pass first.
    """
    deadline = time.monotonic() + deadline_s
    last = "no answer yet"
    while True:
        component.check_alive()
        try:
            with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S, context=context) as resp:
                body = resp.read().decode(errors="replace")
                if resp.status == 200 and (expect is None or expect in body):
                    return
                last = f"HTTP {resp.status}: {body[:300]}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"
        except (OSError, ssl.SSLError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise component.failure(f"not healthy at {url} within {deadline_s:.0f}s (last: {last})")
        time.sleep(POLL_INTERVAL_S)
