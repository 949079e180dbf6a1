"""The operator refuses, before creating pods, what the patched engine refuses at start-up:
hybrid sliding-window and mamba / hybrid-linear models, HiCache and mixed chunking with a
threshold > 0 or srpt. Stock settings and supported models pass."""

from __future__ import annotations

from typing import Any

import pytest

from slipstream.api import models
from slipstream.engine import support


def spec(model: str = "Qwen/Qwen3-8B", tuning: dict[str, Any] | None = None, **engine: Any) -> models.ServingDeploymentSpec:
    return models.ServingDeploymentSpec.model_validate({
        "engine": {"image": "i:1", "model": model, "chunkedPrefillSize": 8192, "pageSize": 64, **engine},
        "tuning": tuning or {"mode": "Fixed", "threshold": 2048},
        "prometheus": {"url": "http://127.0.0.1:9090"},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("model", "family", "kind"),
    [
        ("deepseek-ai/DeepSeek-V4-Flash", "DeepSeek-V4", support.HYBRID_SWA),
        ("openai/gpt-oss-120b", "gpt-oss", support.HYBRID_SWA),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "Llama 4", support.HYBRID_SWA),
        ("/models/gemma-4-27b-it", "Gemma 4", support.HYBRID_SWA),
        ("XiaomiMiMo/MiMo-V2-Flash", "MiMo-V2", support.HYBRID_SWA),
        ("stepfun-ai/Step-3.5-Flash", "Step-3.5", support.HYBRID_SWA),
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen3-Next", support.MAMBA),
        ("Qwen/Qwen3.5-397B-A17B", "Qwen3.5", support.MAMBA),
        ("nvidia/Nemotron-H-8B-Base-8K", "Nemotron-H", support.MAMBA),
        ("tiiuae/Falcon-H1-7B-Instruct", "Falcon-H1", support.MAMBA),
        ("moonshotai/Kimi-Linear-48B-A3B-Instruct", "Kimi-Linear", support.MAMBA),
        ("state-spaces/mamba-2.8b", "Mamba", support.MAMBA),
    ],
)
def test_each_refused_family_is_named_with_the_field_and_the_fix(model: str, family: str, kind: str) -> None:
    found = support.refusal(spec(model))
    assert found is not None
    reason, message = found
    assert reason == "UnsupportedModel"
    assert kind in message and f"the {family} family" in message and "spec.engine.model" in message
    assert support.FIX in message
    assert "is not supported with" in message  # the engine's wording


@pytest.mark.parametrize(
    "model",
    ["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-405B-Instruct", "deepseek-ai/DeepSeek-V3", "moonshotai/Kimi-K2-Instruct",
     "google/gemma-3-27b-it", "Qwen/Qwen3-30B-A3B", "/ckpt/run/checkpoint-step-35000", "codellama/CodeLlama-34b-hf"],
)  # fmt: skip
def test_supported_models_are_accepted(model: str) -> None:
    assert support.refusal(spec(model)) is None
    assert support.refusal(spec(model, {"mode": "Auto", "threshold": 2048})) is None


def test_hicache_and_mixed_chunking_are_refused_naming_the_field() -> None:
    hicache = support.refusal(spec(hicache={"enabled": True}))
    assert hicache is not None and hicache[0] == "UnsupportedFeature"
    assert "spec.engine.hicache.enabled" in hicache[1] and "--enable-hierarchical-cache" in hicache[1]
    mixed = support.refusal(spec(extraArgs=["--enable-mixed-chunk"]))
    assert mixed is not None and mixed[0] == "UnsupportedFeature"
    assert "drop --enable-mixed-chunk from spec.engine.extraArgs" in mixed[1]


@pytest.mark.parametrize(
    "tuning",
    [{"mode": "Off"}, {"mode": "Fixed", "threshold": 0}, {"mode": "Fixed", "threshold": 0, "schedulePolicy": "lpm"},
     {"mode": "Recommend", "threshold": 0}],
)  # fmt: skip
def test_stock_settings_are_accepted_with_every_refused_model_and_feature(tuning: dict[str, Any]) -> None:
    for s in (spec("openai/gpt-oss-20b", tuning), spec(tuning=tuning, hicache={"enabled": True}),
              spec(tuning=tuning, extraArgs=["--enable-mixed-chunk"])):  # fmt: skip
        assert support.refusal(s) is None


@pytest.mark.parametrize(
    "tuning",
    [{"mode": "Auto"}, {"mode": "Auto", "threshold": 0}, {"mode": "Fixed", "threshold": 0, "schedulePolicy": "srpt"},
     {"mode": "Fixed", "threshold": 1024}, {"mode": "Recommend", "threshold": 1024}],
)  # fmt: skip
def test_settings_that_can_cap_or_reorder_are_refused(tuning: dict[str, Any]) -> None:
    found = support.refusal(spec("openai/gpt-oss-20b", tuning))
    assert found is not None and f"spec.tuning.mode {tuning['mode']}" in found[1]
