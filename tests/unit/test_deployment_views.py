"""The status refresh reads the engine Deployments from the drift watch (controller.watch.deployments):
a trimmed view gives the refresh exactly what the full Deployment gives, and a view never seen,
deleted or older than its bound is read again (None: GET it)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slipstream.api import models
from slipstream.controller import objects, status
from slipstream.controller.watch import deployments, replicas

SD = models.ServingDeployment.model_validate({
    "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 3},
    "spec": {"replicas": 2, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 64},
             "tuning": {"mode": "Fixed", "threshold": 4096}},
})  # fmt: skip


def live(available: int, *, generation: int = 4, observed: int = 4, scaled_by: str | None = None) -> dict[str, Any]:
    """The engine Deployment as the apiserver returns it: the operator's object, its
    generation, managedFields (the operator's and the controller manager's, maybe a
    `kubectl scale`) and status."""
    body = copy.deepcopy(objects.deployment(SD))
    body["metadata"].update(generation=generation, resourceVersion="81", uid="d-1", creationTimestamp="t")
    managed = [
        {"manager": "slipstream", "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
         "fieldsV1": {"f:status": {"f:availableReplicas": {}}}},
    ]  # fmt: skip
    if scaled_by:
        managed.append({"manager": scaled_by, "operation": "Update", "subresource": "scale",
                        "fieldsV1": {"f:spec": {"f:replicas": {}}}})  # fmt: skip
    body["metadata"]["managedFields"] = managed
    body["status"] = {"observedGeneration": observed, "replicas": 2, "availableReplicas": available,
                      "updatedReplicas": available, "readyReplicas": available}  # fmt: skip
    return body


def refreshed(deployment: dict[str, Any] | None) -> tuple[Any, ...]:
    """What the status refresh derives from a Deployment."""
    conditions = status.with_readiness(SD, [], deployment, "2026-11-30T00:00:00Z")
    writers = replicas.writers(deployment, "slipstream") if deployment is not None else None
    return conditions, status.readiness_patch(conditions, deployment), writers


@pytest.mark.parametrize(
    "body",
    [live(2), live(1), live(2, generation=5, observed=4), live(2, scaled_by="kubectl"), {"metadata": {"name": "x"}}],
)
def test_the_trimmed_view_gives_the_refresh_what_the_full_deployment_gives(body: dict[str, Any]) -> None:
    view = deployments.trimmed(body)
    assert refreshed(view) == refreshed(body)
    assert "template" not in str(view), "the pod template (the bulk of a Deployment) is not kept"


def test_the_newest_event_is_used_until_it_is_too_old_and_a_deleted_one_is_read_again() -> None:
    views = deployments.Views(max_age_s=300.0)
    assert views.get("prod", "kimi", 0.0) is None, "never seen: GET"
    views.seen(live(1), None, 10.0)  # the watch's initial listing
    views.seen(live(2, scaled_by="kubectl"), "MODIFIED", 20.0)
    got = views.get("prod", "kimi", 319.0)
    assert got is not None and refreshed(got) == refreshed(live(2, scaled_by="kubectl"))
    got["status"]["availableReplicas"] = 0  # a caller's change does not reach the kept view
    assert views.get("prod", "kimi", 30.0)["status"]["availableReplicas"] == 2  # type: ignore[index]
    assert views.get("prod", "kimi", 320.0) is None, "older than max_age_s: GET"
    assert views.get("other", "kimi", 30.0) is None, "by namespace and name"
    views.seen(live(2), "DELETED", 40.0)
    assert views.get("prod", "kimi", 41.0) is None, "deleted: GET (None there: NoDeployment)"
    assert deployments.Views(max_age_s=0.0).get("prod", "kimi", 0.0) is None
    off = deployments.Views(max_age_s=0.0)
    off.seen(live(2), "MODIFIED", 0.0)
    assert off.get("prod", "kimi", 0.0) is None, "0: GET every refresh"


def test_a_get_answer_is_the_view_until_it_is_too_old_unless_an_event_came_meanwhile() -> None:
    views = deployments.Views(max_age_s=300.0)
    views.answered("prod", "kimi", live(1), asked_at=10.0)
    got = views.get("prod", "kimi", 309.0)
    assert got is not None and got["status"]["availableReplicas"] == 1, "a steady Deployment is not read every refresh"
    assert views.get("prod", "kimi", 310.0) is None
    views.seen(live(2), "MODIFIED", 400.0)
    views.answered("prod", "kimi", live(1), asked_at=399.0)  # asked before that event: older
    assert views.get("prod", "kimi", 401.0)["status"]["availableReplicas"] == 2  # type: ignore[index]
    views.answered("prod", "kimi", None, asked_at=399.0)
    assert views.get("prod", "kimi", 401.0) is not None, "a 404 asked before the event does not undo it"
    views.answered("prod", "kimi", None, asked_at=800.0)
    assert views.get("prod", "kimi", 801.0) is None, "not found: no view"
