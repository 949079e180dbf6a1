"""Another writer of the engine Deployment's replicas: who it is, and when reverting it
becomes a fight (controller.watch.replicas)."""

from __future__ import annotations

from slipstream.controller.watch import drift, replicas


def entry(manager: str, fields: dict, subresource: str | None = None) -> dict:
    out = {"manager": manager, "operation": "Update", "fieldsV1": fields}
    if subresource:
        out["subresource"] = subresource
    return out


def test_writers_are_the_other_managers_of_spec_replicas() -> None:
    live = {"metadata": {"managedFields": [
        entry("slipstream", {"f:spec": {"f:replicas": {}, "f:template": {}}}),
        entry("kube-controller-manager", {"f:spec": {"f:replicas": {}}}, "scale"),
        entry("kubectl-edit", {"f:spec": {"f:template": {}}}),
        entry("kube-controller-manager", {"f:status": {}}),
    ]}}  # fmt: skip
    assert replicas.writers(live, "slipstream") == ["kube-controller-manager (scale)"]
    assert replicas.writers({"metadata": {}}, "slipstream") == []


def test_one_write_reverted_is_a_hand_edit_and_three_are_a_fight() -> None:
    reverts = replicas.Reverts()
    assert not reverts.note("ns/a", 2, 0.0)
    assert not reverts.note("ns/a", 2, 1.0), "the watch events of one write count once"
    assert not reverts.note("ns/a", 4, 2.0)
    assert not reverts.note("ns/b", 7, 2.0), "per Deployment"
    assert reverts.note("ns/a", 6, 3.0)


def test_old_reverts_fall_out_of_the_window() -> None:
    reverts = replicas.Reverts()
    reverts.note("ns/a", 1, 0.0)
    reverts.note("ns/a", 2, 1.0)
    assert not reverts.note("ns/a", 3, replicas.WINDOW_S + 0.5)


def test_released_deployment_has_no_replicas_and_the_rest_unchanged() -> None:
    dep = {"kind": "Deployment", "spec": {"replicas": 2, "template": {"x": 1}}}
    assert replicas.without_replicas(dep) == {"kind": "Deployment", "spec": {"template": {"x": 1}}}
    assert dep["spec"]["replicas"] == 2


def test_managers_of_any_field_names_who_else_wrote_it() -> None:
    live = {"metadata": {"managedFields": [
        entry("slipstream", {"f:data": {"f:mode": {}}}),
        entry("kubectl-patch", {"f:data": {"f:threshold": {}}}),
    ]}}  # fmt: skip
    assert drift.managers_of(live, "slipstream", "f:data") == ["kubectl-patch"]
    assert drift.managers_of(live, "slipstream", "f:data", "f:mode") == []
