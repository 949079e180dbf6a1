"""The queue-mix series the operator queries (slipstream.engine.metrics) are the ones the
engine patches define, with the same size classes (slipstream.api.buckets); every series a
patch adds is one the engine simulator exports (or is named here as not simulated), and the
reflex's round counter has the same name, type and labels in both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slipstream.api import buckets
from slipstream.engine import metrics
from slipstream.enginesim.metrics import EngineMetrics

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


NOT_SIMULATED = {"sglang:partial_prefill_kv_reserved_tokens"}
"""Series a patch adds that the simulator does not export (docs/enginesim.md)."""


def simulator_families() -> dict:
    """The simulator's metric families by the name Prometheus scrapes (a counter's with
    ``_total``, as the patch names it)."""
    return {f.name + ("_total" if f.type == "counter" else ""): f
            for f in EngineMetrics("m", ("tenant",)).registry.collect()}


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_every_series_the_patch_adds_is_the_simulators(patch):
    defined = set(re.findall(r'name="(sglang:[a-z_]+)"', added(patch)))
    assert metrics.LONG_PREFILL_ROUNDS_TOTAL in defined
    assert defined - NOT_SIMULATED <= set(simulator_families())
    assert defined >= NOT_SIMULATED  # a name dropped from the patch leaves this list too


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_the_long_prefill_rounds_counter_matches_the_patch(patch):
    text = added(patch)
    at = text.index(f'name="{metrics.LONG_PREFILL_ROUNDS_TOTAL}"')
    definition = text[text.rindex("= Counter(", 0, at):text.index("\n        )", at)]
    assert f'labelnames=list(labels.keys()) + ["{metrics.CAPPED_LABEL}"]' in definition
    assert 'capped="true" if capped else "false"' in text
    assert f"for capped in {metrics.CAPPED_VALUES!r}".replace("'", '"') in text  # both start at 0
    family = simulator_families()[metrics.LONG_PREFILL_ROUNDS_TOTAL]
    assert family.type == "counter"
    totals = [s for s in family.samples if s.name == metrics.LONG_PREFILL_ROUNDS_TOTAL]
    assert sorted(s.labels[metrics.CAPPED_LABEL] for s in totals) == sorted(metrics.CAPPED_VALUES)
    assert all(s.value == 0 for s in totals)
