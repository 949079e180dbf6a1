"""The rollout on a real control plane: the generated admin Secret, the key only in env,
a Fixed edit reaching the running engines in place, a stale engine corrected, failing admin
endpoints rolled back after bounded retries, one Warning per new problem, and the
engine-pod runner keeping every simulator while the ConfigMap its env came from is gone.

Engine pods are kwok pods with loopback IPs; the engine-pod runner
(`localkube.podrunner`) starts one `slipstream engine-sim` per pod on the pod's own IP,
with the pod's args and env (the admin key from its Secret, as a kubelet would). The
operator reaches each engine at its pod IP and engine port, as in a real cluster, and runs
as the chart's ServiceAccount with the tuning loop's time scaled by 0.1.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from test_operator_reconcile import (
    Operator,
    apply,
    engine_pods,
    events,
    fixed_sd,
    installed_operator,
    must_get,
    namespace,
    pod_identities,
    reconciled,
    rolled_out,
)

from conftest import eventually
from slipstream import localkube
from slipstream.localkube import podrunner

DEADLINE_S = 60


@pytest.fixture(scope="module")
def runner(cluster: localkube.Cluster) -> Iterator[podrunner.PodRunner]:
    with podrunner.PodRunner(cluster.get_json, cluster.log_dir / "engines") as running:
        yield running


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster, runner: podrunner.PodRunner) -> Iterator[Operator]:
    yield from installed_operator(cluster, "rollout", env={
        "SLIPSTREAM_TUNING_TIME_SCALE": "0.1",
        "SLIPSTREAM_ROLLOUT_POLL_SECONDS": "0.5",
        "SLIPSTREAM_ADMIN_TIMEOUT_SECONDS": "1",
    })  # fmt: skip


def sd_doc(name: str, replicas: int = 2, **tuning: Any) -> dict[str, Any]:
    doc = fixed_sd(name)
    doc["spec"]["replicas"] = replicas
    doc["spec"]["tuning"].update({"intervalSeconds": 10, **tuning})
    return doc


def admin_key(cluster: localkube.Cluster, ns: str, name: str) -> str:
    secret = must_get(cluster, "secret", f"{name}-admin-key", ns)
    return base64.b64decode(secret["data"]["api-key"]).decode()


class Engine:
    """One engine pod's simulator, through its HTTP API."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read() or b"{}")

    def info(self) -> dict[str, Any]:
        return self.call("/get_server_info")

    @property
    def threshold(self) -> int:
        return int(self.info()["long_prefill_token_threshold"])

    def set(self, **server_args: Any) -> None:
        self.call("/set_internal_state", {"server_args": server_args})

    def fault(self, admin: str) -> None:
        self.call("/slipstream/faults", {"admin": admin})


def engines(cluster: localkube.Cluster, runner: podrunner.PodRunner, ns: str, name: str) -> dict[str, Engine]:
    """The engine simulators of every engine pod, once all of them answer."""

    def ready() -> dict[str, Engine]:
        dep = rolled_out(cluster, ns, name)
        pods = engine_pods(cluster, ns, name)
        assert len(pods) == dep["spec"]["replicas"], sorted(pods)
        sims = {s["pod"]: s for s in runner.simulators()}
        missing = [p for p in pods if not sims.get(f"{ns}/{p}", {}).get("ready")]
        assert not missing, f"no ready simulator for {missing}"
        key = admin_key(cluster, ns, name)
        return {p: Engine(sims[f"{ns}/{p}"]["url"], key) for p in sorted(pods)}

    return eventually(ready, deadline_s=DEADLINE_S, what=f"{name} engine simulators ready")


def condition_of(cluster: localkube.Cluster, ns: str, name: str, type_: str) -> dict[str, Any]:
    sd = must_get(cluster, "sd", name, ns)
    found = [c for c in sd.get("status", {}).get("conditions", []) if c["type"] == type_]
    assert found, f"no {type_} condition: {sd.get('status')}"
    return found[0]


