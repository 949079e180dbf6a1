"""Bad input, fuzzed (issue 10): ServingDeployment specs generated from the CRD's schema, valid
and mutated-invalid, sent to the real kube-apiserver (server-side dry-run create) and to the
pydantic models.

What must hold for every generated spec:
- the apiserver and the models agree: what one refuses the other refuses (the models carry
  the CRD's CEL rules as Python twins, and are strict about types as the schema is);
- a refused spec is refused with the field named, by both;
- an accepted spec yields owned objects (Deployment, Service, ConfigMap) that Kubernetes
  accepts too, or is one of the few documented specs that only the operator can judge
  (UNSERVABLE below), for which a real operator writes a condition and one Warning Event
  naming the field and leaves every other deployment alone.

Hypothesis is derandomized with a bounded number of examples, so each run tries the same
specs and the file runs in about a minute.
"""

from __future__ import annotations

import copy
import json
import string
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_operator_reconcile import (
    Operator,
    apply,
    events,
    fixed_sd,
    installed_operator,
    must_get,
    namespace,
    reconciled,
)

from conftest import eventually
from slipstream import localkube
from slipstream.api import crdgen, models
from slipstream.controller import objects, status
from slipstream.controller.clients import kube as kube_

FUZZ = settings(
    derandomize=True, database=None, deadline=None, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
NS = "spec-fuzz"
DEADLINE_S = 60


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster) -> Iterator[Operator]:
    yield from installed_operator(cluster, "fuzz")


@pytest.fixture(scope="module")
def kube(cluster: localkube.Cluster, operator: Operator) -> kube_.Kube:
    """The admin's client (the CRD is installed by the chart, with the operator)."""
    namespace(cluster, NS)
    return kube_.Kube(kube_.login(kubeconfig=cluster.kubeconfig))


def dry_run(kube: kube_.Kube, obj: dict[str, Any]) -> str | None:
    """None when the apiserver would create `obj`, else its message (which names the field).
    Strict field validation: an unknown field is refused, not silently pruned."""
    path = kube_.path_of(obj["apiVersion"], obj["kind"], NS)
    try:
        kube.request("POST", path, body=obj, query=[("dryRun", "All"), ("fieldValidation", "Strict")])
    except kube_.ApiError as error:
        assert error.status in (400, 422), error  # a refusal, not an unwell apiserver
        return error.message
    return None


def local(doc: dict[str, Any]) -> models.ServingDeployment | str:
    """The models' verdict: the object, or the message the operator would write."""
    try:
        return models.ServingDeployment.model_validate(copy.deepcopy(doc))
    except pydantic.ValidationError as error:
        return status.invalid_spec_message(error)


# -- valid specs -------------------------------------------------------------------------------

NAMES = st.from_regex(r"\A[a-z]([-a-z0-9]{0,50}[a-z0-9])?\Z")
QUANTITIES = st.one_of(
    st.integers(0, 512),
    st.from_regex(r"\A([0-9]{1,4}(\.[0-9]{1,3})?|\.[0-9]{1,3})(Ki|Mi|Gi|Ti|m|k|M|G|e[0-9])?\Z"),
)
ENV_NAMES = st.from_regex(r"\A[-._a-zA-Z][-._a-zA-Z0-9]{0,20}\Z")
LABEL_KEYS = st.from_regex(r"\A([a-z0-9]{1,8}(\.[a-z0-9]{1,8}){0,2}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?\Z")
LABEL_VALUES = st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?)?\Z")
SECRET_NAMES = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z")
SECRET_KEYS = st.from_regex(r"\A[-._a-zA-Z0-9]{1,12}\Z")
TEXT = st.text(string.ascii_letters + string.digits + "-_./:", min_size=1, max_size=40)


