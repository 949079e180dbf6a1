"""A tuning step's view of its ServingDeployment (controller.handlers.step_view): the model
and the resourceVersion guarding its status write, taken at one moment from kopf's live body
without keeping a copy of the body."""

from __future__ import annotations

import copy
import gc
import weakref
from typing import Any

import kopf

from slipstream.api import models
from slipstream.controller import handlers

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
