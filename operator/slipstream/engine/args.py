"""Launch arguments of the patched engine (`python3 -m sglang.launch_server ...`).

The tuned triple (threshold, mode, admission order) is never written into a pod template:
the template refers to environment variables that come from the deployment's ConfigMap, and
Kubernetes expands `$(VAR)` in `args` when a container starts. So a new pod starts with the
current threshold while changing the threshold leaves the template (and the running pods)
alone. The admin API key reaches the engine only as the environment variable
SLIPSTREAM_ADMIN_API_KEY from a Secret, never as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from slipstream.api import models
from slipstream.engine import metrics

COMMAND = ("python3", "-m", "sglang.launch_server")

THRESHOLD_ENV = "SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD"
MODE_ENV = "SLIPSTREAM_LONG_PREFILL_MODE"
SCHEDULE_POLICY_ENV = "SLIPSTREAM_SCHEDULE_POLICY"
ADMIN_API_KEY_ENV = "SLIPSTREAM_ADMIN_API_KEY"
ADMIN_KEY_SECRET_KEY = "api-key"
"""Key of the admin key in the Secret the operator generates when the spec names none."""

# ConfigMap keys holding the current setting (what a newly started pod uses).
THRESHOLD_KEY = "threshold"
MODE_KEY = "mode"
SCHEDULE_POLICY_KEY = "schedulePolicy"
SETTING_ENV = ((THRESHOLD_ENV, THRESHOLD_KEY), (MODE_ENV, MODE_KEY), (SCHEDULE_POLICY_ENV, SCHEDULE_POLICY_KEY))


@dataclass(frozen=True)
class SettingArgs:
    """Values of the three tuned flags: literals, or `$(VAR)` references."""

    threshold: str
    mode: str
    schedule_policy: str

    @classmethod
    def of(cls, setting: models.EngineSetting) -> SettingArgs:
        return cls(str(setting.threshold), setting.mode, setting.schedule_policy)

    @classmethod
    def from_env(cls) -> SettingArgs:
        return cls(f"$({THRESHOLD_ENV})", f"$({MODE_ENV})", f"$({SCHEDULE_POLICY_ENV})")


def launch_args(engine: models.EngineSpec, tenant_label: str, setting: SettingArgs) -> list[str]:
    """Arguments after `python3 -m sglang.launch_server`."""
    args = [
        "--model-path", engine.model,
        "--host", "0.0.0.0",
        "--port", str(engine.port),
        "--tp-size", str(engine.tensor_parallel_size),
        "--chunked-prefill-size", str(engine.chunked_prefill_size),
        "--page-size", str(engine.page_size),
        "--long-prefill-token-threshold", setting.threshold,
        "--long-prefill-mode", setting.mode,
        "--schedule-policy", setting.schedule_policy,
        "--enable-metrics",
        "--tokenizer-metrics-custom-labels-header", metrics.CUSTOM_LABELS_HEADER,
        "--tokenizer-metrics-allowed-custom-labels", tenant_label,
    ]  # fmt: skip
    if engine.served_model_name:
        args += ["--served-model-name", engine.served_model_name]
    if engine.context_length is not None:
        args += ["--context-length", str(engine.context_length)]
    if engine.mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(engine.mem_fraction_static)]
    if engine.trust_remote_code:
        args.append("--trust-remote-code")
    args += hicache_args(engine.hicache)
    # No --admin-api-key: argv is world-readable (ps, /proc, pod specs). The engine reads
    # the key from env SLIPSTREAM_ADMIN_API_KEY, set from a Secret (`admin_key_ref`).
    return args + list(engine.extra_args)


def hicache_args(hicache: models.HiCache) -> list[str]:
    if not hicache.enabled:
        return []
    args = ["--enable-hierarchical-cache", "--hicache-write-policy", hicache.write_policy]
    if hicache.ratio is not None:
        args += ["--hicache-ratio", str(hicache.ratio)]
    if hicache.size_gb is not None:
        args += ["--hicache-size", str(hicache.size_gb)]
    if hicache.storage_backend:
        args += ["--hicache-storage-backend", hicache.storage_backend]
    return args


def admin_key_secret_name(deployment: str) -> str:
    """The Secret the operator generates and owns when spec.engine.adminApiKeySecretRef is unset."""
    return f"{deployment}-admin-key"


def admin_key_ref(deployment: str, engine: models.EngineSpec) -> models.SecretKeyRef:
    """Where the engines' admin key lives: the spec's Secret, else the generated one."""
    if engine.admin_api_key_secret_ref is not None:
        return engine.admin_api_key_secret_ref
    return models.SecretKeyRef(name=admin_key_secret_name(deployment), key=ADMIN_KEY_SECRET_KEY)
