"""Prometheus failing in every way a reader meets: down, hung, 500, garbage, NaN, empty.

Each read must give the right reason and never raise, and a failed read is never taken as
"no traffic" (Dynamo #14765). Down and hung are a real Prometheus stopped and frozen
(SIGSTOP); the answers a real Prometheus cannot be made to give come from a small fake
that replays the real server's recorded answers with the fault applied. This module's
Prometheus stores names as scraped (``sglang_x``, no relabeling), so the queries' either-
spelling matching is exercised too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import observe_helpers
import pytest
from engine_exporter import EngineExporter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from observe_helpers import vector_body, wait_for

from slipstream.api import models
from slipstream.api import snapshot as snap
from slipstream.localkube import prometheus as localprom
from slipstream.observe import Observer, ObserveSettings, queries
from slipstream.observe.fleet import FleetObserver

prometheus_binary = observe_helpers.prometheus_binary
fake_prometheus = observe_helpers.fake_prometheus
"""Fixtures from observe_helpers (no conftest.py here: see its docstring)."""

CHAT = "team-a/chat"
WINDOW_S = 20.0
SETTINGS = ObserveSettings(
    window_s=WINDOW_S, min_samples=20, max_staleness_s=10.0, query_timeout_s=5.0,
    backoff_initial_s=3.0, backoff_max_s=6.0,
)


@dataclass
class Faults:
    prom: localprom.PrometheusServer
    exporter: EngineExporter
    recorded: dict[str, dict] = field(default_factory=dict)
    """Fleet query -> the real server's JSON answer (for the fake to replay, mutated)."""
    recorded_at: float = 0.0

    def replay_observer(self, url: str) -> Observer:
        """An observer whose clock stands at the recording's time (the answers' now)."""
        return Observer(url, SETTINGS, clock=lambda: self.recorded_at)

    def restart(self) -> None:
        self.prom = localprom.PrometheusServer.start(
            self.prom.workdir, static=[target(self.exporter)], port=self.prom.port,
            keep_data=True, normalize_sglang_names=False,
        )


def target(exporter: EngineExporter) -> localprom.StaticTarget:
    return localprom.StaticTarget(exporter.address, namespace="team-a", pod="chat-0",
                                  servingdeployment="chat")


@pytest.fixture(scope="module")
def faults(prometheus_binary, tmp_path_factory) -> Iterator[Faults]:
    exporter = EngineExporter(threshold=2048, mode="floor", policy="srpt")
    stop = threading.Event()

    def traffic() -> None:
        # Live load: ten first tokens a second, so every window has samples.
        i = 0
        while not stop.wait(0.1):
            exporter.request("acme", 0.2 + (i % 10) * 0.1, 1000, 200, output_tokens=50)
            i += 1

    exporter.open_tenant("acme")
    driver = threading.Thread(target=traffic, daemon=True)
    driver.start()
    workdir = tmp_path_factory.mktemp("prometheus-faults")
    prom = localprom.PrometheusServer.start(
        workdir, static=[target(exporter)], normalize_sglang_names=False
    )
    f = Faults(prom, exporter)
    try:
        wait_for(lambda: Observer(prom.url, SETTINGS).read([CHAT])[CHAT],
                 lambda s: s.valid, deadline_s=40, what="a valid snapshot")
        now = f.recorded_at = time.time()
        for _, promql in queries.fleet_reads(WINDOW_S):
            url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": now})
            with urllib.request.urlopen(url, timeout=5) as resp:
                f.recorded[promql] = json.loads(resp.read())
        yield f
    finally:
        stop.set()
        driver.join(timeout=5)
        f.prom.stop()
        exporter.stop()


def test_names_as_scraped_are_sglang_underscore_and_still_read(faults):
    names = json.loads(urllib.request.urlopen(f"{faults.prom.url}/api/v1/label/__name__/values").read())
    assert "sglang_time_to_first_token_seconds_bucket" in names["data"]
    assert "sglang:time_to_first_token_seconds_bucket" not in names["data"]
    chat = Observer(faults.prom.url, SETTINGS).read([CHAT])[CHAT]
    assert chat.valid, chat.detail
    assert chat.pods == (snap.PodSetting("chat-0", 2048, "floor", "srpt"),)
    (acme,) = chat.tenants  # sglang_generation_tokens_histogram, read by the same matcher
    assert acme.output_tokens is not None and acme.output_tokens.mean == pytest.approx(50)


