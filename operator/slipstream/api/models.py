"""ServingDeployment: the one source of field names.

The pydantic models below are the API. Python code uses snake_case attributes; the
Kubernetes object uses the camelCase aliases. `slipstream.api.crdgen` turns these models
into the CRD's structural schema: bounds and defaults come from the `Field(...)`
arguments, and the cross-field rules (CEL `x-kubernetes-validations`, enforced by the
kube-apiserver) are attached to the model that owns them, so the rule and the fields it
names sit side by side.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, WithJsonSchema
from pydantic.alias_generators import to_camel

GROUP = "serving.slipstream.dev"
VERSION = "v1alpha1"
KIND = "ServingDeployment"
PLURAL = "servingdeployments"
SINGULAR = "servingdeployment"
SHORT_NAMES = ("sd",)
API_VERSION = f"{GROUP}/{VERSION}"

TuningMode = Literal["Auto", "Recommend", "Fixed", "Off"]
"""Auto: measure and move T; Recommend: measure and only report; Fixed: hold
`tuning.threshold`; Off: the stock engine (T = 0)."""
EngineMode = Literal["ceiling", "floor"]
"""ceiling: no request takes more than T a round; floor: each long request is guaranteed T
a round and expands into idle budget."""
SchedulePolicy = Literal["fcfs", "lpm", "srpt"]
"""Admission order of waiting requests (srpt: shortest remaining uncached prefill first)."""
Phase = Literal["Pending", "Progressing", "Ready", "Degraded"]

QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
"""Kubernetes' own pattern for a resource quantity (its OpenAPI schema's)."""
Quantity = Annotated[
    int | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)],
    # As Kubernetes' own schema writes it: the pattern beside the anyOf (it applies to
    # strings only; a structural schema allows no more than the two types in the anyOf).
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
    }),
]  # fmt: skip
"""A Kubernetes resource quantity: 8, "8", "64Gi", "500m" (not "lots": refused at apply)."""

ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
"""Environment variable names the kubelet accepts (letters, digits, '_', '-', '.'; no digit first)."""
NAME_RULE = (
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 52",
    "metadata.name must be a DNS label of at most 52 characters (lower-case letters, digits and "
    "'-', starting with a letter, no dots): it names the engine Service and labels every "
    "engine pod; choose a shorter name without dots",
)
"""The ServingDeployment's name becomes a Service name (DNS-1035 label) and a label value
(<= 63); 52 leaves room for the pods' generated suffixes and `-engine-setting`."""


def _rules(*rules: tuple[str, str]) -> ConfigDict:
    """Model config carrying CEL rules (rule, message) into the CRD."""
    validations: list[JsonValue] = [{"rule": rule, "message": message} for rule, message in rules]
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})


def _section(model: type[BaseModel], description: str) -> Any:
    """An optional sub-object that is always present after defaulting (CRD default {})."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    def to_k8s(self) -> dict[str, Any]:
        """The object as the Kubernetes API shows it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class SecretKeyRef(Model):
    name: str = Field(min_length=1, max_length=253, description="Name of a Secret in the same namespace.")
    key: str = Field(default="api-key", min_length=1, max_length=253, description="Key in the Secret's data.")


class ResourceRequirements(Model):
    requests: dict[str, Quantity] = Field(
        default_factory=dict, description='Resource requests, e.g. {"cpu": 32, "memory": "512Gi"}.'
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Resource limits. GPUs are added from engine.gpus; do not list them here.",
    )