def in_sync(cluster: localkube.Cluster, ns: str, name: str) -> None:
    c = condition_of(cluster, ns, name, "EnginesInSync")
    assert c["status"] == "True", c


def reasons(cluster: localkube.Cluster, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in events(cluster, ns, name)]


def steps(operator: Operator) -> float:
    """Tuning steps the operator has run (its own metrics)."""
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
        text = response.read().decode()
    found = re.findall(r'^slipstream_tuning_steps_total\{result="ok"\} (\S+)$', text, re.M)
    return float(found[0]) if found else 0.0


def test_generated_admin_key_reaches_the_engines_only_through_env(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = namespace(cluster, "admin-key")
    apply(cluster, ns, sd_doc("keyed", replicas=1))
    sd = eventually(lambda: reconciled(cluster, ns, "keyed"), deadline_s=DEADLINE_S, what="keyed reconciled")
    secret = must_get(cluster, "secret", "keyed-admin-key", ns)
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("ServingDeployment", "keyed", sd["metadata"]["uid"])
    key = admin_key(cluster, ns, "keyed")
    assert len(key) >= 32

    dep = must_get(cluster, "deployment", "keyed", ns)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["SLIPSTREAM_ADMIN_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "keyed-admin-key", "key": "api-key"}
    assert not [a for a in container["args"] if "admin" in a.lower()], container["args"]
    assert any("Created Secret keyed-admin-key" in e["message"] for e in events(cluster, ns, "keyed"))

    # A spec change does not regenerate the key under running engines.
    cluster.kubectl("patch", "sd", "keyed", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"tuning":{"threshold":2048}}}')  # fmt: skip
    eventually(lambda: reconciled(cluster, ns, "keyed"), deadline_s=DEADLINE_S, what="keyed re-reconciled")
    assert admin_key(cluster, ns, "keyed") == key

    # The key is nowhere but in its Secret: not in the pod spec, status, Events, the
    # operator's log or its metrics.
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
        metrics = response.read().decode()
    for text in (
        cluster.kubectl("get", "deployment,pods,sd,configmaps", f"--namespace={ns}", "-o", "json").stdout,
        json.dumps(events(cluster, ns, "keyed")),
        operator.log(),
        metrics,
    ):
        assert key not in text


def test_fixed_edit_reaches_the_running_engines_in_place(
    cluster: localkube.Cluster, operator: Operator, runner: podrunner.PodRunner
) -> None:
    ns = namespace(cluster, "fixed-edit")
    apply(cluster, ns, sd_doc("fixed"))
    eventually(lambda: reconciled(cluster, ns, "fixed"), deadline_s=DEADLINE_S, what="fixed reconciled")
    pods_engines = engines(cluster, runner, ns, "fixed")
    eventually(lambda: in_sync(cluster, ns, "fixed"), deadline_s=DEADLINE_S, what="engines in sync")
    pods = pod_identities(cluster, ns, "fixed")
    version = must_get(cluster, "deployment", "fixed", ns)["metadata"]["resourceVersion"]

    cluster.kubectl("patch", "sd", "fixed", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"tuning":{"threshold":2048,"schedulePolicy":"srpt"}}}')  # fmt: skip

    def moved() -> dict[str, Any]:
        assert [e.threshold for e in pods_engines.values()] == [2048, 2048]
        assert {e.info()["schedule_policy"] for e in pods_engines.values()} == {"srpt"}
        sd = must_get(cluster, "sd", "fixed", ns)
        st = sd["status"]
        assert (st["threshold"], st["concurrency"], st["schedulePolicy"]) == (2048, 4, "srpt"), st
        assert st["rollout"]["phase"] == "Idle" and st["rollout"]["result"] == "Promoted", st["rollout"]
        assert must_get(cluster, "configmap", "fixed-engine-setting", ns)["data"]["threshold"] == "2048"
        in_sync(cluster, ns, "fixed")
        return sd

    sd = eventually(moved, deadline_s=DEADLINE_S, what="2048 on every engine")
    assert sd["status"]["lastDecision"]["to"]["threshold"] == 2048
    changed = [e["message"] for e in events(cluster, ns, "fixed") if e["reason"] == "ThresholdChanged"]
    assert changed and changed[0].startswith("4096 -> 2048 (concurrency 2 -> 4, order fcfs -> srpt): "), changed
    assert "RolloutStarted" in reasons(cluster, ns, "fixed")
    # In place: the same pods, the same Deployment, no engine restarted.
    assert pod_identities(cluster, ns, "fixed") == pods
    ours = {k: v for k, v in runner.restarts().items() if k.startswith(f"{ns}/")}
    assert ours and not any(ours.values()), ours
    assert must_get(cluster, "deployment", "fixed", ns)["metadata"]["resourceVersion"] == version

    # An engine that comes back with another setting (restarted, hand-edited) is set back.
    stale = pods_engines[sorted(pods_engines)[0]]
    stale.set(long_prefill_token_threshold=8192)

    def corrected() -> None:
        assert stale.threshold == 2048
        assert "StalePodCorrected" in reasons(cluster, ns, "fixed")

    eventually(corrected, deadline_s=DEADLINE_S, what="stale engine set back")

    # Off is the stock engine, reached the same way.
    cluster.kubectl("patch", "sd", "fixed", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"tuning":{"mode":"Off"}}}')  # fmt: skip

    def off() -> None:
        assert [e.threshold for e in pods_engines.values()] == [0, 0]
        assert must_get(cluster, "sd", "fixed", ns)["status"]["threshold"] == 0

    eventually(off, deadline_s=DEADLINE_S, what="tuning Off on every engine")
    describe = cluster.kubectl("describe", "sd", "fixed", f"--namespace={ns}").stdout
    assert "ThresholdChanged" in describe and "EnginesInSync" in describe


