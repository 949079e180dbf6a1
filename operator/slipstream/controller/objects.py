"""The objects a ServingDeployment owns, as pure functions of it.

Deployment (the engines), Service, ConfigMap (the current tuned setting: what a newly
started pod uses) and, when Prometheus Operator is installed, a PodMonitor. Every object
carries an owner reference to the ServingDeployment, so deleting it garbage-collects them.
"""

from __future__ import annotations

from typing import Any

from slipstream.api import models
from slipstream.engine import args as engine_args

NAME_LABEL = f"{models.GROUP}/name"
CONTAINER = "engine"


def labels(sd: models.ServingDeployment) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "sglang",
        "app.kubernetes.io/instance": sd.metadata.name,
        "app.kubernetes.io/managed-by": "slipstream",
        NAME_LABEL: sd.metadata.name,
    }


def label_selector(sd: models.ServingDeployment) -> dict[str, str]:
    return {NAME_LABEL: sd.metadata.name}


def setting_configmap_name(name: str) -> str:
    return f"{name}-engine-setting"


def metadata(sd: models.ServingDeployment, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": sd.metadata.namespace,
        "labels": labels(sd),
        "ownerReferences": [
            {
                "apiVersion": models.API_VERSION,
                "kind": models.KIND,
                "name": sd.metadata.name,
                "uid": sd.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def spec_setting(sd: models.ServingDeployment) -> models.EngineSetting:
    """What the spec asks the engines to run in Fixed and Recommend; Off: the stock engine."""
    tuning = sd.spec.tuning
    if tuning.mode == "Off":
        return models.EngineSetting(threshold=0, mode=tuning.engine_mode, schedule_policy="fcfs")
    return models.EngineSetting(
        threshold=tuning.threshold or 0, mode=tuning.engine_mode, schedule_policy=tuning.schedule_policy
    )


def runnable(sd: models.ServingDeployment, setting: models.EngineSetting) -> bool:
    """Whether an engine of this spec starts with ``setting``: T is 0, or a whole number of
    pages no larger than C. The status is writable by anyone allowed to patch it (another
    controller, a hand edit), and a pod started with a T the engine refuses crash-loops, so
    a setting taken from the status must pass this before it reaches the ConfigMap."""
    engine = sd.spec.engine
    t = setting.threshold
    return t == 0 or (t % engine.page_size == 0 and t <= engine.chunked_prefill_size)


def current_setting(sd: models.ServingDeployment) -> models.EngineSetting:
    """The setting the fleet runs: status (read back from the engines by the tuning loop),
    or, before its first step or when the status holds a T no engine of this spec would
    start with, what the spec starts the engines with."""
    st = sd.status
    if st.threshold is None:
        return spec_setting(sd)
    setting = models.EngineSetting(
        threshold=st.threshold,
        mode=st.mode or sd.spec.tuning.engine_mode,
        schedule_policy=st.schedule_policy or sd.spec.tuning.schedule_policy,
    )
    return setting if runnable(sd, setting) else spec_setting(sd)


def configmap_setting(sd: models.ServingDeployment) -> models.EngineSetting:
    """What a newly started pod must get: the candidate while it is being promoted, the
    baseline while rolling back, else the fleet's setting (the rollout moves it first)."""
    rollout = sd.status.rollout
    if rollout is not None:
        moving = {"Promoting": rollout.candidate, "RollingBack": rollout.baseline}.get(rollout.phase)
        if moving is not None and runnable(sd, moving):
            return moving
    return current_setting(sd)


def configmap(sd: models.ServingDeployment, setting: models.EngineSetting) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(sd, setting_configmap_name(sd.metadata.name)),
        "data": {
            engine_args.THRESHOLD_KEY: str(setting.threshold),
            engine_args.MODE_KEY: setting.mode,
            engine_args.SCHEDULE_POLICY_KEY: setting.schedule_policy,
        },
    }


def admin_key_secret(sd: models.ServingDeployment, key: str) -> dict[str, Any]:
    """The generated admin-key Secret (only when the spec names none); owned, so it goes
    with the ServingDeployment. Created once and never rewritten: the key must not change
    under running engines."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(sd, engine_args.admin_key_secret_name(sd.metadata.name)),
        "type": "Opaque",
        "stringData": {engine_args.ADMIN_KEY_SECRET_KEY: key},
    }


def _quantities(values: dict[str, int | str]) -> dict[str, str]:
    return {name: str(value) for name, value in values.items()}


def _env(sd: models.ServingDeployment) -> list[dict[str, Any]]:
    engine = sd.spec.engine
    cm = setting_configmap_name(sd.metadata.name)
    env: list[dict[str, Any]] = [
        {"name": var, "valueFrom": {"configMapKeyRef": {"name": cm, "key": key}}}
        for var, key in engine_args.SETTING_ENV
    ]
    ref = engine_args.admin_key_ref(sd.metadata.name, engine)
    env.append(
        {
            "name": engine_args.ADMIN_API_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    )
    for var in engine.env:
        if var.secret_key_ref is not None:
            ref = var.secret_key_ref
            env.append({"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
        else:
            env.append({"name": var.name, "value": var.value or ""})
    return env


def _resources(engine: models.EngineSpec) -> dict[str, dict[str, str]]:
    requests = _quantities(engine.resources.requests)
    limits = _quantities(engine.resources.limits)
    gpus = engine.tensor_parallel_size if engine.gpus is None else engine.gpus
    if gpus:
        requests[engine.gpu_resource_name] = limits[engine.gpu_resource_name] = str(gpus)
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def _container_security(engine: models.EngineSpec) -> dict[str, Any]:
    """The container's securityContext without empty capability lists: the apiserver drops
    them (omitempty), and the drift watch would take a desired `add: []` absent from the
    live object for a hand edit, every time."""
    out = engine.security_context.to_k8s()
    caps = {key: value for key, value in out.pop("capabilities", {}).items() if value}
    if caps:
        out["capabilities"] = caps
    return out


def _probe(period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 10,
        "failureThreshold": failures,
    }


def deployment(sd: models.ServingDeployment) -> dict[str, Any]:
    engine = sd.spec.engine
    container = {
        "name": CONTAINER,
        "image": engine.image,
        "command": list(engine_args.COMMAND),
        "args": engine_args.launch_args(
            engine, sd.spec.tuning.objective.tenant_label, engine_args.SettingArgs.from_env()
        ),
        "ports": [{"name": "http", "containerPort": engine.port, "protocol": "TCP"}],
        "env": _env(sd),
        "resources": _resources(engine),
        # Loading weights takes minutes: up to 30 min to start, then /health every 10 s.
        "startupProbe": _probe(period=10, failures=180),
        "readinessProbe": _probe(period=10, failures=3),
        "livenessProbe": _probe(period=30, failures=4),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": _container_security(engine),
    }
    pod_security = engine.pod_security_context.to_k8s()
    pod_security["seccompProfile"] = {"type": pod_security.pop("seccompProfileType")}
    pod_spec: dict[str, Any] = {
        "securityContext": pod_security,
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "terminationGracePeriodSeconds": 60,
        "enableServiceLinks": False,
        # An engine never calls the Kubernetes API: no ServiceAccount token in the pod, so a
        # compromised engine holds no credential (the operator reads the engines, not back).
        "automountServiceAccountToken": False,
    }
    if engine.node_selector:
        pod_spec["nodeSelector"] = dict(engine.node_selector)
    if engine.tolerations:
        pod_spec["tolerations"] = [t.to_k8s() for t in engine.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(sd, sd.metadata.name),
        "spec": {
            "replicas": sd.spec.replicas,
            "selector": {"matchLabels": label_selector(sd)},
            # GPUs are scarce: replace pods one at a time instead of surging extra ones.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": labels(sd),
                    "annotations": {"kubectl.kubernetes.io/default-container": CONTAINER},
                },
                "spec": pod_spec,
            },
        },
    }


def service(sd: models.ServingDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(sd, sd.metadata.name),
        "spec": {
            "selector": label_selector(sd),
            "ports": [{"name": "http", "port": sd.spec.engine.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


MONITOR_KINDS = {"PodMonitor": "podMetricsEndpoints", "ServiceMonitor": "endpoints"}
"""Prometheus Operator kinds that can scrape the engines, preferred first, with the name
of their list of endpoints."""


DEPLOYMENT_LABEL = "servingdeployment"
"""Target label naming the ServingDeployment (INTERFACES E: with `namespace` and `pod`,
which the Prometheus Operator sets itself); observe aggregates by it."""


def monitor(sd: models.ServingDeployment, kind: str, interval_s: float = 5.0) -> dict[str, Any]:
    """A PodMonitor (per-pod series, what canary analysis needs) or a ServiceMonitor,
    scraping every ``interval_s`` (`ControllerSettings.engine_scrape_interval_seconds`: the
    canary's sub-windows are two of these at least)."""
    meta_label = "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in NAME_LABEL)
    endpoint = {
        "port": "http", "path": "/metrics", "interval": f"{max(1, round(interval_s * 1000))}ms",
        "relabelings": [
            {"sourceLabels": [meta_label], "targetLabel": DEPLOYMENT_LABEL, "action": "replace"},
            {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod", "action": "replace"},
        ],
    }  # fmt: skip
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": kind,
        "metadata": metadata(sd, sd.metadata.name),
        "spec": {
            "selector": {"matchLabels": label_selector(sd)},
            MONITOR_KINDS[kind]: [endpoint],
        },
    }
