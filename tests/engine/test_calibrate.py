"""The calibration probe (engine_image/calibrate/probe.py) on CPU with tiny shapes."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "engine_image/calibrate"))
import probe  # noqa: E402

from slipstream.sim import cost, profiles  # noqa: E402

TINY = probe.Shape(
    hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=128, dtype="float32"
)


def test_prefill_fit_recovers_known_coefficients():
    chunks = [16, 64, 256, 1024, 4096]
    truth = (0.002, 3e-6, 4e-10)
    secs = [truth[0] + c * truth[1] + probe.pairs(c) * truth[2] for c in chunks]
    fit = probe.fit_prefill(chunks, secs)
    assert fit["overhead_s"] == pytest.approx(truth[0], rel=1e-6)
    assert fit["linear_s_per_token"] == pytest.approx(truth[1], rel=1e-6)
    assert fit["attn_s_per_pair"] == pytest.approx(truth[2], rel=1e-6)


def test_fits_never_go_negative():
    # a curve that falls (noise) would give a negative slope: clamped to 0, refitted
    fit = probe.fit_decode([1, 2, 4, 8], [0.010, 0.0099, 0.0098, 0.0097])
    assert fit["s_per_request"] == 0.0
    assert fit["step_s_at_zero_batch"] == pytest.approx(0.00985)
    fit = probe.fit_prefill([10, 20, 40], [1.0, 2.0, 4.0])
    assert fit["overhead_s"] >= 0 and fit["attn_s_per_pair"] >= 0
    assert fit["linear_s_per_token"] == pytest.approx(0.1)


def test_knee_is_where_the_pass_stops_being_a_fixed_cost():
    assert probe.measured_knee([64, 128, 256, 512], [1.0, 1.1, 1.6, 3.0]) == 256
    assert probe.measured_knee([64, 128], [1.0, 1.1]) is None


def test_shape_arithmetic():
    s = TINY
    per_layer = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64 + 3 * 64 * 128
    assert s.params_per_layer == per_layer
    assert s.flops_per_token == 2 * per_layer * 3
    assert s.attn_flops_per_pair == 4 * 3 * 4 * 16
    assert s.weight_bytes == per_layer * 3 * 4
    assert s.kv_bytes_per_token == 3 * 2 * 2 * 16 * 4
    with pytest.raises(ValueError):
        probe.Shape(64, 2, 6, 4, 16, 128)  # heads not a multiple of kv_heads


def test_probe_writes_a_profile_the_twin_loads(tmp_path):
    out = tmp_path / "tiny.json"
    rc = probe.main(
        [
            "--name",
            "tiny-cpu",
            "--hidden",
            "64",
            "--layers",
            "3",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "16",
            "--intermediate",
            "128",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--chunks",
            "8,32,128,512",
            "--batches",
            "1,4,16",
            "--decode-context",
            "64",
            "--repeats",
            "2",
            "--copy-mib",
            "8",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data) == {
        "name",
        "description",
        "source",
        "flops_per_token",
        "attn_flops_per_pair",
        "peak_flops",
        "attn_flops_per_s",
        "weight_bytes",
        "kv_bytes_per_token",
        "mem_bandwidth",
        "overhead_s",
        "host_bandwidth",
    }
    prof = profiles.load(str(out))  # the twin's own loader and validation
    assert prof.name == "tiny-cpu"
    assert prof.flops_per_token == TINY.flops_per_token
    assert prof.weight_bytes == TINY.weight_bytes
    assert prof.kv_bytes_per_token == TINY.kv_bytes_per_token
    assert prof.peak_flops > 0 and prof.mem_bandwidth > 0 and prof.host_bandwidth == 0
    model = cost.CostModel(prof)
    assert model.pass_time(128, cost.chunk_pairs(0, 128), 0) > 0
    meas = json.loads((tmp_path / "tiny.measurements.json").read_text())
    assert meas["ridge_tokens_model"] == model.ridge_tokens()
    assert meas["prefill"]["chunks"] == [8, 32, 128, 512]
    assert len(meas["decode"]["seconds"]) == 3 and all(t > 0 for t in meas["decode"]["seconds"])
