"""Drift of owned objects: a hand edit of a field the operator sets is found and named;
what the apiserver or other managers add is not drift."""

from __future__ import annotations

import copy

from slipstream.api import models
from slipstream.controller import objects
from slipstream.controller.watch import drift


def sd() -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
        "spec": {"replicas": 2, "engine": {"image": "i:1", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 64},
                 "tuning": {"mode": "Fixed", "threshold": 4096}},
    })  # fmt: skip


def live_of(desired: dict) -> dict:
    """The object as the apiserver returns it: defaults and status added."""
    live = copy.deepcopy(desired)
    live["metadata"].update({"uid": "x", "resourceVersion": "7", "labels": {**live["metadata"]["labels"], "extra": "1"}})
    live["spec"]["revisionHistoryLimit"] = 10
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    live["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["scheme"] = "HTTP"
    live["status"] = {"replicas": 2}
    return live


def test_defaults_and_status_are_not_drift() -> None:
    desired = objects.deployment(sd())
    assert drift.of_object(desired, live_of(desired)) == []
    service = objects.service(sd())
    assert drift.of_object(service, live_of_service(service)) == []


def live_of_service(desired: dict) -> dict:
    live = copy.deepcopy(desired)
    live["spec"].update({"clusterIP": "10.0.0.1", "type": "ClusterIP", "sessionAffinity": "None"})
    return live


def test_kubectl_scale_and_an_extra_argument_are_named() -> None:
    desired = objects.deployment(sd())
    live = live_of(desired)
    live["spec"]["replicas"] = 5
    live["spec"]["template"]["spec"]["containers"][0]["args"].append("--tp-size=4")
    found = drift.of_object(desired, live)
    assert "spec.replicas: 5 -> 2" in found
    assert "spec.template.spec.containers[0].args: added --tp-size=4" in found
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "other:2"
    assert "spec.template.spec.containers[0].image: other:2 -> i:1" in drift.of_object(desired, live)


def test_removed_fields_and_labels_are_drift() -> None:
    desired = objects.service(sd())
    live = live_of_service(desired)
    live["spec"]["selector"] = {}
    live["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
    found = drift.of_object(desired, live)
    assert "spec.selector.serving.slipstream.dev/name: removed" in found
    assert "metadata.labels.app.kubernetes.io/managed-by: removed" in found
