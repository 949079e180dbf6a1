"""The demo's timeline (slipstream.demo.plot) and its pass counters (slipstream.demo.loop):
the share of prefill passes the engines capped, per window, from synthetic samples."""

from __future__ import annotations

import http.server
import math
import threading
from pathlib import Path

import pytest

from slipstream.demo import loop, phases, plot
from slipstream.enginesim.metrics import EngineMetrics

A, B = "http://127.0.0.2:30000", "http://127.0.0.3:30000"


def passes() -> list[loop.PassCount]:
    """Two engines sampled every 30 twin s: in (0, 60] 30 passes, 3 capped (B's first
    sample at 30 s is its baseline); in (60, 120] 40 passes, 30 capped, A restarted at
    90 s (its counter went down: what it shows is its rise); nothing after 120 s."""
    return [
        loop.PassCount(0.0, {A: (0, 0)}),
        loop.PassCount(30.0, {A: (1, 10), B: (50, 100)}),
        loop.PassCount(60.0, {A: (2, 20), B: (51, 110)}),
        loop.PassCount(90.0, {A: (5, 10), B: (61, 120)}),
        loop.PassCount(120.0, {A: (15, 20), B: (66, 130)}),
        loop.PassCount(150.0, {A: (15, 20), B: (66, 130)}),
    ]


def test_capped_share_sums_each_engines_rise_within_the_window():
    p = passes()
    assert loop.capped_share(p, 0.0, 60.0) == pytest.approx(3 / 30)
    assert loop.capped_share(p, 60.0, 120.0) == pytest.approx(30 / 40)
    assert loop.capped_share(p, 0.0, 150.0) == pytest.approx(33 / 70)
    assert loop.capped_share(p, 120.0, 180.0) is None  # no pass ran
    assert loop.capped_share([], 0.0, 60.0) is None


def test_capped_windows_are_consecutive_windows_to_the_end():
    assert plot.capped_windows(passes(), 180.0) == [
        (0.0, pytest.approx(0.1)), (60.0, pytest.approx(0.75)), (120.0, None)]


def test_the_status_line_says_the_share_of_passes_capped():
    s = loop.StatusSample(10.0, 4096, 2, "reflex", "srpt", 0.41, "Idle", {"chat": 0.8})
    assert "capping 73% of passes" in loop.status_line(s, 0.734)
    assert "capping" not in loop.status_line(s)
    assert loop.status_line(s).startswith("T=4096 (x2) reflex/srpt | heterogeneity 0.41")


def spans() -> list[phases.Phase]:
    return [phases.Phase("documents-1", "documents", 0.0, 90.0), phases.Phase("mixed", "heterogeneous", 90.0, 180.0)]


def test_the_figure_draws_the_capped_share_per_window_beside_the_setting(tmp_path: Path):
    samples = [loop.StatusSample(t, 4096, 2, "reflex", "srpt", 0.2, "Idle", {}) for t in (0.0, 60.0, 120.0)]
    results = [loop.Result("chat", f"r{i}", float(i), 0.5, True) for i in range(0, 180, 5)]
    fig = plot.figure(samples, results, spans(), {}, passes())
    lines = {ln.get_label(): ln for ax in fig.axes for ln in ax.get_lines()}
    (capped,) = [ln for label, ln in lines.items() if label.startswith(plot.CAPPED_LEGEND)]
    xs, ys = list(capped.get_xdata()), list(capped.get_ydata())
    assert xs == [0.0, 60.0, 120.0, 180.0]
    assert ys[:2] == [pytest.approx(0.1), pytest.approx(0.75)] and math.isnan(ys[2])  # a gap: no pass ran
    concurrency = lines["tuned concurrency C // T (1 = off)"]
    assert set(concurrency.get_ydata()) == {2}
    title = fig._suptitle.get_text()
    assert "follows" not in title and "share of prefill passes" in title
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith(plot.CAPPED_LEGEND) for t in legend)
    out = plot.timeline(samples, results, spans(), tmp_path / "t.png", {}, passes())
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_pass_counters_the_figure_has_no_capped_line():
    samples = [loop.StatusSample(0.0, 0, 1, "ceiling", "fcfs", None, "Idle", {})]
    fig = plot.figure(samples, [loop.Result("chat", "r", 1.0, 0.5, True)], spans())
    assert not [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_label().startswith(plot.CAPPED_LEGEND)]


@pytest.fixture
def engine_url():
    """An HTTP server answering /metrics with the engine simulator's exposition after
    12 long-path passes, 9 of them capped."""
    metrics = EngineMetrics("m", ("tenant",))
    metrics.rounds(12, 9)
    body = metrics.exposition()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_watcher_reads_the_engines_pass_counters_and_skips_one_that_is_away(engine_url):
    assert loop.read_passes(engine_url) == (9.0, 12.0)
    watcher = loop.Watcher(target=None, namespace="ns", name="sd")  # type: ignore[arg-type]
    watcher.poll_passes([engine_url, "http://127.0.0.1:9"])  # nothing listens on port 9
    (sample,) = watcher.passes
    assert sample.counts == {engine_url: (9.0, 12.0)} and watcher.errors == 1