class EnvVar(Model):
    model_config = _rules(
        (
            "!(has(self.value) && has(self.secretKeyRef))",
            "spec.engine.env: an entry takes value or secretKeyRef, not both: remove one of them",
        ),
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Environment variable name.")
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    secret_key_ref: SecretKeyRef | None = Field(
        default=None, description="Take the value from a key of a Secret instead."
    )


class Toleration(Model):
    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class HiCache(Model):
    """SGLang's hierarchical KV cache (host memory, optionally storage) behind the GPU pool."""

    model_config = _rules(
        (
            "!(has(self.ratio) && has(self.sizeGB))",
            "spec.engine.hicache: set only one of ratio or sizeGB (sizeGB overrides ratio in "
            "the engine): remove one of them",
        ),
    )

    enabled: bool = Field(default=False, description="Pass --enable-hierarchical-cache.")
    ratio: float | None = Field(
        default=None, gt=1, le=100, description="Host pool size as a multiple of the GPU pool (--hicache-ratio)."
    )
    size_gb: int | None = Field(
        default=None, ge=1, le=65536, alias="sizeGB", description="Host pool size in GB (--hicache-size)."
    )
    write_policy: Literal["write_back", "write_through", "write_through_selective"] = Field(
        default="write_through", description="--hicache-write-policy."
    )
    storage_backend: str | None = Field(
        default=None, max_length=64, description="--hicache-storage-backend (file, mooncake, hf3fs, nixl, ...)."
    )


class Capabilities(Model):
    add: list[str] = Field(default_factory=list, max_length=64, description="Linux capabilities to add.")
    drop: list[str] = Field(default_factory=list, max_length=64, description="Linux capabilities to drop (e.g. ALL).")


class ContainerSecurityContext(Model):
    """The engine container's securityContext (the fields an engine needs; Kubernetes' names)."""

    allow_privilege_escalation: bool = Field(
        default=False, description="An engine never needs setuid binaries: false unless an image does."
    )
    read_only_root_filesystem: bool | None = Field(default=None, description="Mount the image read-only.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to start as UID 0.")
    run_as_user: int | None = Field(default=None, ge=0, le=2147483647)
    run_as_group: int | None = Field(default=None, ge=0, le=2147483647)
    capabilities: Capabilities | None = None


class PodSecurityContext(Model):
    """The engine pods' securityContext."""

    run_as_non_root: bool | None = None
    run_as_user: int | None = Field(default=None, ge=0, le=2147483647)
    run_as_group: int | None = Field(default=None, ge=0, le=2147483647)
    fs_group: int | None = Field(default=None, ge=0, le=2147483647)
    seccomp_profile_type: Literal["RuntimeDefault", "Unconfined", "Localhost"] = Field(
        default="RuntimeDefault", description="seccompProfile.type: the runtime's default filter unless an engine needs another."
    )


class Engine(Model):
    """The patched SGLang engine each pod runs."""

    model_config = _rules(
        (
            "self.chunkedPrefillSize % self.pageSize == 0",
            "spec.engine.chunkedPrefillSize must be a multiple of spec.engine.pageSize: round "
            "chunkedPrefillSize to a whole number of pages",
        ),
        (
            "!has(self.gpus) || self.gpus >= self.tensorParallelSize",
            "spec.engine.gpus must be at least spec.engine.tensorParallelSize: each "
            "tensor-parallel rank needs its own GPU",
        ),
    )

    image: str = Field(min_length=1, max_length=1024, description="Image of the patched engine.")
    model: str = Field(
        min_length=1, max_length=1024, description="Model path or Hugging Face id (--model-path)."
    )
    served_model_name: str | None = Field(
        default=None, max_length=256, description="Name clients use (--served-model-name)."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="--tp-size.")
    gpus: int | None = Field(
        default=None, ge=0, le=64, description="GPUs per pod; defaults to tensorParallelSize."
    )
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu", max_length=253, description="Extended resource name of a GPU."
    )
    chunked_prefill_size: int = Field(
        default=8192, ge=64, le=1048576, description="C: prefill token budget per round (--chunked-prefill-size)."
    )
    page_size: int = Field(default=1, ge=1, le=1024, description="KV cache page size in tokens (--page-size).")
    context_length: int | None = Field(default=None, ge=1, le=16777216, description="--context-length.")
    mem_fraction_static: float | None = Field(
        default=None, gt=0, lt=1, description="--mem-fraction-static."
    )
    trust_remote_code: bool = Field(default=False, description="--trust-remote-code.")
    port: int = Field(default=30000, ge=1, le=65535, description="HTTP port of the engine.")
    hicache: HiCache = _section(HiCache, "Hierarchical cache settings.")
    admin_api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding the engines' admin API key (they get it as env "
        "SLIPSTREAM_ADMIN_API_KEY, never as an argument); the operator uses it for "
        "/set_internal_state. Unset: the operator generates one into an owned Secret "
        "<name>-admin-key (key api-key).",
    )
    extra_args: list[str] = Field(
        default_factory=list, max_length=128, description="More launch_server arguments, appended verbatim."
    )
    resources: ResourceRequirements = _section(ResourceRequirements, "CPU, memory and other resources.")
    env: list[EnvVar] = Field(default_factory=list, max_length=128, description="Extra environment.")
    security_context: ContainerSecurityContext = _section(
        ContainerSecurityContext, "The engine container's securityContext."
    )
    pod_security_context: PodSecurityContext = _section(PodSecurityContext, "The engine pods' securityContext.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod node selector.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="Pod tolerations.")


class TenantTarget(Model):
    name: str = Field(min_length=1, max_length=253, description="Value of the tenant label.")
    ttft_p99_seconds: float = Field(gt=0, le=3600, description="p99 TTFT target of this tenant.")


class Objective(Model):
    tenant_label: str = Field(
        default="tenant",
        min_length=1,
        max_length=63,
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="Metric label naming the tenant (an allowed custom label of the engine).",
    )
    ttft_p99_seconds: float = Field(
        default=2.0, gt=0, le=3600, description="p99 TTFT target of every tenant not listed in tenants."
    )
    tenants: list[TenantTarget] = Field(
        default_factory=list,
        max_length=256,
        description="Per-tenant p99 TTFT targets.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class Rollout(Model):
    canary_replicas: int = Field(default=1, ge=1, le=64, description="Pods that try a new setting first.")
    analysis_window_seconds: int = Field(
        default=300, ge=30, le=86400, description="How long canaries are compared before promotion."
    )
    max_regression_percent: float = Field(
        default=5.0, ge=0, le=100, description="Allowed p99 TTFT regression of any tenant on the canaries."
    )


class Tuning(Model):
    """What T to run and how Slipstream may move it."""

    model_config = _rules(
        (
            # has(): the rule is also checked against the CRD's `default: {}` of tuning.
            "!has(self.minConcurrency) || !has(self.maxConcurrency) "
            "|| self.minConcurrency <= self.maxConcurrency",
            "spec.tuning.minConcurrency must be <= spec.tuning.maxConcurrency: lower "
            "minConcurrency or raise maxConcurrency",
        ),
    )

    mode: TuningMode = Field(default="Fixed", description="Auto | Recommend | Fixed | Off.")
    threshold: int | None = Field(
        default=None,
        ge=0,
        le=1048576,
        description="T (--long-prefill-token-threshold): required for Fixed, the starting value "
        "otherwise; 0 turns the cap off. Per engine scheduler: with DP attention (--dp-size N) "
        "SGLang gives each DP rank chunkedPrefillSize / N tokens a round, so T must be <= that.",
    )
    engine_mode: EngineMode = Field(default="ceiling", description="--long-prefill-mode.")
    schedule_policy: SchedulePolicy = Field(default="fcfs", description="--schedule-policy.")
    min_concurrency: int = Field(default=1, ge=1, le=256, description="Fewest concurrent prefills (C // T) Auto may choose.")
    max_concurrency: int = Field(default=8, ge=1, le=256, description="Most concurrent prefills (C // T) Auto may choose.")
    interval_seconds: int = Field(default=60, ge=10, le=86400, description="How often the mix is measured.")
    cooldown_seconds: int = Field(default=600, ge=0, le=86400, description="Least time between two changes.")
    objective: Objective = _section(Objective, "Latency objective.")
    rollout: Rollout = _section(Rollout, "Progressive rollout of a new setting.")


class Prometheus(Model):
    url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://",
        description="Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090.",
    )
    bearer_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding a bearer token for Prometheus."
    )
    create_pod_monitor: bool = Field(
        default=True, description="Create a PodMonitor for the engines when that CRD exists."
    )