def test_prometheus_down_is_unreachable_backs_off_and_recovers(faults):
    observer = Observer(faults.prom.url, SETTINGS)
    assert observer.read([CHAT])[CHAT].valid
    faults.prom.stop()
    try:
        down = observer.read([CHAT])[CHAT]
        assert down.invalid == snap.UNREACHABLE
        assert "cannot connect" in down.detail and "next query in 3 s" in down.detail
        sent = observer.queries_made
        again = observer.read([CHAT])[CHAT]
        assert again.invalid == snap.UNREACHABLE and "backing off" in again.detail
        assert observer.queries_made == sent, "no query while backing off"
    finally:
        faults.restart()
    reads: list[snap.WorkloadSnapshot] = []

    def read() -> snap.WorkloadSnapshot:
        reads.append(observer.read([CHAT])[CHAT])
        return reads[-1]

    back = wait_for(read, lambda s: s.valid, deadline_s=40, what="recovery after restart")
    assert back.tenants[0].name == "acme"
    assert observer.backoff.failures == 0
    # Right after the restart the newest sample may predate the outage (Stale), or the
    # window may hold too few samples across the gap (TooFewSamples, seen in CI on a loaded
    # machine) until the first scrapes land; never is a failed or gapped read taken as no
    # traffic, nor as NaN or a missing series.
    allowed = {None, snap.UNREACHABLE, snap.STALE, snap.TOO_FEW_SAMPLES}
    assert {r.invalid for r in reads} <= allowed, [r.detail for r in reads]


def test_a_hung_prometheus_times_out_as_unreachable_and_recovers(faults):
    observer = Observer(faults.prom.url, dataclasses.replace(SETTINGS, query_timeout_s=1.0))
    assert observer.read([CHAT])[CHAT].valid
    os.kill(faults.prom.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        hung = observer.read([CHAT])[CHAT]
        took = time.monotonic() - started
    finally:
        os.kill(faults.prom.pid, signal.SIGCONT)
    assert hung.invalid == snap.UNREACHABLE
    assert "did not answer within 1 s" in hung.detail
    assert took < 3.0, "one 1 s timeout, not one per query or retry"
    wait_for(lambda: observer.read([CHAT])[CHAT], lambda s: s.valid, deadline_s=30,
             what="recovery after SIGCONT")


def _replay(faults: Faults, mutate=lambda name, body: body):
    """A responder that answers each fleet query with its recorded real answer, mutated."""
    names = {promql: name for name, promql in queries.fleet_reads(WINDOW_S)}

    def respond(query: str) -> tuple[int, bytes, float]:
        body = json.loads(json.dumps(faults.recorded[query]))
        return 200, json.dumps(mutate(names[query], body)).encode(), 0.0

    return respond


def test_the_fake_replays_a_valid_answer(faults, fake_prometheus):
    fake_prometheus.responder = _replay(faults)
    chat = faults.replay_observer(fake_prometheus.url).read([CHAT])[CHAT]
    assert chat.valid, chat.detail


@pytest.mark.parametrize(
    "status, body, words",
    [
        (500, b'{"status":"error","errorType":"internal","error":"boom"}', "HTTP Status Code 500"),
        (503, b"Service Unavailable", "HTTP Status Code 503"),
        (200, b"<html>not json</html>", "unreadable answer"),
        (200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":', "unreadable"),
        (200, b'{"status":"success","data":{"resultType":"scalar","result":[1.0,"1"]}}', "malformed"),
        (200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}',
         "malformed"),
        (200, b"[]", "unreadable"),
    ],
    ids=["500", "503", "html", "truncated", "scalar", "not-a-number", "json-list"],
)
def test_error_and_garbage_answers_are_unreachable_never_no_traffic(fake_prometheus, status, body, words):
    fake_prometheus.responder = lambda q: (status, body, 0.0)
    observer = Observer(fake_prometheus.url, SETTINGS)
    got = observer.read([CHAT, "team-b/batch"])
    assert {s.invalid for s in got.values()} == {snap.UNREACHABLE}
    assert words in got[CHAT].detail
    assert observer.queries_made == 1, "the first failed query ends the interval"
    canary = observer.ttft_by_tenant("team-a", "chat", ["chat-0"])
    assert canary.invalid == snap.UNREACHABLE


def _nan(values_of: str):
    def mutate(name: str, body: dict) -> dict:
        if name == values_of:
            for series in body["data"]["result"]:
                series["value"][1] = "NaN"
        return body
    return mutate


@pytest.mark.parametrize("family", ["ttft", "uncached", "tokens", "queue", "settings"])
def test_nan_values_are_not_finite(faults, fake_prometheus, family):
    fake_prometheus.responder = _replay(faults, _nan(family))
    chat = faults.replay_observer(fake_prometheus.url).read([CHAT])[CHAT]
    assert chat.invalid == snap.NOT_FINITE, chat.detail
    assert "NaN" in chat.detail or "nan" in chat.detail


def recommend_sd(name: str, prometheus_url: str) -> models.ServingDeployment:
    """A Recommend-mode deployment in team-a reading `prometheus_url`: the loops of the fleet-read tests."""
    return models.ServingDeployment.model_validate({
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"engine": {"image": "i", "model": "m"}, "prometheus": {"url": prometheus_url},
                 "tuning": {"mode": "Recommend"}}})


