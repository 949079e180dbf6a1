"""ServingDeployment: the one source of field names.

The pydantic models below are the API. Python code uses snake_case attributes; the
Kubernetes object uses the camelCase aliases. `slipstream.api.crdgen` turns these models
into the CRD's structural schema: bounds and defaults come from the `Field(...)`
arguments, and the cross-field rules (CEL `x-kubernetes-validations`, enforced by the
kube-apiserver) are attached to the model that owns them, so the rule and the fields it
names sit side by side.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)
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
EngineMode = Literal["ceiling", "floor", "reflex"]
"""ceiling: no request takes more than T a round; floor: each long request is guaranteed T
a round and expands into idle budget."""
SchedulePolicy = Literal["fcfs", "lpm", "srpt", "hrrn", "shortest-prefill-first"]
"""Admission order of waiting requests (srpt: shortest remaining uncached prefill first, the
patch's; hrrn and shortest-prefill-first: SGLang 0.5.23's own, so 0.5.23 only)."""
EngineVersion = Literal["0.5.18", "0.5.23"]
"""The SGLang releases Slipstream has a patch for (`slipstream.api.versions.PATCHED`)."""
DeploymentPhase = Literal["Pending", "Progressing", "Ready", "Degraded"]

QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
"""Kubernetes' quantity grammar, non-negative (a resource request or limit can be no less).
Kubernetes' own OpenAPI pattern is looser ("..." and "1.2.3" match it) and its parser then
refuses them in the Deployment: this one refuses them at apply."""
Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=64)],
    # As Kubernetes' own schema writes it: the pattern beside the anyOf (it applies to
    # strings only, as minimum applies to integers only; a structural schema allows no more
    # than the two types in the anyOf).
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "minimum": 0,
        "maxLength": 64,
    }),
]  # fmt: skip
RESOURCE_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A resource name (cpu, memory, example.com/foo): a qualified name, as Pod validation wants."""
ResourceName = Annotated[str, StringConstraints(pattern=RESOURCE_NAME_PATTERN, max_length=317)]
LABEL_KEY_PATTERN = RESOURCE_NAME_PATTERN
"""A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters."""
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY_PATTERN, max_length=317)]
LabelValue = Annotated[str, StringConstraints(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)]
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Secret's name: a DNS subdomain (what the Deployment's secretKeyRef must name)."""
"""A Kubernetes resource quantity: 8, "8", "64Gi", "500m" (not "lots": refused at apply)."""

ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
"""Environment variable names the kubelet accepts (letters, digits, '_', '-', '.'; no digit first)."""
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX = 52
"""The ServingDeployment's name becomes a Service name (DNS-1035 label) and a label value
(<= 63); 52 leaves room for the pods' generated suffixes and `-engine-setting`."""


class CelRule(NamedTuple):
    """A cross-field rule, written twice side by side: in CEL for the apiserver (the CRD's
    `x-kubernetes-validations`) and in Python for the models, so that a spec checked
    locally is refused for the same reason, with the same message, as at apply
    (tests/cluster/test_spec_fuzz.py checks that the two agree)."""

    cel: str
    message: str
    holds: Callable[[Any], bool]


NAME_RULE = CelRule(
    f"self.metadata.name.matches('{NAME_PATTERN}') && size(self.metadata.name) <= {NAME_MAX}",
    "metadata.name must be a DNS label of at most 52 characters (lower-case letters, digits and "
    "'-', starting with a letter, no dots): it names the engine Service and labels every "
    "engine pod; choose a shorter name without dots",
    lambda sd: re.fullmatch(NAME_PATTERN, sd.metadata.name) is not None and len(sd.metadata.name) <= NAME_MAX,
)
"""On the CRD's root (crdgen puts it there): the name is metadata, outside every spec model."""


def _rules(*rules: CelRule) -> ConfigDict:
    """Model config carrying CEL rules (rule, message) into the CRD."""
    validations: list[JsonValue] = [{"rule": r.cel, "message": r.message} for r in rules]
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})


