"""A tuning step's view of its ServingDeployment (controller.handlers.step_view): the model
and the resourceVersion guarding its status write, taken at one moment from kopf's live body
without keeping a copy of the body."""

from __future__ import annotations

import asyncio
import copy
import gc
import weakref
from typing import Any, cast

import kopf

from slipstream.api import models
from slipstream.controller import handlers
from slipstream.controller import settings as settings_

DOC: dict[str, Any] = {
    "apiVersion": models.API_VERSION, "kind": models.KIND,
    "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 3, "resourceVersion": "41",
                 "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
    "spec": {"engine": {"image": "i", "model": "m"}, "tuning": {"mode": "Auto"},
             "prometheus": {"url": "http://prometheus:9090"}},
    "status": {"observedGeneration": 3},
}  # fmt: skip


class Bag(dict[str, Any]):
    """A dict that can be weakly referenced (to see whether anything still holds it)."""


def test_the_view_is_the_model_and_the_version_it_was_read_at() -> None:
    raw = copy.deepcopy(DOC)
    body = kopf.Body(raw)
    sd, read = handlers.step_view(body)
    assert sd is not None and sd.metadata.name == "kimi" and sd.status.observed_generation == 3
    assert read == {"metadata": {"namespace": "prod", "name": "kimi", "resourceVersion": "41"}}
    # A newer event replaces the live body's parts: the step keeps what it read.
    raw.clear()
    raw.update({**copy.deepcopy(DOC), "metadata": {**DOC["metadata"], "resourceVersion": "42"},
                "spec": {**DOC["spec"], "tuning": {"mode": "Fixed", "threshold": 1024}}})  # fmt: skip
    assert read["metadata"]["resourceVersion"] == "41" and sd.spec.tuning.mode == "Auto"


def test_the_view_keeps_nothing_of_the_body_it_was_read_from() -> None:
    """What a loop waiting on the tuner pool holds is the model and three strings, not the
    body (a deep copy of it was ~30 kB, times 500 loops in a first round)."""
    raw = copy.deepcopy(DOC)
    managed = Bag(raw["metadata"]["managedFields"][0])
    raw["metadata"]["managedFields"][0] = managed
    gone = weakref.ref(managed)
    sd, read = handlers.step_view(kopf.Body(raw))
    del managed
    raw.clear()  # the next event replaced it
    gc.collect()
    assert sd is not None and gone() is None, "the view holds on to the body it was read from"


def test_an_invalid_spec_gives_no_model_and_still_the_version() -> None:
    bad = copy.deepcopy(DOC)
    bad["spec"]["replicas"] = "many"
    sd, read = handlers.step_view(kopf.Body(bad))
    assert sd is None and read["metadata"]["resourceVersion"] == "41"


def test_kopfs_live_body_sheds_its_managed_fields_and_keeps_the_rest() -> None:
    """The drift-owners event handler drops managedFields from the watch event's own dict,
    which kopf's live body (held per ServingDeployment while its loop and timer run) is a
    view of: the body a step reads loses them, and only them."""
    raw = copy.deepcopy(DOC)
    raw["metadata"]["managedFields"] = [
        {"manager": m, "operation": "Update", "fieldsV1": {"f:spec": {f"f:x{i}": {} for i in range(40)}}}
        for m in ("kubectl-create", "kopf", "slipstream")
    ]
    before = copy.deepcopy(raw)
    body = kopf.Body(raw)
    handlers.shed_managed_fields(body)
    assert "managedFields" not in raw["metadata"] and "managedFields" not in body["metadata"]
    del before["metadata"]["managedFields"]
    assert raw == before, "only managedFields go"
    sd, read = handlers.step_view(body)
    assert sd is not None and read["metadata"]["resourceVersion"] == "41"
    handlers.shed_managed_fields(body)  # the next handler of the same event: nothing left to drop
    handlers.shed_managed_fields(kopf.Body({"metadata": None}))  # a garbled event: no error
    handlers.shed_managed_fields(kopf.Body({}))


def test_every_servingdeployment_event_passes_the_handler_that_sheds_them() -> None:
    """kopf calls an event's event handlers before its daemons and timers get the body
    (kopf/_core/reactor/processing.py, process_resource_causes): the handler must be an
    event handler of the ServingDeployment resource, with no filter that could skip one."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings_.ControllerSettings(), cast(Any, object()))
    resource = kopf.Resource(models.GROUP, models.VERSION, models.PLURAL)
    watching = [h for h in registry._watching.get_all_handlers() if h.id == "drift-owners"]
    assert len(watching) == 1
    (handler,) = watching
    assert handler.selector is not None and handler.selector.check(resource)
    assert handler.labels is None and handler.annotations is None and handler.when is None
    raw = copy.deepcopy(DOC)
    asyncio.run(handler.fn(body=kopf.Body(raw), type="ADDED"))
    assert "managedFields" not in raw["metadata"] and raw["metadata"]["resourceVersion"] == "41"