def test_a_failed_fleet_read_fails_every_loop_once(fake_prometheus):
    fake_prometheus.responder = lambda q: (500, b"boom", 0.0)
    observer = FleetObserver(SETTINGS)

    async def loops() -> list[snap.WorkloadSnapshot]:
        return await asyncio.gather(*(observer.snapshot(recommend_sd(n, fake_prometheus.url), WINDOW_S, 1000.0)
                                      for n in ("a", "b", "c")))

    got = asyncio.run(loops())
    assert [s.invalid for s in got] == [snap.UNREACHABLE] * 3
    assert fake_prometheus.requests == 1, "one failed query, shared by every loop"
    observer.close()


def test_loops_giving_up_on_a_slow_read_never_start_a_second_one(fake_prometheus):
    """A loop bounds its wait for metrics (``controller.loop.observe``'s ``wait_for``). A loop
    that gives up must leave the read in flight to the others: with a lock, each waiter that
    timed out released it while its thread read on, the next waiter started another read
    beside it, and a slow Prometheus got slower under a pile of fleet reads, each holding a
    fleet's answers (the ~600 s wave at 500 deployments in CHANGELOG.md)."""
    gate = threading.Event()
    lock = threading.Lock()
    in_flight = {"now": 0, "most": 0}

    def respond(query: str) -> tuple[int, bytes, float]:
        with lock:
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
        gate.wait(timeout=30)
        with lock:
            in_flight["now"] -= 1
        return 200, vector_body([]), 0.0

    fake_prometheus.responder = respond
    observer = FleetObserver(SETTINGS)

    async def loop(name: str, start_s: float) -> str:
        await asyncio.sleep(start_s)  # staggered loops, each giving up 0.3 s after it asked
        try:
            read = observer.snapshot(recommend_sd(name, fake_prometheus.url), WINDOW_S, 1000.0)
            return (await asyncio.wait_for(read, 0.3)).invalid or ""
        except TimeoutError:
            return "gave up"

    async def scenario() -> tuple[list[str], str | None]:
        gave_up = await asyncio.gather(*(loop(f"l{i}", 0.2 * i) for i in range(5)))
        gate.set()
        late = await asyncio.wait_for(observer.snapshot(recommend_sd("late", fake_prometheus.url), WINDOW_S, 1000.0), 30)
        return gave_up, late.invalid

    gave_up, late = asyncio.run(scenario())
    assert gave_up == ["gave up"] * 5, "the read was held back for longer than every loop waited"
    assert in_flight["most"] == 1, f"{in_flight['most']} queries at once: a second read started beside the first"
    assert observer.reads_started == 1
    assert late == snap.NO_SERIES, "the late loop got the read the others gave up on"
    assert fake_prometheus.requests == len(queries.fleet_reads(WINDOW_S)), "one fleet read in all"
    observer.close()


def test_a_finished_read_is_never_left_for_a_loop_to_join(fake_prometheus):
    """A loop whose clock has moved past the read in flight waits for it, finds it stale
    and reads again. Had it found a read already done, awaiting it would not yield, and it
    would find the same one again, and spin with the event loop held: the first version
    of the shared read left a done read registered until a callback of its own ran, and
    at 500 deployments the operator froze with 121 of 500 reconciled (docs/reliability.md,
    "Scale"). Checked at the first moment any callback can see the read
    done."""
    fake_prometheus.responder = lambda q: (200, vector_body([]), 0.0)
    observer = FleetObserver(SETTINGS)

    async def scenario() -> tuple[list[list[object]], str | None]:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(observer.snapshot(recommend_sd("a", fake_prometheus.url), WINDOW_S, 1000.0))
        while not observer._flights:
            await asyncio.sleep(0)
        (flight,) = observer._flights.values()
        registered_when_done: list[list[object]] = []

        def watch() -> None:  # runs every event-loop iteration until the read is done
            if flight.done():
                registered_when_done.append(list(observer._flights.values()))
            else:
                loop.call_soon(watch)

        loop.call_soon(watch)
        await first
        later = await asyncio.wait_for(observer.snapshot(recommend_sd("b", fake_prometheus.url), WINDOW_S, 1000.0 + 60), 30)
        return registered_when_done, later.invalid

    seen, later = asyncio.run(scenario())
    assert seen == [[]], "a done read was still registered for loops to join"
    assert later == snap.NO_SERIES and observer.reads_started == 2
    observer.close()