def test_failing_admin_endpoint_rolls_back_after_bounded_retries(
    cluster: localkube.Cluster, operator: Operator, runner: podrunner.PodRunner
) -> None:
    ns = namespace(cluster, "admin-failure")
    apply(cluster, ns, sd_doc("flaky", cooldownSeconds=10))
    eventually(lambda: reconciled(cluster, ns, "flaky"), deadline_s=DEADLINE_S, what="flaky reconciled")
    pods_engines = engines(cluster, runner, ns, "flaky")
    eventually(lambda: in_sync(cluster, ns, "flaky"), deadline_s=DEADLINE_S, what="engines in sync")
    good, bad = (pods_engines[p] for p in sorted(pods_engines))
    bad.fault("error")  # every admin call of this engine now answers HTTP 500

    cluster.kubectl("patch", "sd", "flaky", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"tuning":{"threshold":2048}}}')  # fmt: skip

    def rolling_back() -> None:
        assert "RollingBack" in reasons(cluster, ns, "flaky")
        assert good.threshold == 4096, "the engine that took the candidate is set back"
        st = must_get(cluster, "sd", "flaky", ns)["status"]
        assert st["threshold"] == 4096 and st["rollout"]["phase"] == "RollingBack", st["rollout"]
        assert must_get(cluster, "configmap", "flaky-engine-setting", ns)["data"]["threshold"] == "4096"

    eventually(rolling_back, deadline_s=DEADLINE_S, what="rolling back")
    back = [e for e in events(cluster, ns, "flaky") if e["reason"] == "RollingBack"]
    assert back and back[0]["type"] == "Warning" and "after 3 attempt(s)" in back[0]["message"], back
    assert "HTTP 500" in back[0]["message"]

    # The failing engine cannot be told anything (never restarted to force it): the
    # rollback waits for it, and completes once it answers.
    bad.fault("ok")
    eventually(lambda: _in(["RolledBack"], reasons(cluster, ns, "flaky")), deadline_s=DEADLINE_S, what="rolled back")
    assert bad.threshold == 4096, "the failing engine never took the setting"

    def promoted() -> None:
        assert [good.threshold, bad.threshold] == [2048, 2048]
        assert must_get(cluster, "sd", "flaky", ns)["status"]["threshold"] == 2048

    eventually(promoted, deadline_s=DEADLINE_S, what="promoted once the engine answers")


