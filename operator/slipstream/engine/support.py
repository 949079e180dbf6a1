"""Which specs the patched engine refuses, checked before any pod is created.

The engine refuses a threshold > 0 or `srpt` at start-up with hybrid sliding-window
models, mamba / hybrid linear-attention models, HiCache and mixed chunking (its
`check_long_prefill_server_args`): several partial prefills reserve KV in the
full-attention pool only. Pods that crash-loop on that message help nobody, so the
operator refuses the same combination first, with the engine's wording. The operator
never sees the model's config.json, so families are recognised by name in
spec.engine.model; a model whose name does not say its family is still refused by the
engine at start-up.
"""

from __future__ import annotations

import re

from slipstream.api import models

HYBRID_SWA = "hybrid sliding-window attention models"
MAMBA = "mamba / hybrid linear-attention models"

# (family as docs/engine.md and the engine name it, kind, pattern on the lower-cased model).
# A family name must not be preceded by a letter or digit, nor its version followed by
# a digit ("llama-4" but not "llama-40b" nor "codellama4").
_B = r"(?<![a-z0-9])"
FAMILIES: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (family, kind, re.compile(_B + pattern + r"(?![0-9])"))
    for family, kind, pattern in (
        ("DeepSeek-V4", HYBRID_SWA, r"deepseek[-_ ]?v4"),
        ("gpt-oss", HYBRID_SWA, r"gpt[-_ ]?oss"),
        ("Llama 4", HYBRID_SWA, r"llama[-_ ]?4"),
        ("Gemma 4", HYBRID_SWA, r"gemma[-_ ]?4"),
        ("MiMo-V2", HYBRID_SWA, r"mimo[-_ ]?v2"),
        ("Step-3.5", HYBRID_SWA, r"step[-_ ]?3[._p]5"),
        ("Qwen3-Next", MAMBA, r"qwen3[-_ ]?next"),
        ("Qwen3.5", MAMBA, r"qwen3[._p]5"),
        ("Nemotron-H", MAMBA, r"nemotron[-_ ]?h(?![a-z])"),
        ("Falcon-H1", MAMBA, r"falcon[-_ ]?h1"),
        ("Kimi-Linear", MAMBA, r"kimi[-_ ]?linear"),
        ("Mamba", MAMBA, r"mamba"),
    )
)

FIX = "set spec.tuning.mode Off, or Fixed with threshold 0 and schedulePolicy fcfs or lpm"


def patched_scheduling(tuning: models.Tuning) -> bool:
    """Whether the engines may run a threshold > 0 or srpt: Auto may move them there;
    Fixed and Recommend start the engines with the spec's values; Off runs stock."""
    if tuning.mode == "Off":
        return False
    if tuning.mode == "Auto":
        return True
    return (tuning.threshold or 0) > 0 or tuning.schedule_policy == "srpt"


def model_family(model: str) -> tuple[str, str] | None:
    """(family, kind) when the model path or id names a refused family, else None."""
    name = model.lower()
    for family, kind, pattern in FAMILIES:
        if pattern.search(name):
            return family, kind
    return None


def refusal(spec: models.ServingDeploymentSpec) -> tuple[str, str] | None:
    """(reason, message) when the engine would refuse this spec at start-up, else None."""
    if not patched_scheduling(spec.tuning):
        return None
    what = (
        f"spec.tuning.mode {spec.tuning.mode} (threshold {spec.tuning.threshold or 0}, "
        f"schedulePolicy {spec.tuning.schedule_policy})"
    )
    head = f"{what}: --long-prefill-token-threshold / --schedule-policy srpt (Slipstream patch) is not supported with"
    found = model_family(spec.engine.model)
    if found is not None:
        family, kind = found
        return (
            "UnsupportedModel",
            f"{head} {kind} (spec.engine.model {spec.engine.model!r}: the {family} family); "
            f"{FIX}, or serve a model whose KV is one full-attention pool",
        )
    if spec.engine.hicache.enabled:
        return (
            "UnsupportedFeature",
            f"{head} HiCache (--enable-hierarchical-cache, spec.engine.hicache.enabled); "
            f"{FIX}, or set spec.engine.hicache.enabled false",
        )
    if any(a == "--enable-mixed-chunk" or a.startswith("--enable-mixed-chunk=") for a in spec.engine.extra_args):
        return (
            "UnsupportedFeature",
            f"{head} mixed chunking (--enable-mixed-chunk in spec.engine.extraArgs); "
            f"{FIX}, or drop --enable-mixed-chunk from spec.engine.extraArgs",
        )
    return None