def test_a_bearer_token_is_sent_and_never_shown(fake_prometheus):
    token = "s3cret-prometheus-token"

    def respond(query: str) -> tuple[int, bytes, float]:
        if fake_prometheus.last_headers.get("Authorization") != f"Bearer {token}":
            return 401, b"Unauthorized", 0.0
        return 200, vector_body([]), 0.0

    fake_prometheus.responder = respond
    assert Observer(fake_prometheus.url, SETTINGS, bearer_token=token).read([CHAT])[CHAT].invalid == snap.NO_SERIES
    wrong = Observer(fake_prometheus.url, SETTINGS, bearer_token="wrong-token").read([CHAT])[CHAT]
    assert wrong.invalid == snap.UNREACHABLE and "401" in wrong.detail
    assert "wrong-token" not in wrong.detail and token not in wrong.detail


def test_empty_series_are_no_series_not_no_traffic(fake_prometheus):
    fake_prometheus.responder = lambda q: (200, vector_body([]), 0.0)
    observer = Observer(fake_prometheus.url, SETTINGS)
    got = observer.read([CHAT])
    assert got[CHAT].invalid == snap.NO_SERIES
    assert observer.ttft_by_tenant("team-a", "chat", ["chat-0"]).invalid == snap.NO_SERIES


def test_no_ttft_answer_but_live_gauges_is_no_traffic(faults, fake_prometheus):
    """Only an answer that says zero is read as no traffic."""
    def mutate(name: str, body: dict) -> dict:
        if name in ("ttft", "uncached", "tokens"):
            body["data"]["result"] = []
        return body

    fake_prometheus.responder = _replay(faults, mutate)
    chat = faults.replay_observer(fake_prometheus.url).read([CHAT])[CHAT]
    assert chat.invalid == snap.NO_TRAFFIC


# -- fuzz ---------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_label_values = st.sampled_from(["team-a", "chat", "acme", "", "0.1", "+Inf", "bucket", "sum",
                                 "newest", "depth", "threshold", "mode", "policy", "up", "x/y"])
_labels = st.dictionaries(
    st.sampled_from(["namespace", "servingdeployment", "tenant", "le", "part", "pod", "mode",
                     "policy"]),
    _label_values, max_size=8,
)
_value = st.sampled_from(["NaN", "+Inf", "-Inf", "0", "1", "-1", "1e308", "3.5", "abc", ""]) | _json
_series = st.fixed_dictionaries({"metric": _labels | _json, "value": st.tuples(
    st.floats(allow_nan=True) | st.integers() | _json, _value).map(list) | _json})
_result = st.lists(_series, max_size=6) | _json


def _body(result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


_answers = st.one_of(
    st.tuples(st.sampled_from([200, 400, 404, 422, 500, 503]), st.binary(max_size=200)),
    st.tuples(st.just(200), _json.map(lambda j: json.dumps(j).encode())),
    st.tuples(st.just(200), _result.map(_body)),
)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_answers)
def test_fuzzed_answers_never_raise(fake_prometheus, answer):
    status, body = answer
    fake_prometheus.responder = lambda q: (status, body, 0.0)
    observer = Observer(fake_prometheus.url, ObserveSettings(
        window_s=WINDOW_S, min_samples=1, backoff_initial_s=0.0, query_timeout_s=2.0))
    got = observer.read([CHAT, "team-b/batch"])
    assert set(got) == {CHAT, "team-b/batch"}
    for s in [*got.values(), observer.ttft_by_tenant("team-a", "chat", ["chat-0"], min_samples=1)]:
        assert s.invalid is None or s.invalid in snap.REASONS
        if s.valid:
            assert s.tenants and all(
                t.ttft_p99_s == t.ttft_p99_s and abs(t.ttft_p99_s) != float("inf") for t in s.tenants
            ), s
    everything = observer.read()  # every deployment the answer names
    assert all(s.invalid is None or s.invalid in snap.REASONS for s in everything.values())