def test_unreachable_engines_give_one_warning_not_one_per_interval(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = namespace(cluster, "unreachable")
    apply(cluster, ns, sd_doc("dark", replicas=1))

    def warned() -> dict[str, Any]:
        c = condition_of(cluster, ns, "dark", "EnginesInSync")
        assert (c["status"], c["reason"]) == ("False", "PodsUnreachable"), c
        return c

    eventually(warned, deadline_s=DEADLINE_S, what="EnginesInSync False")
    later = steps(operator) + 10
    eventually(lambda: _at_least(steps(operator), later), deadline_s=DEADLINE_S, what="ten more tuning steps")
    warnings = [e for e in events(cluster, ns, "dark") if e["reason"] == "PodsUnreachable"]
    assert len(warnings) == 1 and warnings[0].get("count", 1) == 1, warnings


def _in(wanted: list[str], seen: list[str]) -> None:
    assert set(wanted) <= set(seen), seen


def _at_least(value: float, bound: float) -> None:
    assert value >= bound, f"{value} < {bound}"


GC_USER = "system:serviceaccount:kube-system:generic-garbage-collector"
"""An identity that may delete an owned ConfigMap under the default chart's policies (the
garbage collector's; people are refused): used here to take the ConfigMap away."""


def test_the_engine_pod_runner_keeps_each_simulator_while_its_configmap_is_gone(
    cluster: localkube.Cluster, operator: Operator, runner: podrunner.PodRunner
) -> None:
    """The engine pods' env comes from the owned ConfigMap; a kubelet reads it only when it
    starts a container. Deleting the ConfigMap (here as the garbage collector, which the
    policy lets delete) leaves every simulator running, the same process, until and after
    the tuning loop's next step creates it again: no restart, no pod replaced."""
    ns = namespace(cluster, "cm-gone")
    apply(cluster, ns, sd_doc("kept"))
    eventually(lambda: reconciled(cluster, ns, "kept"), deadline_s=DEADLINE_S, what="kept reconciled")
    engines(cluster, runner, ns, "kept")
    pods = pod_identities(cluster, ns, "kept")
    sims = {s["pod"]: (s["uid"], s["pid"]) for s in runner.simulators() if s["pod"].startswith(f"{ns}/")}
    assert len(sims) == 2, sims
    before = must_get(cluster, "configmap", "kept-engine-setting", ns)["metadata"]["uid"]
    assert passes_while_gone(cluster, runner, ns, "kept-engine-setting"), "the ConfigMap was never gone for a pass"

    def recreated() -> None:
        assert must_get(cluster, "configmap", "kept-engine-setting", ns)["metadata"]["uid"] != before

    eventually(recreated, deadline_s=DEADLINE_S, what="the ConfigMap recreated by the tuning loop")
    runner.sync_once()  # and a pass after it came back
    now = {s["pod"]: (s["uid"], s["pid"]) for s in runner.simulators() if s["pod"].startswith(f"{ns}/")}
    assert now == sims, "a simulator was stopped or restarted"
    ours = {k: v for k, v in runner.restarts().items() if k.startswith(f"{ns}/")}
    assert ours and not any(ours.values()), ours
    assert pod_identities(cluster, ns, "kept") == pods
    cluster.kubectl("delete", "sd", "kept", f"--namespace={ns}", "--wait=false")


def passes_while_gone(cluster: localkube.Cluster, runner: podrunner.PodRunner, ns: str, name: str, tries: int = 5) -> int:
    """Delete the ConfigMap and run a pass of the runner; count the passes that ran while it
    was gone (still absent after the pass: the tuning loop recreates it within a step)."""
    seen = 0
    for _ in range(tries):
        cluster.kubectl("delete", "configmap", name, f"--namespace={ns}", f"--as={GC_USER}", "--ignore-not-found")
        runner.sync_once()
        if cluster.kubectl("get", "configmap", name, f"--namespace={ns}", check=False).returncode != 0:
            seen += 1
    return seen