def _section(model: type[BaseModel], description: str) -> Any:
    """An optional sub-object that is always present after defaulting (CRD default {})."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields refused."""

    # strict: no "2" for 2 or true for 1, as the apiserver's schema refuses them.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()
    """The model's cross-field rules; `model_config = _rules(*cel_rules)` puts them in the CRD."""

    @model_validator(mode="after")
    def _cel_rules_hold(self) -> Any:
        for rule in type(self).cel_rules:
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self

    def to_k8s(self) -> dict[str, Any]:
        """The object as the Kubernetes API shows it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class SecretKeyRef(Model):
    name: str = Field(
        min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN, description="Name of a Secret in the same namespace."
    )
    key: str = Field(
        default="api-key", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key in the Secret's data.",
    )  # fmt: skip


class ResourceRequirements(Model):
    requests: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=32, description='Resource requests, e.g. {"cpu": 32, "memory": "512Gi"}.'
    )
    limits: dict[ResourceName, Quantity] = Field(
        default_factory=dict,
        max_length=32,
        description="Resource limits. GPUs are added from engine.gpus; do not list them here.",
    )


class EnvVar(Model):
    cel_rules = (
        CelRule(
            "!(has(self.value) && has(self.secretKeyRef))",
            "spec.engine.env: an entry takes value or secretKeyRef, not both: remove one of them",
            lambda e: not (e.value is not None and e.secret_key_ref is not None),
        ),
    )
    model_config = _rules(*cel_rules)

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Environment variable name.")
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    secret_key_ref: SecretKeyRef | None = Field(
        default=None, description="Take the value from a key of a Secret instead."
    )


class Toleration(Model):
    """A pod toleration; the rules are Pod validation's, refused here at apply instead."""

    cel_rules = (
        CelRule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "spec.engine.tolerations: operator Exists takes no value: remove the value or use operator Equal",
            lambda t: t.operator != "Exists" or not t.value,
        ),
        CelRule(
            "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "spec.engine.tolerations: an entry without a key must use operator Exists (it then "
            "tolerates every taint): set a key or operator Exists",
            lambda t: bool(t.key) or t.operator == "Exists",
        ),
        CelRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "spec.engine.tolerations: tolerationSeconds applies only to effect NoExecute: remove "
            "it or set effect NoExecute",
            lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
    )
    model_config = _rules(*cel_rules)

    key: str | None = Field(default=None, max_length=317, pattern=f"^$|{LABEL_KEY_PATTERN}")
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class HiCache(Model):
    """SGLang's hierarchical KV cache (host memory, optionally storage) behind the GPU pool."""

    cel_rules = (
        CelRule(
            "!(has(self.ratio) && has(self.sizeGB))",
            "spec.engine.hicache: set only one of ratio or sizeGB (sizeGB overrides ratio in "
            "the engine): remove one of them",
            lambda h: not (h.ratio is not None and h.size_gb is not None),
        ),
    )
    model_config = _rules(*cel_rules)

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
    """Linux capabilities of the engine container. Default: every one dropped, none added.
    SGLang serving (HTTP, the scheduler and tokenizer processes, NCCL over /dev/shm and
    CUDA IPC between the ranks of one pod) needs none; RDMA transports that pin memory
    (InfiniBand, GPUDirect RDMA, Mooncake over RDMA) may need IPC_LOCK added."""

    add: list[str] = Field(
        default_factory=list, max_length=64,
        description="Linux capabilities to add back. Default none: SGLang needs none (IPC_LOCK only for RDMA transports).",
    )  # fmt: skip
    drop: list[str] = Field(
        default_factory=lambda: ["ALL"], max_length=64,
        description="Linux capabilities to drop. Default [ALL]; [] keeps the container runtime's default set.",
    )  # fmt: skip