@st.composite
def tolerations(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(["Exists", "Equal"]))
    out: dict[str, Any] = {"operator": op, "key": draw(LABEL_KEYS)}
    if op == "Equal":
        out["value"] = draw(LABEL_VALUES)
    effect = draw(st.sampled_from([None, "NoSchedule", "PreferNoSchedule", "NoExecute"]))
    if effect is not None:
        out["effect"] = effect
    if effect == "NoExecute" and draw(st.booleans()):
        out["tolerationSeconds"] = draw(st.integers(0, 3600))
    return out


@st.composite
def valid_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec every rule of the CRD allows, spread over every field."""
    page = draw(st.sampled_from([1, 16, 64, 256]))
    c = page * draw(st.integers(max(1, -(-64 // page)), 64))
    max_c = draw(st.integers(1, min(256, c // page)))
    mode = draw(st.sampled_from(["Auto", "Recommend", "Fixed", "Off"]))
    threshold = draw(st.none() | st.integers(0, c // page).map(lambda k: k * page))
    if mode == "Fixed" and threshold is None:
        threshold = c
    canaries = draw(st.integers(1, 4))
    replicas = draw(st.integers(0, 8))
    if mode == "Auto":
        replicas = max(replicas, canaries)
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    engine: dict[str, Any] = {
        "image": draw(TEXT), "model": draw(TEXT), "tensorParallelSize": tp, "pageSize": page,
        "chunkedPrefillSize": c, "port": draw(st.integers(1, 65535)),
        "resources": {"requests": draw(st.dictionaries(st.sampled_from(["cpu", "memory"]), QUANTITIES, max_size=2))},
        "env": [{"name": n, "value": draw(TEXT)} if draw(st.booleans())
                else {"name": n, "secretKeyRef": {"name": draw(SECRET_NAMES), "key": draw(SECRET_KEYS)}}
                for n in draw(st.lists(ENV_NAMES, max_size=3, unique=True))],
        "nodeSelector": draw(st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=2)),
        "tolerations": draw(st.lists(tolerations(), max_size=2)),
        "hicache": draw(st.sampled_from([{}, {"enabled": True, "ratio": 2.5}, {"enabled": True, "sizeGB": 64}])),
        "podSecurityContext": {"runAsUser": draw(st.integers(0, 65535))},
    }  # fmt: skip
    if draw(st.booleans()):
        engine["gpus"] = draw(st.integers(tp, 16))
    if draw(st.booleans()):
        engine["adminApiKeySecretRef"] = {"name": draw(SECRET_NAMES), "key": draw(SECRET_KEYS)}
    tuning: dict[str, Any] = {
        "mode": mode, "minConcurrency": draw(st.integers(1, max_c)), "maxConcurrency": max_c,
        "engineMode": draw(st.sampled_from(["ceiling", "floor", "reflex"])),
        "schedulePolicy": draw(st.sampled_from(["fcfs", "lpm", "srpt"])),
        "rollout": {"canaryReplicas": canaries},
        "objective": {"tenants": [{"name": n, "ttftP99Seconds": 1.5}
                                  for n in draw(st.lists(LABEL_VALUES.filter(bool), max_size=2, unique=True))]},
    }  # fmt: skip
    if threshold is not None:
        tuning["threshold"] = threshold
    spec = {"replicas": replicas, "engine": engine, "tuning": tuning}
    if mode in ("Auto", "Recommend") or draw(st.booleans()):
        spec["prometheus"] = {"url": "http://prometheus.monitoring:9090"}
    return {"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": draw(NAMES)}, "spec": spec}


# -- mutations: each makes a valid spec invalid in one known field -----------------------------

Mutation = tuple[str, Callable[[dict[str, Any]], None]]
"""(the field the refusal must name, what to do to a valid document)."""


def put(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a dotted path ("spec.engine.port") in a document, creating objects on the way."""

    def mutate(doc: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    return mutate


def leaves(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every scalar field of the schema reachable through objects only (no lists or maps)."""
    for name, sub in node.get("properties", {}).items():
        if sub.get("type") == "object" and "properties" in sub:
            yield from leaves(sub, f"{path}.{name}")
        elif sub.get("type") in ("integer", "number", "string", "boolean"):
            yield f"{path}.{name}", sub


def schema_mutations() -> list[Mutation]:
    """Out of range, wrong type and unknown enum values for every scalar field, read off the
    CRD itself (so a field added to the models is fuzzed without touching this file)."""
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found: list[Mutation] = []
    for path, node in leaves(spec, "spec"):
        kind = node["type"]
        if "minimum" in node:
            low = node["minimum"] if node.get("exclusiveMinimum") else node["minimum"] - 1
            found.append((path, put(path, low if kind == "number" else int(low))))
        if "maximum" in node:
            high = node["maximum"] if node.get("exclusiveMaximum") else node["maximum"] + 1
            found.append((path, put(path, high if kind == "number" else int(high))))
        if "enum" in node:
            found.append((path, put(path, "Sometimes")))
        if "pattern" in node:
            found.append((path, put(path, " ")))  # no pattern here allows a lone space
        if "maxLength" in node:
            found.append((path, put(path, "x" * (node["maxLength"] + 1))))
        wrong = {"integer": ["2", 2.5, True, [1]], "number": ["1.5", True, {}], "string": [7, False, ["x"]],
                 "boolean": ["yes", 1]}[kind]  # fmt: skip
        found += [(path, put(path, value)) for value in wrong]
    return found


def remove(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = doc
        for part in parents:
            node = node.get(part) or {}
        node.pop(leaf, None)

    return mutate


def many(*steps: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        for step in steps:
            step(doc)

    return mutate


CROSS_FIELD: list[Mutation] = [
    ("spec.tuning.threshold", many(put("spec.engine.pageSize", 64), put("spec.engine.chunkedPrefillSize", 8192),
                                   put("spec.tuning.maxConcurrency", 8), put("spec.tuning.threshold", 16384))),
    ("spec.tuning.threshold", many(put("spec.engine.pageSize", 64), put("spec.engine.chunkedPrefillSize", 8192),
                                   put("spec.tuning.maxConcurrency", 8), put("spec.tuning.threshold", 4000))),
    ("spec.tuning.rollout.canaryReplicas", many(put("spec.tuning.mode", "Auto"), put("spec.replicas", 1),
                                                put("spec.tuning.rollout.canaryReplicas", 2),
                                                put("spec.prometheus.url", "http://p:9090"))),
    ("spec.prometheus.url", many(put("spec.tuning.mode", "Auto"), remove("spec.prometheus.url"))),
    ("spec.prometheus.url", many(put("spec.tuning.mode", "Recommend"), remove("spec.prometheus.url"))),
    ("spec.tuning.threshold", many(put("spec.tuning.mode", "Fixed"), remove("spec.tuning.threshold"))),
    ("spec.tuning.minConcurrency", many(put("spec.tuning.minConcurrency", 4), put("spec.tuning.maxConcurrency", 2),
                                        put("spec.engine.pageSize", 1), put("spec.engine.chunkedPrefillSize", 8192))),
    ("spec.engine.chunkedPrefillSize", many(put("spec.engine.pageSize", 64), put("spec.engine.chunkedPrefillSize", 8200),
                                            remove("spec.tuning.threshold"), put("spec.tuning.mode", "Off"))),
    ("spec.engine.gpus", many(put("spec.engine.tensorParallelSize", 8), put("spec.engine.gpus", 4))),
    ("spec.tuning.maxConcurrency", many(put("spec.engine.pageSize", 64), put("spec.engine.chunkedPrefillSize", 128),
                                        put("spec.tuning.maxConcurrency", 4), put("spec.tuning.minConcurrency", 1),
                                        put("spec.tuning.threshold", 64))),
    ("spec.engine.hicache", put("spec.engine.hicache", {"enabled": True, "ratio": 2, "sizeGB": 100})),
    ("spec.engine.env", put("spec.engine.env", [{"name": "A", "value": "1", "secretKeyRef": {"name": "s"}}])),
    ("spec.tuning.objective.tenants", put("spec.tuning.objective.tenants",
                                          [{"name": "a", "ttftP99Seconds": 1}, {"name": "a", "ttftP99Seconds": 2}])),
]  # fmt: skip

BAD_NAMES = ["kimi.k3", "k" * 70, "Kimi", "3kimi", "kimi-", "kimi_k3", "a" * 53]
BAD_QUANTITIES = ["lots", "...", "1.2.3", "5 Gi", "", "-1", -1, "1Ki5", "1e", "Gi", "+"]
BAD_ENV_NAMES = ["1 BAD=", "A B", "", "=", "1X", "A=B"]
BAD_LABEL_KEYS = ["bad key!", "-a", "a/b/c", "x" * 64, "Example.com/a", "/a"]
BAD_LABEL_VALUES = ["x y", "-a", "a" * 64, "a/b"]
BAD_SECRET_NAMES = ["Bad_Name", "a b", "-a", "a..b"]


def named(field: str, doc_path: str, values: list[Any], make: Callable[[Any], Any]) -> list[Mutation]:
    return [(field, put(doc_path, make(v))) for v in values]


EXPLICIT: list[Mutation] = [
    *[("metadata.name", put("metadata.name", v)) for v in BAD_NAMES],
    *named("spec.engine.resources.requests", "spec.engine.resources", BAD_QUANTITIES, lambda v: {"requests": {"cpu": v}}),
    *named("spec.engine.resources.limits", "spec.engine.resources", BAD_QUANTITIES[:4], lambda v: {"limits": {"memory": v}}),
    *named("spec.engine.resources.requests", "spec.engine.resources", ["bad name", "a/b/c", "-cpu"],
           lambda v: {"requests": {v: 1}}),
    *named("spec.engine.env[0].name", "spec.engine.env", BAD_ENV_NAMES, lambda v: [{"name": v, "value": "x"}]),
    *named("spec.engine.nodeSelector", "spec.engine.nodeSelector", BAD_LABEL_KEYS, lambda v: {v: "x"}),
    *named("spec.engine.nodeSelector", "spec.engine.nodeSelector", BAD_LABEL_VALUES, lambda v: {"pool": v}),
    *named("spec.engine.tolerations[0]", "spec.engine.tolerations", BAD_LABEL_KEYS[:3],
           lambda v: [{"key": v, "operator": "Exists"}]),
    ("spec.engine.tolerations[0]", put("spec.engine.tolerations", [{"key": "a", "operator": "Exists", "value": "x"}])),
    ("spec.engine.tolerations[0]", put("spec.engine.tolerations", [{"operator": "Equal", "value": "x"}])),
    ("spec.engine.tolerations[0]", put("spec.engine.tolerations",
                                       [{"key": "a", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}])),
    *named("spec.engine.gpuResourceName", "spec.engine.gpuResourceName", ["gpu", "nvidia.com/g pu", "a/b/c", "Nvidia.com/gpu"],
           lambda v: v),
    *named("spec.engine.env[0].secretKeyRef.name", "spec.engine.env", BAD_SECRET_NAMES,
           lambda v: [{"name": "TOKEN", "secretKeyRef": {"name": v, "key": "k"}}]),
    *named("spec.engine.env[0].secretKeyRef.key", "spec.engine.env", ["a b", "k/1"],
           lambda v: [{"name": "TOKEN", "secretKeyRef": {"name": "s", "key": v}}]),
    *named("spec.engine.adminApiKeySecretRef.name", "spec.engine.adminApiKeySecretRef", BAD_SECRET_NAMES,
           lambda v: {"name": v}),
    *named("spec.engine.image", "spec.engine.image", [" engine:1", "engine:1 ", "\tengine:1"], lambda v: v),
    ("spec.engine.podSecurityContext.seccompProfileType", put("spec.engine.podSecurityContext.seccompProfileType", "Localhost")),
    ("spec.engine.bogusField", put("spec.engine.bogusField", 1)),
    ("spec.tuning.rollout.typo", put("spec.tuning.rollout.typo", "x")),
    ("spec.replicaz", put("spec.replicaz", 3)),
]  # fmt: skip

MUTATIONS = schema_mutations() + CROSS_FIELD + EXPLICIT

UNSERVABLE: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    # (what, the field the condition names, mutation): the CRD cannot judge these (CEL has no
    # cheap way to compare two quantities of arbitrary maps within the cost budget), the
    # Deployment's validation can: the operator reports it.
    ("cpu limit below request", "resources", put("spec.engine.resources", {"requests": {"cpu": 4}, "limits": {"cpu": 2}})),
    ("memory limit below request", "resources",
     put("spec.engine.resources", {"requests": {"memory": "64Gi"}, "limits": {"memory": "1Gi"}})),
]  # fmt: skip


def owned(sd: models.ServingDeployment) -> list[dict[str, Any]]:
    """The objects the operator applies for `sd` (the admin key Secret aside: it holds
    nothing from the spec)."""
    return [objects.configmap(sd, objects.configmap_setting(sd)), objects.service(sd), objects.deployment(sd)]


def in_namespace(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = NS
    return doc


def with_uid(doc: dict[str, Any]) -> dict[str, Any]:
    """As the operator sees it once created: the owned objects' owner references need a uid."""
    return {**doc, "metadata": {**doc["metadata"], "uid": "0b5e7c1e-0000-4000-8000-000000000001"}}


# -- the tests -------------------------------------------------------------------------------


@FUZZ
@given(doc=valid_docs())
def test_valid_specs_are_accepted_by_both_and_their_objects_by_kubernetes(kube: kube_.Kube, doc: dict[str, Any]) -> None:
    doc = in_namespace(doc)
    refused = dry_run(kube, doc)
    assert refused is None, f"the apiserver refused a valid spec: {refused}\n{json.dumps(doc)}"
    sd = local(with_uid(doc))
    assert isinstance(sd, models.ServingDeployment), f"the models refused what the apiserver accepts: {sd}"
    for obj in owned(sd):
        problem = dry_run(kube, obj)
        assert problem is None, f"{obj['kind']} built from an accepted spec is refused: {problem}\n{json.dumps(doc)}"


def refused_by_both(kube: kube_.Kube, doc: dict[str, Any], mutation: Mutation) -> None:
    field, mutate = mutation
    doc = in_namespace(doc)
    mutate(doc)
    refused = dry_run(kube, doc)
    verdict = local(doc)
    assert refused is not None, f"the apiserver accepted a spec with a bad {field}: {json.dumps(doc)}"
    assert field in refused, f"the refusal does not name {field}: {refused}"
    assert isinstance(verdict, str), f"the models accepted what the apiserver refuses ({field}): {refused}"
    assert field in verdict, f"the models' message does not name {field}: {verdict}"


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[f"{i}-{m[0]}" for i, m in enumerate(MUTATIONS)])
def test_every_mutation_of_a_plain_spec_is_refused_by_both_naming_the_field(
    kube: kube_.Kube, mutation: Mutation
) -> None:
    refused_by_both(kube, fixed_sd("plain"), mutation)


@settings(FUZZ, max_examples=200)
@given(doc=valid_docs(), mutation=st.sampled_from(MUTATIONS))
def test_mutations_of_generated_specs_are_refused_by_both_naming_the_field(
    kube: kube_.Kube, doc: dict[str, Any], mutation: Mutation
) -> None:
    refused_by_both(kube, doc, mutation)


@pytest.mark.parametrize(("what", "field", "mutate"), UNSERVABLE, ids=[u[0] for u in UNSERVABLE])
def test_the_specs_only_kubernetes_refuses_are_known(
    kube: kube_.Kube, what: str, field: str, mutate: Callable[[dict[str, Any]], None]
) -> None:
    """Accepted by the CRD and the models, refused in the owned Deployment: the operator's
    case (below). A rule added to the CRD for one of these moves it to MUTATIONS."""
    doc = in_namespace(fixed_sd("unservable"))
    mutate(doc)
    assert dry_run(kube, doc) is None
    sd = local(with_uid(doc))
    assert isinstance(sd, models.ServingDeployment), sd
    problem = dry_run(kube, objects.deployment(sd))
    assert problem is not None and field in problem, problem


def test_an_unservable_spec_gets_a_condition_and_one_warning_and_others_are_untouched(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = namespace(cluster, "fuzz-unservable")
    apply(cluster, ns, fixed_sd("healthy"))
    eventually(lambda: reconciled(cluster, ns, "healthy"), deadline_s=DEADLINE_S, what="healthy reconciled")
    kinds = (("deployment", "healthy"), ("service", "healthy"), ("configmap", "healthy-engine-setting"))
    before = {k: ours(must_get(cluster, k, n, ns)) for k, n in kinds}

    bad = []
    for i, (_, field, mutate) in enumerate(UNSERVABLE):
        doc = fixed_sd(f"unservable-{i}")
        mutate(doc)
        bad.append((doc["metadata"]["name"], field))
        apply(cluster, ns, doc)

    def degraded(name: str, field: str) -> Callable[[], dict[str, Any]]:
        def check() -> dict[str, Any]:
            sd = must_get(cluster, "sd", name, ns)
            assert sd.get("status", {}).get("phase") == "Degraded", sd.get("status")
            (cond,) = [c for c in sd["status"]["conditions"] if c["type"] == "Reconciled"]
            assert cond["status"] == "False" and cond["reason"] == "DeploymentRefused", cond
            assert field in cond["message"], cond["message"]
            return sd

        return check

    for name, field in bad:
        eventually(degraded(name, field), deadline_s=DEADLINE_S, what=f"{name} degraded")
    # Retried (the operator does not give up) without a second Warning per object.
    eventually(lambda: _retried(operator, len(bad) * 2), deadline_s=DEADLINE_S, what="retries of the reconcile")
    for name, field in bad:
        warnings = [e for e in events(cluster, ns, name) if e["type"] == "Warning"]
        assert len(warnings) == 1 and warnings[0].get("count", 1) == 1, warnings
        assert field in warnings[0]["message"], warnings[0]
    assert operator.proc is not None and operator.proc.poll() is None, operator.log_tail()
    assert "Traceback" not in operator.log(), operator.log_tail()

    # The healthy neighbour: its objects were not touched, and it still reconciles.
    after = {k: ours(must_get(cluster, k, n, ns)) for k, n in kinds}
    assert after == before
    apply(cluster, ns, fixed_sd("healthy", chunkedPrefillSize=16384))
    changed = lambda: reconciled(cluster, ns, "healthy")  # noqa: E731
    eventually(changed, deadline_s=DEADLINE_S, what="healthy reconciles a change")
    args = must_get(cluster, "deployment", "healthy", ns)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--chunked-prefill-size") + 1] == "16384"


def ours(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What the operator writes in an object, and when it last wrote it (its managedFields
    entry): the status other controllers write may move meanwhile."""
    written = [(m.get("operation"), m.get("time")) for m in obj["metadata"].get("managedFields", [])
               if m.get("manager") == kube_.FIELD_MANAGER]  # fmt: skip
    return obj["metadata"].get("generation"), obj.get("spec"), obj.get("data"), written


def _retried(operator: Operator, at_least: int) -> None:
    assert operator.log().count("Handler 'reconcile' failed temporarily") >= at_least, operator.log_tail()
