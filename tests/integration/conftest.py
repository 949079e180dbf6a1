"""The integration tier: a real Prometheus server (Debian's 2.42.0, installed by
``scripts/install-prometheus.sh``) started per module on a free loopback port, scraping real
exporters every second. Without the binary the tier fails with the install command; it is
never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from observe_helpers import FakePrometheus

from slipstream.localkube import prometheus as localprom


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


