"""Conflicting writes on a real control plane (issue 10): another client writes the
ServingDeployment's status and the owned ConfigMap and Deployment while the operator runs.

The operator's only optimistic-concurrency write is the tuning loop's status patch
(`handlers.write_status`: at the version it was read, merged on HTTP 409); the owned objects
are server-side applied with `force`, so a competing field manager is drift, reverted with a
`DriftReverted` Event. These tests make both happen with a real apiserver's answers and check
that the operator converges without a crash loop.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from test_operator_reconcile import (
    CHART,
    RELEASE_NS,
    SA,
    SECRET_NAMES,
    Operator,
    apply,
    container,
    events,
    fixed_sd,
    must_get,
    namespace,
    reconciled,
    rolled_out,
)

from conftest import eventually
from slipstream import localkube
from slipstream.api import models
from slipstream.controller import handlers, objects
from slipstream.controller.clients import kube as kube_

DEADLINE_S = 45
RIVAL = "rival-controller"
"""The competing writer's field manager."""


@pytest.fixture(scope="module")
def release(cluster: localkube.Cluster) -> Iterator[None]:
    """The chart (CRD, RBAC) installed, no operator yet: the unit-level test writes alone."""
    cluster.helm("install", "slipstream", str(CHART), f"--namespace={RELEASE_NS}", "--create-namespace",
                 f"--set=rbac.secretNames={{{','.join(SECRET_NAMES)}}}",
                 # The rival writes owned objects: the drift fallback is what is tested.
                 "--set=admissionPolicies.ownedObjects.enabled=false")  # fmt: skip
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/servingdeployments.serving.slipstream.dev")  # fmt: skip
    try:
        yield
    finally:
        cluster.helm("uninstall", "slipstream", f"--namespace={RELEASE_NS}", check=False)


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster, release: None) -> Iterator[Operator]:
    op = Operator(cluster, cluster.token_kubeconfig(RELEASE_NS, SA), "conflicts",
                  env={"SLIPSTREAM_TUNING_TIME_SCALE": "0.1"})  # fmt: skip
    op.start()
    try:
        yield op
    finally:
        op.stop()


