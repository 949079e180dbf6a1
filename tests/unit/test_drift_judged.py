"""The drift watch's memory of good judgements (`controller/watch/judged.py`): an event that moved
only an owned object's status is skipped; any change of what the operator owns on it (spec,
labels, annotations, owner references), or of its ServingDeployment's spec or replicas
contest, is judged; a failed judgement records nothing; DELETED forgets."""

from __future__ import annotations

import copy
from typing import Any

from slipstream.api import models
from slipstream.controller import objects
from slipstream.controller.watch import judged, replicas


def sd_body(generation: int = 1, contested: bool = False) -> dict[str, Any]:
    conditions = [{"type": replicas.CONDITION, "status": "True", "reason": "OtherWriter"}] if contested else []
    return {
        "apiVersion": models.API_VERSION, "kind": models.KIND,
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "sd-uid", "generation": generation,
                     "resourceVersion": "40"},
        "spec": {"replicas": 2, "engine": {"image": "i:1", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 64},
                 "tuning": {"mode": "Fixed", "threshold": 4096}},
        "status": {"conditions": conditions, "observedGeneration": generation},
    }  # fmt: skip


def live_deployment() -> dict[str, Any]:
    """The engine Deployment as a watch event brings it: the rendered one plus what the
    apiserver and the deployment controller add."""
    dep = objects.deployment(models.ServingDeployment.model_validate(sd_body()))
    dep["metadata"].update({
        "uid": "dep-uid", "resourceVersion": "7", "generation": 1,
        "annotations": {"deployment.kubernetes.io/revision": "1"},
        "managedFields": [{"manager": "slipstream", "operation": "Apply", "time": "2026-11-30T19:00:00Z"}],
    })  # fmt: skip
    dep["status"] = {"replicas": 2, "readyReplicas": 0, "observedGeneration": 1}
    return dep


def judged_once(dep: dict[str, Any], sd: dict[str, Any] | None = None) -> judged.Judged:
    memory = judged.Judged()
    memory.owner_seen(sd or sd_body(), None)
    memory.record(dep, sd or sd_body())
    return memory


def status_moved(dep: dict[str, Any]) -> dict[str, Any]:
    """A status-only event: readiness, a new resourceVersion and managedFields entry."""
    out = copy.deepcopy(dep)
    out["metadata"]["resourceVersion"] = "8"
    out["metadata"]["managedFields"].append(
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"}
    )
    out["status"].update({"readyReplicas": 2, "availableReplicas": 2})
    return out


def test_a_status_only_event_is_skipped() -> None:
    dep = live_deployment()
    memory = judged_once(dep)
    assert memory.unchanged(status_moved(dep), "MODIFIED")
    assert memory.unchanged(status_moved(status_moved(dep)), "MODIFIED")


def test_the_listing_an_unknown_object_and_a_deletion_are_always_judged() -> None:
    dep = live_deployment()
    memory = judged_once(dep)
    assert not memory.unchanged(status_moved(dep), None)  # the listing (start, watch restart)
    assert not memory.unchanged(status_moved(dep), "DELETED")
    other = copy.deepcopy(dep)
    other["metadata"]["uid"] = "another-uid"  # deleted and created again under the same name
    assert not memory.unchanged(other, "MODIFIED")
    assert not judged.Judged().unchanged(dep, "MODIFIED")  # never judged