class ContainerSecurityContext(Model):
    """The engine container's securityContext (the fields an engine needs; Kubernetes' names)."""

    allow_privilege_escalation: bool = Field(
        default=False, description="An engine never needs setuid binaries: false unless an image does."
    )
    read_only_root_filesystem: bool | None = Field(default=None, description="Mount the image read-only.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to start as UID 0.")
    run_as_user: int | None = Field(default=None, ge=0, le=2147483647)
    run_as_group: int | None = Field(default=None, ge=0, le=2147483647)
    capabilities: Capabilities = _section(
        Capabilities, "Linux capabilities. Default: drop ALL, add none (SGLang needs none)."
    )


class PodSecurityContext(Model):
    """The engine pods' securityContext."""

    run_as_non_root: bool | None = None
    run_as_user: int | None = Field(default=None, ge=0, le=2147483647)
    run_as_group: int | None = Field(default=None, ge=0, le=2147483647)
    fs_group: int | None = Field(default=None, ge=0, le=2147483647)
    seccomp_profile_type: Literal["RuntimeDefault", "Unconfined"] = Field(
        default="RuntimeDefault",
        description="seccompProfile.type: the runtime's default filter unless an engine needs "
        "another (Localhost needs a profile file on every node: not offered).",
    )


class EngineSpec(Model):
    """The patched SGLang engine each pod runs."""

    cel_rules = (
        CelRule(
            "self.chunkedPrefillSize % self.pageSize == 0",
            "spec.engine.chunkedPrefillSize must be a multiple of spec.engine.pageSize: round "
            "chunkedPrefillSize to a whole number of pages",
            lambda e: e.chunked_prefill_size % e.page_size == 0,
        ),
        CelRule(
            "!has(self.gpus) || self.gpus == 0 || self.gpus >= self.tensorParallelSize",
            "spec.engine.gpus must be at least spec.engine.tensorParallelSize (or 0: no GPU "
            "request, as for simulated engines): each tensor-parallel rank needs its own GPU",
            lambda e: e.gpus is None or e.gpus == 0 or e.gpus >= e.tensor_parallel_size,
        ),
    )
    model_config = _rules(*cel_rules)

    image: str = Field(
        min_length=1, max_length=1024, pattern=r"^\S(.*\S)?$",
        description="Image of the patched engine (no leading or trailing space), built from "
        "engine_image/Dockerfile for spec.engine.version (tag slipstream-engine:<version>).",
    )  # fmt: skip
    version: EngineVersion = Field(
        default="0.5.23",
        description="The SGLang release the image holds (0.5.18 or 0.5.23; default the newest). "
        "The operator offers it only the settings its patch supports (hrrn and "
        "shortest-prefill-first need 0.5.23) and tunes only engines that report this release.",
    )
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
        default="nvidia.com/gpu",
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
        description="Extended resource name of a GPU (domain/name, e.g. nvidia.com/gpu, amd.com/gpu).",
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
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64, description="Pod node selector.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="Pod tolerations.")


class TenantTarget(Model):
    name: str = Field(min_length=1, max_length=253, description="Value of the tenant label.")
    ttft_p99_seconds: float = Field(
        gt=0, le=3600, description="p99 time-to-first-token target of this tenant, in seconds (no default: required)."
    )