class ServingDeploymentSpec(Model):
    model_config = _rules(
        (
            "self.tuning.mode != 'Fixed' || has(self.tuning.threshold)",
            "spec.tuning.threshold is required when spec.tuning.mode is Fixed: set "
            "spec.tuning.threshold (0 turns the cap off) or choose mode Auto, Recommend or Off",
        ),
        (
            "!has(self.tuning.threshold) || self.tuning.threshold <= self.engine.chunkedPrefillSize",
            "spec.tuning.threshold must be <= spec.engine.chunkedPrefillSize: lower the threshold "
            "or raise chunkedPrefillSize (with DP attention, --enable-dp-attention --dp-size N in "
            "extraArgs, each DP rank gets chunkedPrefillSize / N tokens a round and T applies per "
            "rank: keep T <= chunkedPrefillSize / N, which the engine enforces)",
        ),
        (
            "!has(self.tuning.threshold) || self.tuning.threshold % self.engine.pageSize == 0",
            "spec.tuning.threshold must be a multiple of spec.engine.pageSize: round it to a "
            "whole number of pages (0 turns the cap off)",
        ),
        (
            "self.tuning.maxConcurrency * self.engine.pageSize <= self.engine.chunkedPrefillSize",
            "spec.tuning.maxConcurrency must be <= spec.engine.chunkedPrefillSize / "
            "spec.engine.pageSize: each concurrent prefill needs at least one page a round",
        ),
        (
            "!(self.tuning.mode in ['Auto', 'Recommend']) || has(self.prometheus.url)",
            "spec.prometheus.url is required when spec.tuning.mode is Auto or Recommend: set it "
            "to your Prometheus, or choose mode Fixed or Off",
        ),
        (
            "self.tuning.mode != 'Auto' || self.tuning.rollout.canaryReplicas <= self.replicas",
            "spec.tuning.rollout.canaryReplicas must be <= spec.replicas in mode Auto: lower "
            "canaryReplicas or add replicas",
        ),
    )

    replicas: int = Field(default=1, ge=0, le=512, description="Engine pods.")
    engine: Engine = Field(description="The engine each pod runs.")
    tuning: Tuning = _section(Tuning, "Threshold tuning.")
    prometheus: Prometheus = _section(Prometheus, "Where the engines' metrics are read.")


