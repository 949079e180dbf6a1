"""The queue-mix series the operator queries (slipstream.engine.metrics) are the ones the
engine patches define, with the same size classes (slipstream.api.buckets)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slipstream.api import buckets
from slipstream.engine import metrics

PATCHES = sorted((Path(__file__).resolve().parents[2] / "engine_image/patches").glob("sglang-*-long-prefill.patch"))
QUEUE_MIX = (
    metrics.REQUEST_ARRIVALS_TOTAL,
    metrics.QUEUE_REQS_BY_SIZE_CLASS,
    metrics.QUEUE_TOKENS_BY_SIZE_CLASS,
    metrics.TTFT_BY_SIZE_CLASS_SECONDS,
    metrics.PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL,
)


def added(patch: Path) -> str:
    return "\n".join(line[1:] for line in patch.read_text().splitlines() if line.startswith("+"))


def test_both_versions_have_a_patch():
    assert {p.name for p in PATCHES} >= {"sglang-0.5.18-long-prefill.patch", "sglang-0.5.23-long-prefill.patch"}


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_queue_mix_names_labels_and_classes_match_the_patch(patch):
    text = added(patch)
    defined = set(re.findall(r'name="(sglang:[a-z_]+)"', text))
    assert set(QUEUE_MIX) <= defined
    assert f'"{metrics.SIZE_CLASS_LABEL}"' in text and f'"{metrics.CACHE_LABEL}"' in text
    assert all(f'cache="{part}"' in text for part in metrics.CACHE_PARTS)
    classes = re.findall(r'\("(\w+)", ([\d_]+|float\("inf"\))\)', text)
    assert [(n, float("inf") if b.startswith("float") else float(b.replace("_", ""))) for n, b in classes] == list(
        buckets.SIZE_CLASSES
    )
