"""Shared test helpers: where the public traces live (../shared/traces beside the repo)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "traces"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
AZURE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared traces; their absence is a failure (CI has ../shared), never a skip."""
    assert MOONCAKE.is_file() and AZURE.is_file(), (
        f"public traces not found under {TRACES}: the repo expects ../shared/traces beside it"
    )
    return TRACES


@pytest.fixture(scope="session")
def mooncake(traces_dir: Path) -> Path:
    return MOONCAKE


@pytest.fixture(scope="session")
def azure(traces_dir: Path) -> Path:
    return AZURE