class Counting(kube_.Kube):
    """The real client, counting the 409s the apiserver answers to status writes."""

    conflicts = 0

    def patch_status(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().patch_status(*args, **kwargs)
        except kube_.ApiError as error:
            self.conflicts += error.status == 409
            raise


class Overtaken(Counting):
    """Every fresh read is overtaken by another writer (`rival`) before the retry lands."""

    rival: kube_.Kube
    overtakes = 0

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = super().get(api_version, kind, namespace, name)
        if kind == models.KIND:
            self.overtakes += 1  # a new value each time: a write that changes nothing keeps the version
            rival_status(self.rival, namespace, name, f"overtaken {self.overtakes}")
        return found


def admin(cluster: localkube.Cluster, cls: type[kube_.Kube] = kube_.Kube) -> Any:
    return cls(kube_.login(kubeconfig=cluster.kubeconfig))


def condition(type_: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip


def rival_status(kube: kube_.Kube, ns: str, name: str, message: str, version: str | None = None) -> None:
    """Another client's status write: its own condition, and a threshold the engines do not run."""
    sd = kube.get(models.API_VERSION, models.KIND, ns, name) or {}
    others = [c for c in (sd.get("status") or {}).get("conditions") or [] if c["type"] != "RivalChecked"]
    kube.patch_status(models.API_VERSION, models.PLURAL, ns, name,
                      {"threshold": 9999, "conditions": [*others, condition("RivalChecked", "Rival", message)]},
                      version)  # fmt: skip


def test_a_stale_status_write_meets_a_real_409_and_merges(cluster: localkube.Cluster, release: None) -> None:
    ns = namespace(cluster, "stale-status")
    apply(cluster, ns, fixed_sd("stale"))
    kube = admin(cluster, Counting)
    read = kube.get(models.API_VERSION, models.KIND, ns, "stale")
    rival_status(kube, ns, "stale", "after the read")  # the read is stale now
    ours = [condition("EnginesInSync", "InSync"), condition("MetricsAvailable", "Fresh")]
    handlers.write_status(kube, read, {"threshold": 4096, "conditions": ours})
    assert kube.conflicts == 1, "the write at the stale version was not refused"
    stored = must_get(cluster, "sd", "stale", ns)["status"]
    by_type = {c["type"]: c for c in stored["conditions"]}
    assert by_type["RivalChecked"]["message"] == "after the read", "another writer's condition was lost"
    assert by_type["EnginesInSync"]["reason"] == "InSync" and by_type["MetricsAvailable"]["reason"] == "Fresh"
    assert stored["threshold"] == 4096 and stored["phase"], stored

    # Overtaken on every retry: bounded (three tries), then the 409 goes to the caller
    # (the tuning loop says so once and re-reads next step), never a loop of retries.
    racing = admin(cluster, Overtaken)
    racing.rival = kube
    stale = kube.get(models.API_VERSION, models.KIND, ns, "stale")
    rival_status(kube, ns, "stale", "again")
    with pytest.raises(kube_.ApiError) as refused:
        handlers.write_status(racing, stale, {"threshold": 4096, "conditions": ours})
    assert refused.value.status == 409 and racing.conflicts == 3, (refused.value, racing.conflicts)


class Rival(threading.Thread):
    """A second controller writing the status (optimistically, at the version it read),
    the ConfigMap's threshold and the Deployment's args (server-side apply as its own field
    manager, forced) until stopped."""

    def __init__(self, kube: kube_.Kube, ns: str, name: str, engine: str, args: list[str]) -> None:
        super().__init__(daemon=True)
        self.kube, self.ns, self.name, self.engine, self.args = kube, ns, name, engine, args
        self.stopped = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None

    def apply_as_rival(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.kube.request("PATCH", kube_.path_of(obj["apiVersion"], obj["kind"], self.ns, meta["name"]), body=obj,
                          query=[("fieldManager", RIVAL), ("force", "true")],
                          content_type="application/apply-patch+yaml")  # fmt: skip

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                sd = self.kube.get(models.API_VERSION, models.KIND, self.ns, self.name) or {}
                try:
                    rival_status(self.kube, self.ns, self.name, f"round {self.rounds}", sd["metadata"]["resourceVersion"])
                except kube_.ApiError as error:  # the rival's own read went stale: its problem
                    if error.status != 409:
                        raise
                self.apply_as_rival({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                    "name": objects.setting_configmap_name(self.name), "namespace": self.ns},
                    "data": {"threshold": "9999"}})  # fmt: skip
                if self.rounds % 5 == 0:
                    self.apply_as_rival({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
                        "name": self.name, "namespace": self.ns}, "spec": {"template": {"spec": {"containers": [
                            {"name": self.engine, "args": [*self.args, "--tp-size=4"]}]}}}})  # fmt: skip
                self.rounds += 1
                self.stopped.wait(0.1)  # pacing of the writer, not a readiness wait
        except BaseException as error:  # reported by the test
            self.error = error


def tuning_steps(operator: Operator) -> float:
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
        text = response.read().decode()
    lines = [line for line in text.splitlines() if line.startswith('slipstream_tuning_steps_total{result="ok"}')]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_conflicting_writers_meet_an_operator_that_converges_without_a_crash_loop(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    started = time.monotonic()
    ns = namespace(cluster, "conflicts")
    doc = fixed_sd("contested")
    doc["spec"]["tuning"]["intervalSeconds"] = 10  # a step a second at the tests' time scale
    apply(cluster, ns, doc)
    eventually(lambda: reconciled(cluster, ns, "contested"), deadline_s=DEADLINE_S, what="reconciled")
    eventually(lambda: rolled_out(cluster, ns, "contested"), deadline_s=DEADLINE_S, what="rolled out")

    def stepping() -> dict[str, Any]:
        sd = must_get(cluster, "sd", "contested", ns)
        assert {"EnginesInSync", "RolloutProgressing"} <= {c["type"] for c in sd["status"].get("conditions", [])}
        return sd

    eventually(stepping, deadline_s=DEADLINE_S, what="the tuning loop's first status")
    engine = container(must_get(cluster, "deployment", "contested", ns))
    steps_before = tuning_steps(operator)
    rival = Rival(admin(cluster), ns, "contested", engine["name"], engine["args"])
    rival.start()
    try:
        def conflicted() -> None:
            assert rival.error is None, rival.error
            assert "(HTTP 409)" in operator.log(), "no status write of the operator's met a conflict yet"
            assert rival.rounds >= 10, rival.rounds

        eventually(conflicted, deadline_s=DEADLINE_S, what="the operator's status writes meeting 409s")
    finally:
        rival.stopped.set()
        rival.join(timeout=10)
    assert rival.error is None, rival.error

    def converged() -> None:
        sd = must_get(cluster, "sd", "contested", ns)
        assert sd["status"]["threshold"] == 4096 and sd["status"]["concurrency"] == 2, sd["status"]
        cm = must_get(cluster, "configmap", objects.setting_configmap_name("contested"), ns)
        assert cm["data"]["threshold"] == "4096", cm["data"]
        assert container(must_get(cluster, "deployment", "contested", ns))["args"] == engine["args"]
        reverted = [e["message"] for e in events(cluster, ns, "contested") if e["reason"] == "DriftReverted"]
        assert any("data.threshold: 9999 -> 4096" in m and RIVAL in m for m in reverted), reverted
        assert any("added --tp-size=4" in m for m in reverted), reverted
        assert tuning_steps(operator) >= steps_before + 3, "the tuning loop stopped stepping"

    eventually(converged, deadline_s=DEADLINE_S, what="converged after the rival stopped")
    failed = [e["message"] for e in events(cluster, ns, "contested") if e["reason"] == "TuningStepFailed"]
    assert not [m for m in failed if "409" in m], failed
    assert operator.proc is not None and operator.proc.poll() is None, operator.log_tail()
    assert "Traceback" not in operator.log(), operator.log_tail()
    print(f"conflicts: {rival.rounds} rival rounds, {operator.log().count('(HTTP 409)')} operator 409s merged, "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
