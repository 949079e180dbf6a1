"""Faults injected into the closed loop on real parts (issue 10, "Faults"): nothing lost and
no wrong setting left behind.

One stack per module: the shared control plane, a real Prometheus discovering the engine
pods, the engine-pod runner (one `slipstream engine-sim` per kwok pod on its loopback IP,
`localkube.stack`), the chart installed with helm and the operator running as its
ServiceAccount (`test_operator_reconcile.Operator`, so it can be SIGKILLed and started
again). Answers a real Prometheus cannot give (500, a hang, garbage, NaN, an empty result)
come from `FakePrometheus`, a small server on 127.0.0.1 that proxies to the real one and
misbehaves per path on the test's word: each ServingDeployment's spec.prometheus.url names
its own path. Time is scaled: simulators run TIME_SCALE twin seconds per wall second and
the operator divides spec.tuning's durations by TIME_SCALE, so a 50 s interval is 5 s.

The two tests that send traffic end by reading the simulators' release lag
(`Traffic.kept_time_scale`) and run in the `alone` tier: beside the other cluster tests
this project's 2-core machine did not keep time scale 10 (docs/reliability.md, "Faults").
The others send no requests, so their simulators release nothing to measure; what is timed
there is the operator's, and they bound it directly (retries, rollback, takeover).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from test_operator_reconcile import (
    Operator,
    apply,
    events,
    must_get,
    pod_identities,
    reconciled,
    settled_peering,
)
from test_rollout import Engine, condition_of, engines, in_sync, reasons, sd_doc

from conftest import eventually
from slipstream import localkube
from slipstream.demo import loopbench
from slipstream.engine import metrics as engine_metrics
from slipstream.localkube import ports
from slipstream.localkube import stack as stack_mod

TIME_SCALE = 10.0
INTERVAL_S = 50  # twin seconds in the spec: 5 s of wall time
WALL_INTERVAL_S = INTERVAL_S / TIME_SCALE
ANALYSIS_S = 150  # twin seconds: 15 s of wall time
NS = "faults"
DEADLINE_S = 90
PEERING_LIFETIME_S = 10
OPERATOR_ENV = {
    "SLIPSTREAM_OBSERVE_MIN_SAMPLES": "10",
    "SLIPSTREAM_CANARY_MIN_SAMPLES": "5",
    "SLIPSTREAM_PROMETHEUS_TIMEOUT_SECONDS": "3",  # the timeout fault holds 30 s; a read on a loaded machine can take over 1 s
    "SLIPSTREAM_ADMIN_TIMEOUT_SECONDS": "1",
    "SLIPSTREAM_ROLLOUT_POLL_SECONDS": "0.5",
    "SLIPSTREAM_ADMIN_ATTEMPTS": "3",
    "SLIPSTREAM_PEERING_LIFETIME_SECONDS": str(PEERING_LIFETIME_S),
}


# -- the fake Prometheus -------------------------------------------------------------------


class FakePrometheus:
    """Proxies /<path>/api/v1/... to the real Prometheus, or misbehaves as `modes[path]` says:
    proxy | error (HTTP 500) | timeout (no answer for 30 s) | garbage (HTTP 200, not JSON) |
    nan (the real answer with every value NaN) | empty (a success with no series).
    Records (monotonic time, path) of every query."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.modes: dict[str, str] = {}
        self.calls: list[tuple[float, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.answer(self, None)

            def do_POST(self) -> None:
                fake.answer(self, self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        port = ports.free_ports(1)[0]
        self.server = ThreadingHTTPServer((ports.LOOPBACK, port), Handler)
        self.server.daemon_threads = True
        self.base = f"http://{ports.LOOPBACK}:{port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str, mode: str = "proxy") -> str:
        self.modes[path] = mode
        return f"{self.base}/{path}"

    def reads(self, path: str, since: float = 0.0) -> list[float]:
        """Times of the fleet reads of one path: each read's first query (the up query)."""
        return [t for t, p in self.calls if p == path and t >= since]

    def answer(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        path, _, rest = handler.path.lstrip("/").partition("/")
        mode = self.modes.get(path, "error")
        if "query" in rest:
            self.calls.append((time.monotonic(), path))
        if mode == "timeout":
            end = time.monotonic() + 30
            while self.modes.get(path) == "timeout" and time.monotonic() < end:
                time.sleep(0.1)
            return  # the connection closes without an answer
        if mode == "error":
            return self.send(handler, 500, b'{"status":"error","error":"injected"}')
        if mode == "garbage":
            return self.send(handler, 200, b"<html>\x00 not prometheus \xff</html>")
        if mode == "empty":
            return self.send(handler, 200, json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": []}}).encode())
        request = urllib.request.Request(self.upstream + "/" + rest, data=body, method=handler.command)
        if body is not None:
            request.add_header("Content-Type", handler.headers.get("Content-Type", "application/x-www-form-urlencoded"))
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status, data = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, data = error.code, error.read()
        except OSError as error:
            return self.send(handler, 502, str(error).encode())
        if mode == "nan" and status == 200:
            doc = json.loads(data)
            for series in doc.get("data", {}).get("result", []):
                series["value"][1] = "NaN"
            data = json.dumps(doc).encode()
        self.send(handler, status, data)

    @staticmethod
    def send(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def stop(self) -> None:
        self.modes = {p: "error" for p in self.modes}
        self.server.shutdown()
        self.server.server_close()


# -- traffic ---------------------------------------------------------------------------------


class Traffic:
    """Short requests to the ready engine pods of the ServingDeployments in `to`, a few per
    second each (the test's stand-in for clients behind the Service)."""

    def __init__(self, stack: stack_mod.Stack) -> None:
        self.stack = stack
        self.to: set[str] = set()
        self.sent = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def targets(self) -> list[str]:
        """Base URLs of the ready engine pods of the ServingDeployments in `to`."""
        runner = self.stack.runner
        if runner is None or not self.to:
            return []
        return [sim["url"] for sim in runner.simulators()
                if sim["ready"] and sim["pod"].startswith(f"{NS}/")
                and sim["pod"].split("/", 1)[1].rsplit("-", 2)[0] in self.to]  # fmt: skip

    def run(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            while not self.stopped.wait(0.1):
                list(pool.map(self.send, self.targets()))  # one request to each pod, all at once

    def send(self, url: str) -> None:
        headers = {"Content-Type": "application/json",
                   engine_metrics.CUSTOM_LABELS_HEADER: json.dumps({"tenant": "team-a"})}  # fmt: skip
        body = {"model": "m", "prompt": " ".join(["word"] * 200), "max_tokens": 2}
        request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
        with contextlib.suppress(OSError):
            urllib.request.urlopen(request, timeout=2).read()
            self.sent += 1

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)

    def kept_time_scale(self) -> None:
        """Fail loudly unless every engine simulator the traffic reaches released its first
        tokens and completions on the scaled clock: the p99 release lag (twin s, each pod's
        whole life) within loopbench's bound. A machine too loaded for TIME_SCALE shows
        here, not as a fault test misreading what the operator did with late metrics."""
        urls = self.targets()
        lag = loopbench.sim_lag_p99(urls)
        print(f"time scale {TIME_SCALE:g} kept: p99 release lag {lag:.2f} twin s over {len(urls)} simulator(s)")
        assert lag <= loopbench.DEFAULT_MAX_LAG_S, (  # NaN (no release measured): no proof, fails
            f"the machine did not keep time scale {TIME_SCALE:g}: the engine simulators' p99 release lag "
            f"is {lag} twin s (bound {loopbench.DEFAULT_MAX_LAG_S:g}); lower TIME_SCALE in tests/cluster/test_faults.py or free the "
            "machine"
        )


# -- the module's stack ----------------------------------------------------------------------


class Faults:
    """What the tests share: the stack, the operator(s), the fake Prometheus, the traffic."""

    def __init__(self, cluster: localkube.Cluster, stack: stack_mod.Stack) -> None:
        self.cluster, self.stack = cluster, stack
        assert stack.prometheus is not None
        self.fake = FakePrometheus(stack.prometheus.url)
        self.traffic = Traffic(stack)
        self.kubeconfig = cluster.token_kubeconfig(stack_mod.RELEASE_NAMESPACE, stack_mod.SERVICE_ACCOUNT)
        self.env = {**stack.operator_env(), **OPERATOR_ENV}
        self.operators: list[Operator] = []

    def operator(self, name: str) -> Operator:
        op = Operator(self.cluster, self.kubeconfig, name, env=self.env)
        op.start()
        self.operators.append(op)
        return op

    def close(self) -> None:
        self.traffic.stop()
        for op in self.operators:
            op.stop()
        self.fake.stop()


@pytest.fixture(scope="module")
def faults(cluster: localkube.Cluster) -> Iterator[Faults]:
    cluster.kubectl("create", "namespace", NS, check=False)
    # Hand edits of owned objects test the drift watch: the owned-objects policy is off.
    options = stack_mod.StackOptions(time_scale=TIME_SCALE, engine_namespace=NS, operator=False,
                                     helm_values=("admissionPolicies.ownedObjects.enabled=false",))
    stack = stack_mod.Stack.attach(cluster, options)
    shared = None
    try:
        stack.install_chart()
        shared = Faults(cluster, stack)
        shared.operator("faults")
        yield shared
    finally:
        if shared is not None:
            shared.close()
        stack.stop()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def auto_sd(name: str, url: str, replicas: int = 1) -> dict[str, Any]:
    doc = sd_doc(name, replicas=replicas)
    doc["spec"]["tuning"] = {"mode": "Auto", "threshold": 4096, "intervalSeconds": INTERVAL_S,
                             "cooldownSeconds": INTERVAL_S, "rollout": {"analysisWindowSeconds": INTERVAL_S}}
    doc["spec"]["prometheus"] = {"url": url}
    return doc


def fixed(name: str, replicas: int = 2) -> dict[str, Any]:
    doc = sd_doc(name, replicas=replicas)
    doc["spec"]["tuning"].update({"intervalSeconds": INTERVAL_S, "cooldownSeconds": INTERVAL_S,
                                  "rollout": {"analysisWindowSeconds": ANALYSIS_S}})
    return doc


def patch_sd(cluster: localkube.Cluster, name: str, tuning: dict[str, Any]) -> None:
    cluster.kubectl("patch", "sd", name, f"--namespace={NS}", "--type=merge", "-p",
                    json.dumps({"spec": {"tuning": tuning}}))  # fmt: skip


def status(cluster: localkube.Cluster, name: str) -> dict[str, Any]:
    return must_get(cluster, "sd", name, NS).get("status") or {}


def warnings(cluster: localkube.Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events(cluster, NS, name) if e["type"] == "Warning" and e["reason"] == reason]


def one_warning(cluster: localkube.Cluster, name: str, reason: str, before: Sequence[dict[str, Any]] = ()) -> None:
    """Exactly one Warning of ``reason``, posted once, besides those of ``before`` (the
    Warnings of an earlier, separate fault: a fault's Warning is judged on its own)."""
    seen = {e["metadata"]["uid"] for e in before}
    every = events(cluster, NS, name)  # one read: the story printed is the one judged
    found = [e for e in every if e["type"] == "Warning" and e["reason"] == reason and e["metadata"]["uid"] not in seen]
    story = [(e.get("lastTimestamp") or e.get("eventTime"), e["type"], e["reason"], e.get("count", 1),
              e.get("message", "")[:160]) for e in every]  # fmt: skip
    assert len(found) == 1 and found[0].get("count", 1) == 1, "\n".join(map(str, story))


def metrics_condition(cluster: localkube.Cluster, name: str, available: bool, reasons_: set[str] | None = None
                      ) -> dict[str, Any]:  # fmt: skip
    c = condition_of(cluster, NS, name, "MetricsAvailable")
    assert c["status"] == ("True" if available else "False"), c
    if reasons_ is not None:
        assert c["reason"] in reasons_, c
    return c


def started(cluster: localkube.Cluster, name: str) -> None:
    st = status(cluster, name)
    assert st.get("observedGeneration") and "MetricsAvailable" in {c["type"] for c in st.get("conditions", [])}, st


LAST_STEP = re.compile(r"^slipstream_tuning_last_step_timestamp_seconds\{([^}]*)\} (\S+)$", re.M)


def operator_metrics(op: Operator) -> str:
    """The operator's /metrics; unreadable (a stalled or dead operator), an AssertionError,
    so that `eventually` waits on and names it."""
    try:
        with urllib.request.urlopen(op.metrics_url, timeout=5) as response:
            return response.read().decode()
    except OSError as error:
        raise AssertionError(f"the operator's metrics are unreadable: {error!r}") from error


def last_steps(op: Operator) -> dict[str, float]:
    """ServingDeployment of NS -> when its tuning loop last finished a step (the operator's
    `slipstream_tuning_last_step_timestamp_seconds`, failed steps included)."""
    out = {}
    for labels, value in LAST_STEP.findall(operator_metrics(op)):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if named.get("namespace") == NS:
            out[named["servingdeployment"]] = float(value)
    return out


def steps_taken(faults: Faults, names: Sequence[str], n: int) -> dict[str, list[float]]:
    """Wait until the tuning loop of each of `names` has finished `n` more steps an interval
    apart (its last-step gauge moved; a rollout's faster polls between them do not count),
    bounded by `n` intervals and DEADLINE_S. What stands for "n intervals in which nothing
    may move" is n looks by the operator, not a sleep: a stalled or dead operator moves
    nothing in any sleep, and fails this. Returns the counted step times (Unix s)."""
    op = faults.operators[0]
    first = eventually(lambda: last_steps(op), deadline_s=DEADLINE_S, what="the operator's metrics")
    base = {name: first.get(name, 0.0) for name in names}
    counted: dict[str, list[float]] = {name: [] for name in names}

    def stepped() -> dict[str, list[float]]:
        now = last_steps(op)
        for name in names:
            last = counted[name][-1] if counted[name] else base[name]
            if name in now and now[name] >= last + 0.9 * WALL_INTERVAL_S:
                counted[name].append(now[name])
        short = {name: len(times) for name, times in counted.items() if len(times) < n}
        assert not short, f"steps an interval apart so far (of {n}): {short}"
        return counted

    return eventually(stepped, deadline_s=n * WALL_INTERVAL_S + DEADLINE_S,
                      what=f"{n} more tuning steps of {list(names)}")  # fmt: skip


DRIFT_EVENTS = re.compile(r'^slipstream_drift_events_(?:judged|skipped)_total\{kind="Deployment"\} (\S+)$', re.M)


def deployment_events(op: Operator) -> float:
    """Events of owned Deployments the operator's drift watch has handled (judged or skipped)."""
    return sum(float(v) for v in DRIFT_EVENTS.findall(operator_metrics(op)))


def events_handled(faults: Faults, name: str, n: int) -> None:
    """Touch the engine Deployment `name` `n` times (a label the operator does not own; an
    annotation would count as a change of the Deployment's generation)
    and wait, each time, until the drift watch has handled one more Deployment event: n
    chances to revert it, seen taken. kopf handles one object's events one at a time, so
    the wait for a last touch beyond the n ends after the n-th handling (a revert included)
    has finished."""
    op = faults.operators[0]
    for i in range(n + 1):
        before = eventually(lambda: deployment_events(op), deadline_s=DEADLINE_S, what="the operator's metrics")
        faults.cluster.kubectl("label", "deployment", name, f"--namespace={NS}", "--overwrite",
                               f"test.slipstream.dev/touch={i}")  # fmt: skip
        eventually(lambda before=before: deployment_events(op) > before, deadline_s=DEADLINE_S,
                   what=f"the drift watch handled touch {i + 1} of Deployment {name}")  # fmt: skip


def thresholds(pods: dict[str, Engine]) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for pod, engine in pods.items():
        try:
            out[pod] = engine.threshold
        except (OSError, ValueError, KeyError):
            out[pod] = None
    return out


def converged(cluster: localkube.Cluster, name: str, pods: dict[str, Engine], threshold: int) -> None:
    """Every engine, status and EnginesInSync at `threshold`, no rollout in flight."""
    assert thresholds(pods) == dict.fromkeys(pods, threshold)
    st = status(cluster, name)
    assert st["threshold"] == threshold and st["rollout"]["phase"] == "Idle", st["rollout"]
    in_sync(cluster, NS, name)


# -- Prometheus faults -------------------------------------------------------------------------

PROMETHEUS_FAULTS = {
    "error": {"PrometheusUnreachable"},
    "timeout": {"PrometheusUnreachable"},
    "garbage": {"PrometheusUnreachable"},
    "nan": {"NotFinite"},
    "empty": {"NoSeries", "NoTraffic"},
}


@pytest.mark.alone  # sends traffic: the simulators' lag proves time scale 10 held (kept_time_scale)
def test_prometheus_faults_hold_the_setting_warn_once_back_off_and_recover(faults: Faults) -> None:
    """Each fault on its own ServingDeployment (Auto, one engine under traffic), beside a
    healthy one read through the same fake Prometheus: no setting moves, MetricsAvailable is
    False with the fault's reason, one Warning per fault, failed reads back off, the healthy
    deployment's loop keeps its interval, and all recover when Prometheus answers again."""
    cluster, fake = faults.cluster, faults.fake
    names = {fault: f"prom-{fault}" for fault in PROMETHEUS_FAULTS}
    docs = [auto_sd(sd, fake.url(sd, fault)) for fault, sd in names.items()]
    docs.append(auto_sd("prom-healthy", fake.url("prom-healthy")))
    apply(cluster, NS, *docs)
    faults.traffic.to |= {*names.values(), "prom-healthy"}
    t0 = time.monotonic()
    for fault, sd in names.items():
        eventually(lambda sd=sd, fault=fault: metrics_condition(cluster, sd, False, PROMETHEUS_FAULTS[fault]),
                   deadline_s=DEADLINE_S, what=f"{sd}: MetricsAvailable False")  # fmt: skip

    # Hold the faults for six more steps of every loop: the healthy loop's reads are timed meanwhile.
    hold_from = time.monotonic()
    steps_taken(faults, [*names.values(), "prom-healthy"], 6)
    elapsed = time.monotonic() - t0
    for fault, sd in names.items():
        c = metrics_condition(cluster, sd, False, PROMETHEUS_FAULTS[fault])
        one_warning(cluster, sd, c["reason"])
        st = status(cluster, sd)
        assert st["threshold"] == 4096 and st["rollout"].get("phase", "Idle") == "Idle", st
        assert "ThresholdChanged" not in reasons(cluster, NS, sd)
        assert must_get(cluster, "configmap", f"{sd}-engine-setting", NS)["data"]["threshold"] == "4096"
        print(f"{fault}: {c['reason']}: {c['message'][:160]}")
    for fault in ("error", "timeout", "garbage"):  # failed reads back off: fewer reads than steps
        reads = fake.reads(names[fault], since=t0)
        gaps = [b - a for a, b in zip(reads, reads[1:], strict=False)]
        print(f"{fault}: {len(reads)} reads in {elapsed:.0f} s ({elapsed / WALL_INTERVAL_S:.0f} intervals), "
              f"gaps {[round(g, 1) for g in gaps]}")  # fmt: skip
        assert len(reads) < elapsed / WALL_INTERVAL_S, reads
        assert gaps and max(gaps) >= 1.5 * WALL_INTERVAL_S, gaps  # a step skipped: backing off
    healthy = fake.reads("prom-healthy", since=hold_from)
    gaps = [b - a for a, b in zip(healthy, healthy[1:], strict=False)]
    print(f"healthy loop's read gaps while the others fail: max {max(gaps):.2f} s (interval {WALL_INTERVAL_S} s)")
    assert max(gaps) <= WALL_INTERVAL_S + 2.5, gaps
    eventually(lambda: metrics_condition(cluster, "prom-healthy", True), deadline_s=DEADLINE_S, what="healthy: True")

    # Prometheus answers again: every deployment recovers, and its loop acts on the data.
    for sd in names.values():
        fake.modes[sd] = "proxy"

    def recovered(sd: str) -> None:
        metrics_condition(cluster, sd, True, {"Fresh"})
        st = status(cluster, sd)
        assert st.get("tenants") and st.get("recommendation"), st

    for sd in names.values():
        eventually(lambda sd=sd: recovered(sd), deadline_s=DEADLINE_S + 300 * 0.1, what=f"{sd} recovered")
    faults.traffic.kept_time_scale()
    faults.traffic.to -= {*names.values(), "prom-healthy"}
    cluster.kubectl("delete", "sd", *names.values(), "prom-healthy", f"--namespace={NS}", "--wait=false")


@pytest.mark.alone  # sends traffic: the simulators' lag proves time scale 10 held (kept_time_scale)
def test_prometheus_stopped_and_traffic_at_zero_move_nothing_and_recover(faults: Faults) -> None:
    """A deployment reading the real Prometheus: no traffic (no action on empty data), then
    traffic (the loop acts), then Prometheus stopped (unreachable: one Warning, nothing
    moves), then started again on the same port (recovery)."""
    cluster, stack = faults.cluster, faults.stack
    assert stack.prometheus is not None
    apply(cluster, NS, auto_sd("quiet", stack.prometheus.url))
    eventually(lambda: started(cluster, "quiet"), deadline_s=DEADLINE_S, what="quiet observed")
    idle = eventually(lambda: metrics_condition(cluster, "quiet", False, {"NoTraffic", "NoSeries", "TooFewSamples"}),
                      deadline_s=DEADLINE_S, what="no traffic")  # fmt: skip
    steps_taken(faults, ["quiet"], 3)  # three idle steps
    assert status(cluster, "quiet")["threshold"] == 4096
    one_warning(cluster, "quiet", metrics_condition(cluster, "quiet", False)["reason"])
    print(f"no traffic: {idle['reason']}: {idle['message'][:160]}")

    faults.traffic.to.add("quiet")

    def acting() -> None:
        metrics_condition(cluster, "quiet", True, {"Fresh"})
        assert status(cluster, "quiet").get("recommendation"), status(cluster, "quiet")

    eventually(acting, deadline_s=DEADLINE_S, what="quiet acting on traffic")

    port = int(stack.prometheus.url.rsplit(":", 1)[1])
    setting = status(cluster, "quiet")["threshold"]
    # A read that timed out while the traffic began (a loaded machine) was a fault of its
    # own, with its own Warning: this outage's is the one posted after it began.
    earlier = warnings(cluster, "quiet", "PrometheusUnreachable")
    stack.prometheus.stop()
    try:
        down = eventually(lambda: metrics_condition(cluster, "quiet", False, {"PrometheusUnreachable"}),
                          deadline_s=DEADLINE_S, what="Prometheus down seen")  # fmt: skip
        steps_taken(faults, ["quiet"], 3)  # three steps with Prometheus down
        one_warning(cluster, "quiet", "PrometheusUnreachable", earlier)
        assert status(cluster, "quiet")["threshold"] == setting
        print(f"Prometheus stopped: {down['message'][:200]}")
    finally:
        stack.prometheus = stack_mod.start_prometheus(
            cluster, stack_mod.StackOptions(time_scale=TIME_SCALE, engine_namespace=NS, prometheus_port=port)
        )
    t_back = time.monotonic()
    eventually(acting, deadline_s=DEADLINE_S, what="quiet recovered after Prometheus restarted")
    print(f"recovered {time.monotonic() - t_back:.1f} s after Prometheus was back")
    faults.traffic.kept_time_scale()

    # Traffic to zero: nothing moves on empty data.
    faults.traffic.to.discard("quiet")
    eventually(lambda: metrics_condition(cluster, "quiet", False), deadline_s=DEADLINE_S + 30, what="traffic gone")
    # A rollout the traffic started may still be in flight: it concludes on the figures of
    # its window (a canary left without figures is rolled back). Only then is the state the
    # one that empty data must leave alone.
    def idle() -> dict[str, Any]:
        st = status(cluster, "quiet")
        assert st["rollout"].get("phase", "Idle") == "Idle", st["rollout"]
        return st

    before = eventually(idle, deadline_s=DEADLINE_S + 30, what="the rollout in flight concluded")
    moves = [r for r in reasons(cluster, NS, "quiet") if r in {"CanaryStarted", "RolloutStarted", "ThresholdChanged"}]
    steps_taken(faults, ["quiet"], 2)  # two steps on empty data
    after = status(cluster, "quiet")
    assert (after["threshold"], after["rollout"].get("phase", "Idle")) == (before["threshold"], "Idle"), after
    assert [r for r in reasons(cluster, NS, "quiet") if r in {"CanaryStarted", "RolloutStarted", "ThresholdChanged"}] \
        == moves, "a rollout started on empty data"
    cluster.kubectl("delete", "sd", "quiet", f"--namespace={NS}", "--wait=false")


# -- engine faults during a rollout --------------------------------------------------------------


@pytest.mark.parametrize("fault", ["timeout", "refuse"])
def test_failing_admin_endpoints_roll_back_and_leave_no_pod_apart(faults: Faults, fault: str) -> None:
    """One of two engines' admin endpoint hangs or drops the connection during a rollout:
    bounded retries, then the other is rolled back; no pod stays on a setting other than the
    fleet's for longer than the analysis window; once the engine answers, all converge.
    (HTTP 500 is test_rollout's case.)"""
    cluster, name = faults.cluster, f"admin-{fault}"
    apply(cluster, NS, fixed(name))
    pods = engines(cluster, faults.stack.runner, NS, name)  # type: ignore[arg-type]
    eventually(lambda: in_sync(cluster, NS, name), deadline_s=DEADLINE_S, what="in sync")
    good, bad = (pods[p] for p in sorted(pods))
    bad.fault(fault)
    patch_sd(cluster, name, {"threshold": 2048})

    apart_since: float | None = None
    longest = 0.0
    deadline = time.monotonic() + DEADLINE_S
    while "RollingBack" not in reasons(cluster, NS, name) or good.threshold != 4096:
        assert time.monotonic() < deadline, reasons(cluster, NS, name)
        fleet = status(cluster, name).get("threshold")
        now = time.monotonic()
        if good.threshold != fleet:
            apart_since = apart_since or now
            longest = max(longest, now - apart_since)
        else:
            apart_since = None
        time.sleep(0.2)
    back = warnings(cluster, name, "RollingBack")
    assert back and "after 3 attempt(s)" in back[0]["message"], back
    print(f"{fault}: {back[0]['message'][:200]}; longest apart {longest:.1f} s")
    # A Fixed edit has no canary: the bound is the retries, each a read and a set that time
    # out, a poll apart, and a step to roll back; within the spec's analysis window too.
    bound = 3 * (0.5 + 2 * 1) + 5.0
    assert longest <= min(bound, ANALYSIS_S / TIME_SCALE), longest

    bad.fault("ok")

    eventually(lambda: converged(cluster, name, pods, 2048), deadline_s=DEADLINE_S,
               what="converged once the engine answers")  # fmt: skip
    assert not any(faults.stack.runner.restarts().values())  # type: ignore[union-attr]
    cluster.kubectl("delete", "sd", name, f"--namespace={NS}", "--wait=false")


# -- the control plane restarted mid-rollout ----------------------------------------------------


@pytest.mark.parametrize("component", ["operator", "kube-apiserver", "etcd"])
def test_restart_mid_rollout_resumes_from_status_and_converges(faults: Faults, component: str) -> None:
    """A rollout held in flight by one hanging engine; the operator SIGKILLed (and started
    again), or the kube-apiserver or etcd restarted, while it is: the rollout resumes from
    status and the fleet converges, without restarting any engine."""
    cluster, name = faults.cluster, f"restart-{component.removeprefix('kube-')}"
    apply(cluster, NS, fixed(name))
    pods = engines(cluster, faults.stack.runner, NS, name)  # type: ignore[arg-type]
    eventually(lambda: in_sync(cluster, NS, name), deadline_s=DEADLINE_S, what="in sync")
    identities = pod_identities(cluster, NS, name)
    bad = pods[sorted(pods)[1]]
    bad.fault("timeout")
    patch_sd(cluster, name, {"threshold": 2048})

    def in_flight() -> dict[str, Any]:
        rollout = status(cluster, name).get("rollout") or {}
        assert rollout.get("phase") not in (None, "Idle"), rollout
        return rollout

    rollout = eventually(in_flight, deadline_s=DEADLINE_S, what="rollout in flight")
    op = faults.operators[0]
    if component == "operator":
        assert op.proc is not None
        op.proc.send_signal(signal.SIGKILL)
        op.proc.wait()
        down = 0.0
    else:
        down = cluster.restart(component)
    bad.fault("ok")
    if component == "operator":
        op.start()
    print(f"{component} restarted during {rollout['phase']} (down {down:.1f} s)")

    eventually(lambda: converged(cluster, name, pods, 2048), deadline_s=DEADLINE_S + PEERING_LIFETIME_S,
               what=f"converged after the {component} restart")  # fmt: skip
    assert op.proc is not None and op.proc.poll() is None, op.log_tail()
    assert pod_identities(cluster, NS, name) == identities
    assert not any(faults.stack.runner.restarts().values())  # type: ignore[union-attr]
    print(f"{component}: events {reasons(cluster, NS, name)}")
    cluster.kubectl("delete", "sd", name, f"--namespace={NS}", "--wait=false")


# -- hand edits of the owned objects -------------------------------------------------------------


def test_hand_edits_of_the_service_and_configmap_are_reverted_with_an_event(faults: Faults) -> None:
    """(The engine Deployment's hand edits are test_operator_safety's.)"""
    cluster, name = faults.cluster, "edited"
    apply(cluster, NS, fixed(name, replicas=1))
    eventually(lambda: in_sync(cluster, NS, name), deadline_s=DEADLINE_S, what="in sync")
    svc = must_get(cluster, "service", name, NS)
    port = svc["spec"]["ports"][0]["port"]
    cluster.kubectl("patch", "service", name, f"--namespace={NS}", "--type=json", "-p",
                    json.dumps([{"op": "replace", "path": "/spec/ports/0/port", "value": 1234}]))  # fmt: skip
    cluster.kubectl("patch", "configmap", f"{name}-engine-setting", f"--namespace={NS}", "--type=merge", "-p",
                    '{"data":{"threshold":"9999"}}')  # fmt: skip

    def reverted() -> None:
        assert must_get(cluster, "service", name, NS)["spec"]["ports"][0]["port"] == port
        assert must_get(cluster, "configmap", f"{name}-engine-setting", NS)["data"]["threshold"] == "4096"
        messages = [e["message"] for e in warnings(cluster, name, "DriftReverted")]
        assert any(m.startswith(f"Reverted Service {name}") and "1234" in m for m in messages), messages
        assert any(m.startswith(f"Reverted ConfigMap {name}-engine-setting") and "9999 -> 4096" in m
                   for m in messages), messages  # fmt: skip

    eventually(reverted, deadline_s=DEADLINE_S, what="Service and ConfigMap edits reverted")
    assert "TuningStepFailed" not in reasons(cluster, NS, name)
    assert faults.operators[0].proc is not None and faults.operators[0].proc.poll() is None
    cluster.kubectl("delete", "sd", name, f"--namespace={NS}", "--wait=false")


# -- an engine restarted with a stale setting ---------------------------------------------------


def test_an_engine_restarted_with_a_stale_setting_is_corrected(faults: Faults) -> None:
    """The simulator of one pod killed after a Fixed edit reached the engines in place: the
    pod runner starts it again from the pod's env as it was at pod start (the old value),
    its gauge shows it, and the operator sets it to the fleet's setting."""
    cluster, runner, name = faults.cluster, faults.stack.runner, "stale"
    assert runner is not None
    apply(cluster, NS, fixed(name))
    pods = engines(cluster, runner, NS, name)
    eventually(lambda: in_sync(cluster, NS, name), deadline_s=DEADLINE_S, what="in sync")
    patch_sd(cluster, name, {"threshold": 2048})
    # The rollout over first: a pod lost mid-rollout is the rollout's case, not this one.
    eventually(lambda: converged(cluster, name, pods, 2048), deadline_s=DEADLINE_S, what="2048 promoted")
    victim = sorted(pods)[0]
    sim = next(s for s in runner.simulators() if s["pod"] == f"{NS}/{victim}")
    os.kill(sim["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    seen: set[int | None] = set()

    def corrected() -> None:
        restarted = next(s for s in runner.simulators() if s["pod"] == f"{NS}/{victim}")
        assert restarted["restarts"] == 1 and restarted["ready"], restarted
        seen.add(thresholds({victim: pods[victim]})[victim])
        assert pods[victim].threshold == 2048
        assert "StalePodCorrected" in reasons(cluster, NS, name)

    eventually(corrected, deadline_s=DEADLINE_S, what="restarted engine corrected")
    print(f"stale engine corrected {time.monotonic() - t0:.1f} s after its simulator was killed; "
          f"values seen {sorted(v for v in seen if v is not None)}")  # fmt: skip
    cluster.kubectl("delete", "sd", name, f"--namespace={NS}", "--wait=false")


# -- two replicas -------------------------------------------------------------------------------


def test_of_two_replicas_one_acts_and_the_other_takes_over_after_a_sigkill(faults: Faults) -> None:
    cluster = faults.cluster
    faults.operator("faults-standby")
    ops = faults.operators[:2]

    def both_announced() -> None:
        peering = json.loads(cluster.kubectl("get", "clusterkopfpeering", "slipstream", "-o", "json").stdout)
        assert len(peering.get("status", {})) >= 2, peering.get("status")

    eventually(both_announced, deadline_s=DEADLINE_S, what="both replicas in the peering object")
    active = settled_peering(cluster, ops)
    apply(cluster, NS, fixed("peer-one", replicas=1))
    eventually(lambda: reconciled(cluster, NS, "peer-one"), deadline_s=DEADLINE_S, what="peer-one reconciled")
    acting = [op for op in ops if f"{NS}/peer-one reconciled" in op.log()]
    assert acting == [active], ([op.name for op in acting], active.name)
    standby = next(op for op in ops if op is not active)
    assert active.proc is not None
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait()
    t0 = time.monotonic()
    apply(cluster, NS, fixed("peer-two", replicas=1))
    eventually(lambda: reconciled(cluster, NS, "peer-two"), deadline_s=PEERING_LIFETIME_S + 60,
               what="the standby took over")  # fmt: skip
    takeover = time.monotonic() - t0
    assert f"{NS}/peer-two reconciled" in standby.log()
    print(f"takeover after SIGKILL of the active replica: {takeover:.1f} s (peering lifetime {PEERING_LIFETIME_S} s)")
    assert takeover <= PEERING_LIFETIME_S + 20
    # Keep one operator for the rest of the module: the survivor is the first.
    faults.operators.remove(active)
    faults.operators.insert(0, standby)
    cluster.kubectl("delete", "sd", "peer-one", "peer-two", f"--namespace={NS}", "--wait=false")

# -- another writer of the Deployment's replicas ------------------------------------------------


def test_a_second_writer_of_replicas_is_reported_not_fought(faults: Faults) -> None:
    """A second controller (field manager `other-autoscaler`) sets the engine Deployment's
    replicas back each time the operator reverts them: after a few reverts the operator
    stops, reports ReplicasManagedElsewhere naming the writer with one Warning, and leaves
    the field alone; changing the ServingDeployment's spec.replicas takes it back."""
    cluster, name = faults.cluster, "contested"
    apply(cluster, NS, fixed(name, replicas=1))
    eventually(lambda: reconciled(cluster, NS, name), deadline_s=DEADLINE_S, what="reconciled")
    writes = 0
    stop = threading.Event()

    def other_controller() -> None:
        nonlocal writes
        while not stop.wait(0.3):
            dep = json.loads(cluster.kubectl("get", "deployment", name, f"--namespace={NS}", "-o", "json").stdout)
            if dep["spec"]["replicas"] != 2:
                cluster.kubectl("patch", "deployment", name, f"--namespace={NS}", "--field-manager=other-autoscaler",
                                "-p", '{"spec":{"replicas":2}}')  # fmt: skip
                writes += 1

    thread = threading.Thread(target=other_controller, daemon=True)
    thread.start()
    try:
        def reported() -> None:
            c = condition_of(cluster, NS, name, "ReplicasManagedElsewhere")
            assert c["status"] == "True" and "other-autoscaler" in c["message"], c
            one_warning(cluster, name, "ReplicasContested")

        eventually(reported, deadline_s=DEADLINE_S, what="the other writer reported")
        fought = writes
        generation = must_get(cluster, "deployment", name, NS)["metadata"]["generation"]
        # Three steps and three Deployment events handled in which nothing may fight.
        steps_taken(faults, [name], 3)
        events_handled(faults, name, 3)
        assert writes == fought, f"the operator kept reverting: {writes - fought} more writes"
        dep = must_get(cluster, "deployment", name, NS)
        assert dep["spec"]["replicas"] == 2 and dep["metadata"]["generation"] == generation, dep["spec"]
        reverted = [e for e in warnings(cluster, name, "DriftReverted") if "spec.replicas" in e["message"]]
        print(f"other writer: {fought} writes before the operator stood back; replica reverts {len(reverted)}")
        assert fought <= 4, fought
    finally:
        stop.set()
        thread.join(timeout=10)

    cluster.kubectl("patch", "sd", name, f"--namespace={NS}", "--type=merge", "-p", '{"spec":{"replicas":3}}')

    def taken_back() -> None:
        assert must_get(cluster, "deployment", name, NS)["spec"]["replicas"] == 3
        conds = {c["type"] for c in status(cluster, name).get("conditions", [])}
        assert "ReplicasManagedElsewhere" not in conds, conds
        assert "ReplicasTakenBack" in reasons(cluster, NS, name)

    eventually(taken_back, deadline_s=DEADLINE_S, what="replicas taken back")
    cluster.kubectl("delete", "sd", name, f"--namespace={NS}", "--wait=false")
