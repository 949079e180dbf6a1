"""An HPA on the engine Deployment (`controller/watch/autoscalers.py`) and the drift watch's
repairs with a fake apiserver (`handlers.revert_drift`, `handlers.recreate_deleted`): an
autoscaler's scale is left to it at the first write, never reverted; a deleted owned object
is created again while its owner stands, and not when the owner is gone or going."""

from __future__ import annotations

import copy
from typing import Any

from test_drift_judged import live_deployment, sd_body

from slipstream.api import models
from slipstream.controller import handlers
from slipstream.controller.clients import kube as kube_
from slipstream.controller.watch import autoscalers, replicas


def hpa(name: str, target: str, kind: str = "Deployment", api: str = "apps/v1", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "prod"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    return {"metadata": meta, "spec": {"scaleTargetRef": {"apiVersion": api, "kind": kind, "name": target}}}


def test_targeting_names_the_hpas_of_this_deployment_only() -> None:
    found = [hpa("b", "kimi"), hpa("a", "kimi"), hpa("c", "other"), hpa("d", "kimi", kind="StatefulSet"),
             hpa("e", "kimi", api="example.com/v1"), hpa("f", "kimi", deleting=True), {"metadata": {"name": "g"}}]  # fmt: skip
    assert autoscalers.targeting(found, "kimi") == ["a", "b"]
    assert autoscalers.targeting([], "kimi") == []


def test_held_by_is_the_autoscaler_reason_only() -> None:
    def cond(reason: str, status: str = "True") -> models.Condition:
        return models.Condition(type=replicas.CONDITION, status=status, reason=reason, last_transition_time="2026-12-07T00:00:00Z")  # type: ignore[arg-type]

    assert autoscalers.held_by([cond("Autoscaler")], replicas.CONDITION)
    assert not autoscalers.held_by([cond("OtherWriter")], replicas.CONDITION)
    assert not autoscalers.held_by([cond("Autoscaler", "False")], replicas.CONDITION)


class FakeKube:
    """The calls the drift watch makes, on a dict of objects by (kind, name)."""

    def __init__(self, objs: dict[tuple[str, str], dict[str, Any]], hpas: list[dict[str, Any]] | None = None,
                 hpa_status: int | None = None) -> None:  # fmt: skip
        self.objs, self.hpas, self.hpa_status = objs, hpas or [], hpa_status
        self.applied: list[dict[str, Any]] = []

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objs.get((kind, name))
        return copy.deepcopy(found) if found is not None else None

    def items(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        if self.hpa_status is not None:
            raise kube_.ApiError("GET", "/hpa", self.hpa_status, "forbidden")
        return self.hpas

    def apply(self, obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        self.applied.append(obj)
        self.objs[(obj["kind"], obj["metadata"]["name"])] = obj
        return obj, None, "created"


def scaled_by_hpa() -> dict[str, Any]:
    dep = live_deployment()
    dep["spec"]["replicas"] = 3
    dep["metadata"]["generation"] = 2
    dep["metadata"]["managedFields"].append(
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "scale",
         "fieldsV1": {"f:spec": {"f:replicas": {}}}})  # fmt: skip
    return dep


def test_an_hpas_first_scale_is_left_to_it_with_no_revert() -> None:
    dep = scaled_by_hpa()
    kube = FakeKube({("ServingDeployment", "kimi"): sd_body(), ("Deployment", "kimi"): dep}, [hpa("kimi-hpa", "kimi")])
    found = handlers.revert_drift(kube, "Deployment", dep, replicas.Reverts(), 0.0)  # type: ignore[arg-type]
    assert found is not None and found.contest is not None
    assert (found.contest.reason, found.contest.event) == ("Autoscaler", "AutoscalerFound")
    assert "HorizontalPodAutoscaler kimi-hpa" in found.contest.message and "now 3" in found.contest.message
    assert found.paths == [] and kube.applied == [], "the HPA's replicas were reverted"


def test_another_writer_without_an_hpa_is_reverted_as_before() -> None:
    dep = scaled_by_hpa()
    for kube in (FakeKube({("ServingDeployment", "kimi"): sd_body(), ("Deployment", "kimi"): dep}),
                 FakeKube({("ServingDeployment", "kimi"): sd_body(), ("Deployment", "kimi"): dep}, hpa_status=403)):  # fmt: skip
        found = handlers.revert_drift(kube, "Deployment", dep, replicas.Reverts(), 0.0)  # type: ignore[arg-type]
        assert found is not None and found.contest is None
        assert found.paths == ["spec.replicas: 3 -> 2"]
        assert kube.applied[0]["spec"]["replicas"] == 2


def test_a_deleted_deployment_or_service_is_recreated_while_its_owner_stands() -> None:
    for kind in ("Deployment", "Service"):
        gone = live_deployment() if kind == "Deployment" else {"metadata": live_deployment()["metadata"]}
        kube = FakeKube({("ServingDeployment", "kimi"): sd_body()})
        owner = handlers.recreate_deleted(kube, kind, gone)  # type: ignore[arg-type]
        assert owner is not None and owner["metadata"]["name"] == "kimi"
        assert [o["kind"] for o in kube.applied] == [kind]
        assert handlers.recreate_deleted(kube, kind, gone) is None, "already there again"  # type: ignore[arg-type]


def test_nothing_is_recreated_when_the_owner_is_gone_going_or_another() -> None:
    going = sd_body()
    going["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    other = sd_body()
    other["metadata"]["uid"] = "a-new-one"
    for objs in ({}, {("ServingDeployment", "kimi"): going}, {("ServingDeployment", "kimi"): other}):
        kube = FakeKube(dict(objs))
        assert handlers.recreate_deleted(kube, "Deployment", live_deployment()) is None  # type: ignore[arg-type]
        assert kube.applied == []


def test_a_recreated_deployment_leaves_the_replicas_to_their_holder() -> None:
    sd = sd_body()
    sd["status"]["conditions"] = [{"type": replicas.CONDITION, "status": "True", "reason": "Autoscaler",
                                   "lastTransitionTime": "2026-12-07T00:00:00Z"}]  # fmt: skip
    kube = FakeKube({("ServingDeployment", "kimi"): sd})
    assert handlers.recreate_deleted(kube, "Deployment", live_deployment()) is not None  # type: ignore[arg-type]
    assert "replicas" not in kube.applied[0]["spec"]


def test_an_autoscaler_is_announced_once_whichever_handler_finds_it_first(monkeypatch) -> None:
    """The reconcile and the drift watch both find the HPA, each on a body that may not show
    the other's status write yet (CI, 2026-12-07: two AutoscalerFound for one HPA): the
    second finder posts no Event. Taking the replicas back makes the next HPA news again."""
    posted: list[str] = []
    monkeypatch.setattr(handlers.kopf, "event", lambda body, type, reason, message: posted.append(reason))
    ctx = handlers.Context.__new__(handlers.Context)
    ctx.contested = {}
    sd = models.ServingDeployment.model_validate(sd_body())
    assert ctx.contest_news(sd.metadata.uid, handlers.Contest.autoscaler("found")), "the drift watch posts first"
    conditions = handlers.left_to_autoscaler({}, sd, [], ["kimi-hpa"], None, False,  # type: ignore[arg-type]
                                             lambda c: ctx.contest_news(sd.metadata.uid, c))
    assert posted == [], "the reconcile on a body without the condition yet: no second Event"
    assert autoscalers.held_by(conditions, replicas.CONDITION), "its condition is still set"
    ctx.contested.pop(sd.metadata.uid)  # ReplicasTakenBack
    handlers.left_to_autoscaler({}, sd, [], ["kimi-hpa"], None, False,  # type: ignore[arg-type]
                                lambda c: ctx.contest_news(sd.metadata.uid, c))
    assert posted == ["AutoscalerFound"]


def test_replicas_this_process_handed_over_are_not_reverted_on_a_body_that_predates_it() -> None:
    """Another writer: once this process has handed spec.replicas over (and said so), a
    drift event judged on an owner whose status does not show the condition yet (a
    reconcile's patch from an older body overwrote it) reverts nothing and contests
    nothing again: the field is not fought, and the Warning is not posted twice."""
    dep = scaled_by_hpa()
    kube = FakeKube({("ServingDeployment", "kimi"): sd_body(), ("Deployment", "kimi"): dep})
    found = handlers.revert_drift(kube, "Deployment", dep, replicas.Reverts(), 0.0,  # type: ignore[arg-type]
                                  held=lambda uid: uid == "sd-uid")
    assert found is not None and found.contest is None
    assert found.paths == [] and kube.applied == [], "the handed-over replicas were reverted"