class EngineSetting(Model):
    """The tuned triple: admission order, mode and T."""

    threshold: int = Field(ge=0, description="T; 0 is off.")
    mode: EngineMode = Field(default="ceiling")
    schedule_policy: SchedulePolicy = Field(default="fcfs")


class Decision(Model):
    time: str = Field(json_schema_extra={"format": "date-time"}, description="When it was decided.")
    from_: EngineSetting | None = Field(default=None, alias="from", description="Setting before.")
    to: EngineSetting = Field(description="Setting after.")
    reason: str = Field(max_length=1024, description="Why, in a sentence.")


RolloutPhase = Literal["Idle", "Canary", "Analysis", "Promoting", "RollingBack"]
"""Idle: nothing in flight; Canary: the candidate is being set on the canary pods;
Analysis: canaries run it and are compared with the baseline pods; Promoting: every pod is
being moved to it; RollingBack: pods on the candidate are being returned to the baseline."""


class RolloutStatus(Model):
    """The rollout's state, persisted so that a restarted operator resumes it."""

    phase: RolloutPhase = "Idle"
    candidate: EngineSetting | None = Field(default=None, description="The setting being rolled out (or the last one).")
    baseline: EngineSetting | None = Field(
        default=None, description="The fleet's setting before this rollout: what a rollback returns to."
    )
    reason: str | None = Field(default=None, max_length=1024, description="Why the candidate was chosen.")
    canary_pods: list[str] = Field(default_factory=list, max_length=64)
    started_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When the current phase began."
    )
    attempts: int = Field(default=0, ge=0, description="Rounds of admin calls issued in the current phase.")
    result: Literal["Promoted", "RolledBack"] | None = Field(
        default=None, description="How the last rollout ended (phase Idle)."
    )
    finished_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When the last rollout ended."
    )
    message: str | None = Field(default=None, max_length=1024)


class TenantLatency(Model):
    name: str = Field(max_length=253)
    ttft_p99_seconds: float | None = None
    target_seconds: float | None = None
    requests_per_second: float | None = None


class Condition(Model):
    """metav1.Condition."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(default=None, ge=0)


class ServingDeploymentStatus(Model):
    phase: Phase | None = None
    threshold: int | None = Field(default=None, ge=0, description="T the engines run now.")
    concurrency: int | None = Field(default=None, ge=1, description="C // T (1 when T is 0).")
    mode: EngineMode | None = Field(default=None, description="Engine mode in effect.")
    schedule_policy: SchedulePolicy | None = None
    heterogeneity: float | None = Field(default=None, description="Measured heterogeneity of the mix.")
    recommendation: EngineSetting | None = Field(default=None, description="What the tuner would run.")
    last_decision: Decision | None = None
    rollout: RolloutStatus | None = None
    tenants: list[TenantLatency] = Field(default_factory=list, max_length=256)
    ready_replicas: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = Field(default_factory=list, max_length=32)
    observed_generation: int | None = Field(default=None, ge=0)


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0


class ServingDeployment(Model):
    model_config = ConfigDict(extra="ignore")

    api_version: Literal["serving.slipstream.dev/v1alpha1"] = "serving.slipstream.dev/v1alpha1"
    kind: Literal["ServingDeployment"] = "ServingDeployment"
    metadata: ObjectMeta
    spec: ServingDeploymentSpec
    status: ServingDeploymentStatus = Field(default_factory=ServingDeploymentStatus)
