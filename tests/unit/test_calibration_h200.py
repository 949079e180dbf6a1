"""The twin's decode step for the H200-probed Qwen3-30B-A3B profile is within 15% of the
probe's measured decode step (issue 41, item 1: the touched-experts decode term).

The probe (engine_image/calibrate/probe.py, 2026-12-04, refitted 2026-12-07 with
``--refit``) measured decode at batch 1, 8, 32 and 128 and contexts 1K, 8K and 32K; the
issue asked for batch 1, 8 and 64, and 64 was never measured, so every measured point is
checked instead. The twin's prediction is computed here from the profile file with the
twin's own cost model and compared with the stored measurement: no result is written in
this file. The decode overhead is fitted to these same 12 points (their median residual),
so this is an in-sample check of one constant plus the touched-experts term.

One point misses: batch 128 at 32K context, where the twin charges about 17% more than
measured: the pass reads its 412 GB of KV faster than the device copy's 3.82 TB/s that
the roofline charges (a read, not a read and a write; the dense llama3-8b run shows the
same at 32K, docs/engine.md). It is marked a strict expected failure so that the figure stays reported, not hidden: a fit
that brings it within 15% fails the mark and must drop it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slipstream.sim import profiles
from slipstream.sim.cost import DECODE, CostModel

H200 = Path(__file__).resolve().parents[2] / "engine_image" / "calibrate" / "h200"
PROFILE = H200 / "qwen3-30b-a3b-h200.json"
MEASUREMENTS = H200 / "qwen3-30b-a3b-h200.measurements.json"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
TOLERANCE = 0.15
KNOWN_MISS = {(128, 32768): "the twin over-charges long-context decode of a large batch"}
"""(batch, context) points outside the tolerance, reported in docs/twin.md."""


def _measured_decodes() -> dict[tuple[int, int], float]:
    """Measured decode step seconds by (batch, context), as the probe stored them."""
    points = json.loads(MEASUREMENTS.read_text())["points"]
    return {(p["batch"], p["context"]): p["measured_s"] for p in points if p["kind"] == "decode"}


def _twin_decode_s(batch: int, context: int) -> float:
    """The twin's decode step: B tokens, each attending to and reading its c tokens of KV."""
    model = CostModel(profiles.load(str(PROFILE)))
    return model.pass_time(batch, batch * context, batch * context, 0, DECODE)


def _cases() -> list:
    return [
        pytest.param(batch, context, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISS[
            (batch, context)]) if (batch, context) in KNOWN_MISS else ())
        for batch, context in sorted(_measured_decodes())
    ]  # fmt: skip


def test_the_probe_measured_the_batches_and_contexts_this_file_says():
    batches = {b for b, _ in _measured_decodes()}
    contexts = {c for _, c in _measured_decodes()}
    assert batches == {1, 8, 32, 128} and contexts == {1024, 8192, 32768}


def test_the_profile_carries_the_routed_experts_of_the_probed_shape():
    """Without these fields the twin charged every expert on every pass: 3.7x at batch 1."""
    shape = json.loads(MEASUREMENTS.read_text())["shape"]
    profile = profiles.load(str(PROFILE))
    expert = 3 * shape["hidden"] * shape["intermediate"]  # gate, up and down
    assert profile.routed_expert_bytes == (
        shape["experts"] * expert * shape["layers"] * DTYPE_BYTES[shape["dtype"]])  # fmt: skip
    assert profile.routed_experts == shape["experts"]
    assert profile.experts_per_token == shape["active_experts"]


@pytest.mark.parametrize(("batch", "context"), _cases())
def test_twin_decode_step_is_within_15pct_of_the_h200_measurement(batch, context):
    measured = _measured_decodes()[(batch, context)]
    assert _twin_decode_s(batch, context) == pytest.approx(measured, rel=TOLERANCE)