class Objective(Model):
    tenant_label: str = Field(
        default="tenant",
        min_length=1,
        max_length=63,
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="Metric label naming the tenant (an allowed custom label of the engine).",
    )
    ttft_p99_seconds: float = Field(
        default=2.0, gt=0, le=3600,
        description="p99 time-to-first-token target of every tenant not listed in tenants, in seconds. Default 2.0 (seconds).",
    )
    tenants: list[TenantTarget] = Field(
        default_factory=list,
        max_length=256,
        description="Per-tenant p99 TTFT targets.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("tenants")
    @classmethod
    def _tenants_once(cls, tenants: list[TenantTarget]) -> list[TenantTarget]:
        # The CRD's list-map keys refuse a duplicate name at apply; the models the same.
        names = [t.name for t in tenants]
        if len(set(names)) != len(names):
            raise ValueError("spec.tuning.objective.tenants: each tenant name may appear once: merge the duplicates")
        return tenants


class Rollout(Model):
    # The defaults are the values the closed loop is measured with (docs/operator.md,
    # "Defaults and the measurements behind them").
    canary_replicas: int = Field(default=1, ge=1, le=64, description="Pods that try a new setting first. Default 1.")
    analysis_window_seconds: int = Field(
        default=120,
        ge=30,
        le=86400,
        description="Seconds the canaries run the candidate before they are compared with the other "
        "pods. Default 120 (seconds): two intervals of the default 60 s, long enough for the tail of "
        "a minute's traffic, short enough that a promotion lands well inside a 10-minute phase.",
    )
    max_regression_percent: float = Field(
        default=100.0,
        ge=0,
        le=100,
        description="Percent by which any tenant's p99 TTFT on the canaries may exceed the other pods' "
        "before the candidate is rolled back. Default 100 (percent, i.e. 2x): two windows of the same "
        "setting already differ by tens of percent on heavy-tailed traffic, and SGLang's TTFT buckets "
        "are 40-70% apart at tens of seconds, so a tighter bound rolls back good candidates.",
    )


class Tuning(Model):
    """What T to run and how Slipstream may move it."""

    cel_rules = (
        CelRule(
            # has(): the rule is also checked against the CRD's `default: {}` of tuning.
            "!has(self.minConcurrency) || !has(self.maxConcurrency) "
            "|| self.minConcurrency <= self.maxConcurrency",
            "spec.tuning.minConcurrency must be <= spec.tuning.maxConcurrency: lower "
            "minConcurrency or raise maxConcurrency",
            lambda t: t.min_concurrency <= t.max_concurrency,
        ),
    )
    model_config = _rules(*cel_rules)

    mode: TuningMode = Field(
        default="Fixed",
        description="Auto (the operator tunes and rolls out), Recommend (it tunes and reports only), "
        "Fixed (the spec's threshold, engineMode and schedulePolicy) or Off (the stock engine). Default Fixed.",
    )
    threshold: int | None = Field(
        default=None,
        ge=0,
        le=1048576,
        description="T (--long-prefill-token-threshold), in tokens (uncached prompt tokens per "
        "request per prefill round): required for Fixed, the starting value otherwise; 0 turns the "
        "cap off. No default: unset starts at 0 (off) outside Fixed; a multiple of engine.pageSize, at most "
        "engine.chunkedPrefillSize. Per engine scheduler: with DP attention (--dp-size N) "
        "SGLang gives each DP rank chunkedPrefillSize / N tokens a round, so T must be <= that.",
    )
    engine_mode: EngineMode = Field(
        default="ceiling",
        description="--long-prefill-mode: ceiling (no request takes more than T a pass), floor (T "
        "guaranteed per long request, idle budget to the partials) or reflex (ceiling in the passes "
        "where a request of at most T uncached tokens waits, or did in the last few seconds; stock "
        "otherwise). Default ceiling.",
    )
    schedule_policy: SchedulePolicy = Field(
        default="fcfs",
        description="--schedule-policy: the admission order in Fixed, the starting one otherwise. Default fcfs.",
    )
    min_concurrency: int = Field(default=1, ge=1, le=256, description="Fewest concurrent prefills (C // T, a count) Auto may choose. Default 1.")
    max_concurrency: int = Field(default=8, ge=1, le=256, description="Most concurrent prefills (C // T, a count) Auto may choose. Default 8.")
    orders: list[SchedulePolicy] = Field(
        default_factory=lambda: list[SchedulePolicy](("fcfs", "lpm", "srpt")),
        min_length=1,
        max_length=5,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Admission orders Auto and Recommend may choose (--schedule-policy). Default fcfs, "
        "lpm, srpt (both releases run them); on 0.5.23 add hrrn and shortest-prefill-first to let the "
        "tuner choose SGLang's own orders too, with or without a threshold.",
    )
    interval_seconds: int = Field(
        default=60,
        ge=10,
        le=86400,
        description="Seconds between two measurements of the mix (and two decisions). Default 60 "
        "(seconds): a window holds the tuner's 50-sample minimum at one request a second, and a "
        "change of mix is followed within a few intervals (docs/operator.md, \"Defaults\").",
    )
    cooldown_seconds: int = Field(
        default=180,
        ge=0,
        le=86400,
        description="Least seconds between two changes of the setting. Default 180 (seconds): one "
        "analysis window of the default 120 s plus an interval, so the next step is judged on a "
        "window that the last change no longer shapes, and the loop can still follow a mix that "
        "changes every 10 minutes.",
    )
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
    cel_rules = (
        CelRule(
            "self.tuning.mode != 'Fixed' || has(self.tuning.threshold)",
            "spec.tuning.threshold is required when spec.tuning.mode is Fixed: set "
            "spec.tuning.threshold (0 turns the cap off) or choose mode Auto, Recommend or Off",
            lambda s: s.tuning.mode != "Fixed" or s.tuning.threshold is not None,
        ),
        CelRule(
            "!has(self.tuning.threshold) || self.tuning.threshold <= self.engine.chunkedPrefillSize",
            "spec.tuning.threshold must be <= spec.engine.chunkedPrefillSize: lower the threshold "
            "or raise chunkedPrefillSize (with DP attention, --enable-dp-attention --dp-size N in "
            "extraArgs, each DP rank gets chunkedPrefillSize / N tokens a round and T applies per "
            "rank: keep T <= chunkedPrefillSize / N, which the engine enforces)",
            lambda s: s.tuning.threshold is None or s.tuning.threshold <= s.engine.chunked_prefill_size,
        ),
        CelRule(
            "!has(self.tuning.threshold) || self.tuning.threshold % self.engine.pageSize == 0",
            "spec.tuning.threshold must be a multiple of spec.engine.pageSize: round it to a "
            "whole number of pages (0 turns the cap off)",
            lambda s: s.tuning.threshold is None or s.tuning.threshold % s.engine.page_size == 0,
        ),
        CelRule(
            "self.tuning.maxConcurrency * self.engine.pageSize <= self.engine.chunkedPrefillSize",
            "spec.tuning.maxConcurrency must be <= spec.engine.chunkedPrefillSize / "
            "spec.engine.pageSize: each concurrent prefill needs at least one page a round",
            lambda s: s.tuning.max_concurrency * s.engine.page_size <= s.engine.chunked_prefill_size,
        ),
        CelRule(
            "!(self.tuning.mode in ['Auto', 'Recommend']) || has(self.prometheus.url)",
            "spec.prometheus.url is required when spec.tuning.mode is Auto or Recommend: set it "
            "to your Prometheus, or choose mode Fixed or Off",
            lambda s: s.tuning.mode not in ("Auto", "Recommend") or s.prometheus.url is not None,
        ),
        CelRule(
            "!(self.tuning.schedulePolicy in ['hrrn', 'shortest-prefill-first']) "
            "|| self.engine.version != '0.5.18'",
            "spec.tuning.schedulePolicy hrrn and shortest-prefill-first are SGLang 0.5.23's orders: "
            "set spec.engine.version 0.5.23 (with a 0.5.23 image) or choose fcfs, lpm or srpt",
            lambda s: s.tuning.schedule_policy not in ("hrrn", "shortest-prefill-first")
            or s.engine.version != "0.5.18",
        ),
        CelRule(
            "self.engine.version != '0.5.18' "
            "|| self.tuning.orders.all(o, !(o in ['hrrn', 'shortest-prefill-first']))",
            "spec.tuning.orders: hrrn and shortest-prefill-first are SGLang 0.5.23's orders: set "
            "spec.engine.version 0.5.23 (with a 0.5.23 image) or list only fcfs, lpm and srpt",
            lambda s: s.engine.version != "0.5.18"
            or not {"hrrn", "shortest-prefill-first"} & set(s.tuning.orders),
        ),
        CelRule(
            "self.tuning.mode != 'Auto' || self.tuning.rollout.canaryReplicas <= self.replicas",
            "spec.tuning.rollout.canaryReplicas must be <= spec.replicas in mode Auto: lower "
            "canaryReplicas or add replicas",
            lambda s: s.tuning.mode != "Auto" or s.tuning.rollout.canary_replicas <= s.replicas,
        ),
    )
    model_config = _rules(*cel_rules)

    replicas: int = Field(default=1, ge=0, le=512, description="Engine pods.")
    engine: EngineSpec = Field(description="The engine each pod runs.")
    tuning: Tuning = _section(Tuning, "Threshold tuning.")
    prometheus: Prometheus = _section(Prometheus, "Where the engines' metrics are read.")


def prefills_at_once(chunked_prefill_size: int, threshold: int) -> int:
    """Partial prefills an engine runs at once: C // T, and 1 when the cap is off (T 0):
    the status' and printer column's concurrency, and the tuner's."""
    return max(1, chunked_prefill_size // threshold) if threshold > 0 else 1


class EngineSetting(Model):
    """The tuned triple: admission order, mode and T."""

    threshold: int = Field(ge=0, description="T; 0 is off.")
    mode: EngineMode = Field(default="ceiling")
    schedule_policy: SchedulePolicy = Field(default="fcfs")


class DecisionRecord(Model):
    time: str = Field(json_schema_extra={"format": "date-time"}, description="When it was decided.")
    from_: EngineSetting | None = Field(default=None, alias="from", description="Setting before.")
    to: EngineSetting = Field(description="Setting after.")
    reason: str = Field(max_length=1024, description="Why, in a sentence.")


class LeftSetting(Model):
    """A setting a promotion left, and when: the tuner's dwell does not return to it for a few cooldowns."""

    setting: EngineSetting = Field(description="The setting the fleet ran before a promotion.")
    left_at: str = Field(json_schema_extra={"format": "date-time"}, description="When the promotion left it.")


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
    phase: DeploymentPhase | None = None
    threshold: int | None = Field(default=None, ge=0, description="T the engines run now.")
    concurrency: int | None = Field(default=None, ge=1, description="C // T (1 when T is 0).")
    mode: EngineMode | None = Field(default=None, description="Engine mode in effect.")
    schedule_policy: SchedulePolicy | None = None
    heterogeneity: float | None = Field(default=None, description="Measured heterogeneity of the mix.")
    prediction_error_ratio: float | None = Field(
        default=None, ge=0,
        description="The twin's p99 TTFT over the observed one for the worst tenant (1 is exact), replaying "
        "the last window under the running setting; outside 0.25-4 the tuner holds (ModelMismatch).",
    )
    recommendation: EngineSetting | None = Field(default=None, description="What the tuner would run.")
    last_decision: DecisionRecord | None = None
    left_settings: list[LeftSetting] = Field(
        default_factory=list, max_length=8, description="Settings recently left by a promotion, oldest first."
    )
    mixed_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"},
        description="When the tuner last saw a heterogeneous window (heterogeneity above 0.1); a cap is "
        "loosened only after a cooldown of near-uniform traffic since.",
    )
    rollout: RolloutStatus | None = None
    tenants: list[TenantLatency] = Field(default_factory=list, max_length=256)
    ready_replicas: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = Field(default_factory=list, max_length=32)
    observed_generation: int | None = Field(default=None, ge=0)


class ObjectMeta(BaseModel):
    """The metadata the operator reads. The rest (managedFields, ~15 kB as Python objects
    for a ServingDeployment a few managers have written, labels, annotations) is left out:
    a model is built for every reconcile, refresh and tuning step, and 500 tuning loops
    each hold one through their step (docs/reliability.md, "Scale")."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0


class ServingDeployment(Model):
    model_config = ConfigDict(extra="ignore")
    cel_rules = (NAME_RULE,)

    api_version: Literal["serving.slipstream.dev/v1alpha1"] = "serving.slipstream.dev/v1alpha1"
    kind: Literal["ServingDeployment"] = "ServingDeployment"
    metadata: ObjectMeta
    spec: ServingDeploymentSpec
    status: ServingDeploymentStatus = Field(default_factory=ServingDeploymentStatus)
