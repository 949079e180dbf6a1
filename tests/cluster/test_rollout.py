"""The rollout on a real control plane: the generated admin Secret, the key only in env,
a Fixed edit reaching the running engines in place, a stale pod corrected, failing admin
endpoints rolled back after bounded retries, and one Warning per new problem.

Engine pods are kwok pods (nothing runs in them); each gets an engine stand-in
(`engine_stub.EngineStub`) on 127.0.0.1, and the operator reaches it through its
test-only address file (`SLIPSTREAM_ENGINE_ADDRESSES_FILE`). The operator runs as the
chart's ServiceAccount, with the tuning loop's time scaled by 0.1.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_stub import EngineStub
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
)  # fmt: skip

from conftest import eventually
from slipstream import localkube

DEADLINE_S = 60


@pytest.fixture(scope="module")
def addresses(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rollout") / "engine-addresses.json"
    path.write_text("{}")
    return path


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster, addresses: Path) -> Iterator[Operator]:
    yield from installed_operator(cluster, "rollout", env={
        "SLIPSTREAM_ENGINE_ADDRESSES_FILE": str(addresses),
        "SLIPSTREAM_TUNING_TIME_SCALE": "0.1",
        "SLIPSTREAM_ROLLOUT_POLL_SECONDS": "0.5",
        "SLIPSTREAM_ADMIN_TIMEOUT_SECONDS": "1",
    })  # fmt: skip


@pytest.fixture
def stubs() -> Iterator[list[EngineStub]]:
    started: list[EngineStub] = []
    yield started
    for stub in started:
        stub.stop()


def sd_doc(name: str, replicas: int = 2, **tuning: Any) -> dict[str, Any]:
    doc = fixed_sd(name)
    doc["spec"]["replicas"] = replicas
    doc["spec"]["tuning"].update({"intervalSeconds": 10, **tuning})
    return doc


def admin_key(cluster: localkube.Cluster, ns: str, name: str) -> str:
    secret = must_get(cluster, "secret", f"{name}-admin-key", ns)
    return base64.b64decode(secret["data"]["api-key"]).decode()


def serve(cluster: localkube.Cluster, ns: str, name: str, addresses: Path, stubs: list[EngineStub],
          threshold: int = 4096) -> dict[str, EngineStub]:  # fmt: skip
    """An engine stand-in per Ready engine pod, registered in the operator's address file."""

    def ready() -> dict[str, Any]:
        dep = rolled_out(cluster, ns, name)
        pods = engine_pods(cluster, ns, name)
        assert len(pods) == dep["spec"]["replicas"], sorted(pods)
        return pods

    pods = eventually(ready, deadline_s=DEADLINE_S, what=f"{name} engine pods Ready")
    key = admin_key(cluster, ns, name)
    by_pod = {pod: EngineStub(key, threshold).start() for pod in sorted(pods)}
    stubs.extend(by_pod.values())
    table = json.loads(addresses.read_text())
    table.update({f"{ns}/{pod}": stub.url for pod, stub in by_pod.items()})
    addresses.write_text(json.dumps(table))
    return by_pod


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

    # The key is nowhere but in its Secret: not in the pod spec, status, Events or log.
    for text in (
        cluster.kubectl("get", "deployment,pods,sd,configmaps", f"--namespace={ns}", "-o", "json").stdout,
        json.dumps(events(cluster, ns, "keyed")),
        operator.log(),
    ):
        assert key not in text