def edited(dep: dict[str, Any], edit: str) -> dict[str, Any]:
    out = status_moved(dep)
    if edit == "kubectl scale":
        out["spec"]["replicas"] = 5
    elif edit == "an extra argument":
        out["spec"]["template"]["spec"]["containers"][0]["args"].append("--tp-size=4")
    elif edit == "a label":
        out["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone"
    elif edit == "a label removed":
        del out["metadata"]["labels"][objects.NAME_LABEL]
    elif edit == "an annotation":
        out["metadata"]["annotations"]["team"] = "b"
    elif edit == "the owner reference":
        out["metadata"]["ownerReferences"] = []
    else:
        raise AssertionError(edit)
    return out


EDITS = ("kubectl scale", "an extra argument", "a label", "a label removed", "an annotation", "the owner reference")


def test_any_change_of_an_owned_part_is_judged() -> None:
    dep = live_deployment()
    memory = judged_once(dep)
    for edit in EDITS:
        assert not memory.unchanged(edited(dep, edit), "MODIFIED"), edit
        assert judged.digest(edited(dep, edit)) != judged.digest(dep), edit


def test_kubectls_copy_of_an_apply_is_not_an_owned_part() -> None:
    dep = live_deployment()
    memory = judged_once(dep)
    copied = status_moved(dep)
    copied["metadata"]["annotations"][next(iter(judged.NOISE))] = '{"spec": {"replicas": 2}}'
    assert memory.unchanged(copied, "MODIFIED")


def test_a_new_spec_or_a_replicas_contest_of_the_owner_is_judged() -> None:
    """The desired object follows the ServingDeployment's spec and contest: an event after
    either moved is judged, even if the object's own parts did not change (a judgement made
    against the old spec, or a reconcile whose apply failed)."""
    dep = live_deployment()
    for moved in (sd_body(generation=2), sd_body(contested=True)):
        memory = judged_once(dep)
        memory.owner_seen(moved, "MODIFIED")
        assert not memory.unchanged(status_moved(dep), "MODIFIED")
        memory.record(dep, moved)  # judged against the new one: skipped again
        assert memory.unchanged(status_moved(dep), "MODIFIED")


def test_a_status_write_of_the_owner_keeps_the_skip() -> None:
    """The tuning loop writes the ServingDeployment's status every interval: that moves
    neither its generation nor the replicas contest."""
    dep = live_deployment()
    memory = judged_once(dep)
    written = sd_body()
    written["metadata"]["resourceVersion"] = "41"
    written["status"].update({"threshold": 2048, "phase": "Ready"})
    memory.owner_seen(written, "MODIFIED")
    assert memory.unchanged(status_moved(dep), "MODIFIED")


def test_an_owner_not_seen_by_its_watch_is_judged() -> None:
    dep = live_deployment()
    memory = judged.Judged()
    memory.record(dep, sd_body())  # the Deployment's watch ahead of the ServingDeployments'
    assert not memory.unchanged(status_moved(dep), "MODIFIED")
    memory.owner_seen(sd_body(), None)
    assert memory.unchanged(status_moved(dep), "MODIFIED")
    memory.owner_seen(sd_body(), "DELETED")
    assert not memory.unchanged(status_moved(dep), "MODIFIED")
    assert memory.owners == {}


def test_a_failed_judgement_records_nothing_so_the_next_event_retries() -> None:
    """The handler forgets the object before judging and records only a judgement that
    ended well: after a failure (an ApiError) the next status-only event is judged."""
    dep = live_deployment()
    memory = judged_once(dep)
    scaled = edited(dep, "kubectl scale")
    assert not memory.unchanged(scaled, "MODIFIED")
    memory.forget(scaled)  # judging it; the revert then fails: nothing recorded
    assert not memory.unchanged(status_moved(scaled), "MODIFIED")
    assert not memory.unchanged(status_moved(dep), "MODIFIED")  # not even the old good state


def test_the_same_hand_edit_again_after_a_revert_is_judged() -> None:
    """After a revert the state the revert left is recorded, not the edited one: a second
    `kubectl scale` to the same count is judged even if the event of the revert itself was
    never handled (kopf hands on only the latest event of a burst)."""
    dep = live_deployment()
    memory = judged_once(dep)
    scaled = edited(dep, "kubectl scale")
    memory.forget(scaled)
    reverted = status_moved(dep)
    reverted["metadata"]["resourceVersion"] = "9"
    memory.record(reverted, sd_body())  # the apply's answer
    assert not memory.unchanged(edited(dep, "kubectl scale"), "MODIFIED")


def test_deleted_forgets_so_memory_is_bounded_by_live_objects() -> None:
    memory = judged.Judged()
    memory.owner_seen(sd_body(), None)
    deps = []
    for i in range(50):
        dep = live_deployment()
        dep["metadata"]["uid"] = f"dep-{i}"
        memory.record(dep, sd_body())
        deps.append(dep)
    assert len(memory.records) == 50
    for dep in deps:
        memory.forget(dep)
    assert memory.records == {}


def test_a_service_is_digested_the_same_way() -> None:
    svc = objects.service(models.ServingDeployment.model_validate(sd_body()))
    svc["metadata"]["uid"] = "svc-uid"
    svc["spec"]["clusterIP"] = "10.0.0.7"  # set by the apiserver, in spec: part of the digest
    memory = judged_once(svc)
    again = copy.deepcopy(svc)
    again["metadata"]["resourceVersion"] = "12"
    assert memory.unchanged(again, "MODIFIED")
    again["spec"]["ports"][0]["port"] = 8080
    assert not memory.unchanged(again, "MODIFIED")