def test_fixed_edit_reaches_the_running_engines_in_place(
    cluster: localkube.Cluster, operator: Operator, addresses: Path, stubs: list[EngineStub]
) -> None:
    ns = namespace(cluster, "fixed-edit")
    apply(cluster, ns, sd_doc("fixed"))
    eventually(lambda: reconciled(cluster, ns, "fixed"), deadline_s=DEADLINE_S, what="fixed reconciled")
    engines = serve(cluster, ns, "fixed", addresses, stubs)
    eventually(lambda: in_sync(cluster, ns, "fixed"), deadline_s=DEADLINE_S, what="engines in sync")
    pods = pod_identities(cluster, ns, "fixed")
    version = must_get(cluster, "deployment", "fixed", ns)["metadata"]["resourceVersion"]

    cluster.kubectl("patch", "sd", "fixed", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"tuning":{"threshold":2048,"schedulePolicy":"srpt"}}}')  # fmt: skip

    def moved() -> dict[str, Any]:
        assert [s.threshold for s in engines.values()] == [2048, 2048]
        assert {s.state["schedule_policy"] for s in engines.values()} == {"srpt"}
        sd = must_get(cluster, "sd", "fixed", ns)
        st = sd["status"]
        assert (st["threshold"], st["concurrency"], st["schedulePolicy"]) == (2048, 4, "srpt"), st
        assert st["rollout"]["phase"] == "Idle" and st["rollout"]["result"] == "Promoted", st["rollout"]
        assert must_get(cluster, "configmap", "fixed-engine-setting", ns)["data"]["threshold"] == "2048"
        in_sync(cluster, ns, "fixed")
        return sd

    sd = eventually(moved, deadline_s=DEADLINE_S, what="2048 on every engine")
    assert all(s.sets == 1 and s.unauthorized == 0 for s in engines.values())
    assert sd["status"]["lastDecision"]["to"]["threshold"] == 2048
    changed = [e["message"] for e in events(cluster, ns, "fixed") if e["reason"] == "ThresholdChanged"]
    assert changed and changed[0].startswith("4096 -> 2048 (concurrency 2 -> 4, order fcfs -> srpt): "), changed
    assert "RolloutStarted" in reasons(cluster, ns, "fixed")
    # In place: the same pods, the same Deployment.
    assert pod_identities(cluster, ns, "fixed") == pods
    assert must_get(cluster, "deployment", "fixed", ns)["metadata"]["resourceVersion"] == version

    # An engine that comes back with another setting (restarted, hand-edited) is set back.
    stale = engines[sorted(engines)[0]]
    stale.state["long_prefill_token_threshold"] = 8192

    def corrected() -> None:
        assert stale.threshold == 2048
        assert "StalePodCorrected" in reasons(cluster, ns, "fixed")

    eventually(corrected, deadline_s=DEADLINE_S, what="stale engine set back")

    # Off is the stock engine, reached the same way.
    cluster.kubectl("patch", "sd", "fixed", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"tuning":{"mode":"Off"}}}')  # fmt: skip

    def off() -> None:
        assert [s.threshold for s in engines.values()] == [0, 0]
        assert must_get(cluster, "sd", "fixed", ns)["status"]["threshold"] == 0

    eventually(off, deadline_s=DEADLINE_S, what="tuning Off on every engine")
    describe = cluster.kubectl("describe", "sd", "fixed", f"--namespace={ns}").stdout
    assert "ThresholdChanged" in describe and "EnginesInSync" in describe


def test_failing_admin_endpoint_rolls_back_after_bounded_retries(
    cluster: localkube.Cluster, operator: Operator, addresses: Path, stubs: list[EngineStub]
) -> None:
    ns = namespace(cluster, "admin-failure")
    apply(cluster, ns, sd_doc("flaky", cooldownSeconds=10))
    eventually(lambda: reconciled(cluster, ns, "flaky"), deadline_s=DEADLINE_S, what="flaky reconciled")
    engines = serve(cluster, ns, "flaky", addresses, stubs)
    eventually(lambda: in_sync(cluster, ns, "flaky"), deadline_s=DEADLINE_S, what="engines in sync")
    good, bad = (engines[p] for p in sorted(engines))
    bad.admin = "error"

    cluster.kubectl("patch", "sd", "flaky", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"tuning":{"threshold":2048}}}')  # fmt: skip

    def rolled_back() -> None:
        assert "RolledBack" in reasons(cluster, ns, "flaky")
        assert [good.threshold, bad.threshold] == [4096, 4096]
        st = must_get(cluster, "sd", "flaky", ns)["status"]
        assert st["threshold"] == 4096
        assert must_get(cluster, "configmap", "flaky-engine-setting", ns)["data"]["threshold"] == "4096"

    eventually(rolled_back, deadline_s=DEADLINE_S, what="rolled back")
    back = [e for e in events(cluster, ns, "flaky") if e["reason"] == "RollingBack"]
    assert back and back[0]["type"] == "Warning" and "after 3 attempt(s)" in back[0]["message"], back
    assert "HTTP 503" in back[0]["message"]

    bad.admin = "ok"

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


def _at_least(value: float, bound: float) -> None:
    assert value >= bound, f"{value} < {bound}"
