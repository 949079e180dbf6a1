"""The calibration probe (engine_image/calibrate/probe.py) on CPU with tiny shapes.

The code path is the one a GPU run takes (except the CUDA-graph capture of decode, which
needs CUDA); no GPU was lent to this project so far, so these are its only runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO

sys.path.insert(0, str(REPO / "engine_image/calibrate"))
import probe  # noqa: E402

from slipstream.sim import cost, profiles  # noqa: E402

TINY = probe.Shape(
    hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=128, dtype="float32"
)
TINY_MOE = probe.Shape(
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    head_dim=16,
    intermediate=32,
    dtype="float32",
    experts=8,
    active_experts=2,
    vocab=100,
)


def test_prefill_fit_recovers_known_coefficients_over_chunk_and_cached_context():
    truth = (0.002, 3e-6, 4e-10)
    points = [
        (c, s, truth[0] + c * truth[1] + probe.pairs(c, s) * truth[2])
        for c in (16, 64, 256, 1024, 4096)
        for s in (0, 2048, 16384)
    ]
    fit = probe.fit_prefill(points)
    assert fit["overhead_s"] == pytest.approx(truth[0], rel=1e-6)
    assert fit["linear_s_per_token"] == pytest.approx(truth[1], rel=1e-6)
    assert fit["attn_s_per_pair"] == pytest.approx(truth[2], rel=1e-6)
    assert probe.pairs(4, 10) == cost.chunk_pairs(10, 4) == 4 * 10 + 10


def test_prefill_fit_drops_memory_bound_points():
    # below 512 tokens the pass is a memory floor of 10 ms; above it compute-bound
    truth = (0.001, 2e-5, 0.0)
    points = [
        (c, 0, max(0.010, truth[0] + c * truth[1])) for c in (16, 64, 128, 1024, 2048, 4096, 8192)
    ]
    fit = probe.fit_prefill(points, weights_s=0.010, kv_s=0.0)
    assert fit["linear_s_per_token"] == pytest.approx(truth[1], rel=1e-6)
    assert fit["overhead_s"] == pytest.approx(truth[0], rel=1e-4)
    assert fit["points_used"] == 4


def test_fits_never_go_negative():
    fit = probe.fit_decode([1, 2, 4, 8], [0.010, 0.0099, 0.0098, 0.0097])
    assert fit["s_per_request"] == 0.0
    assert fit["step_s_at_zero_batch"] == pytest.approx(0.00985)
    fit = probe.fit_prefill([(10, 0, 1.0), (20, 0, 2.0), (40, 0, 4.0)])
    assert fit["overhead_s"] >= 0 and fit["attn_s_per_pair"] >= 0
    assert fit["linear_s_per_token"] == pytest.approx(0.1)


def test_knee_is_where_the_pass_stops_being_a_fixed_cost():
    assert probe.measured_knee([64, 128, 256, 512], [1.0, 1.1, 1.6, 3.0]) == 256
    assert probe.measured_knee([64, 128], [1.0, 1.1]) is None


def test_shape_arithmetic_dense_and_moe():
    s = TINY
    per_layer = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64 + 3 * 64 * 128
    assert s.params_per_layer == s.active_params_per_layer == per_layer
    assert s.flops_per_token == 2 * per_layer * 3
    assert s.attn_flops_per_pair == 4 * 3 * 4 * 16
    assert s.weight_bytes == per_layer * 3 * 4
    assert s.kv_bytes_per_token == 3 * 2 * 2 * 16 * 4
    m = TINY_MOE
    attn = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64
    expert = 3 * 64 * 32
    assert m.params_per_layer == attn + 8 * expert + 8 * 64  # every expert + router
    assert m.active_params_per_layer == attn + 2 * expert + 8 * 64  # K experts + router
    assert m.flops_per_token == 2 * (attn + 2 * expert + 8 * 64) * 2
    assert m.weight_bytes == ((attn + 8 * expert + 8 * 64) * 2 + 100 * 64) * 4
    assert m.routed_expert_bytes == 8 * expert * 2 * 4  # the router is read by every pass
    assert s.routed_expert_bytes == 0
    with pytest.raises(ValueError):
        probe.Shape(64, 2, 6, 4, 16, 128)  # heads not a multiple of kv_heads
    with pytest.raises(ValueError, match="active_experts"):
        probe.Shape(64, 2, 4, 2, 16, 32, experts=8, active_experts=9)


def test_real_model_shapes():
    llama, _ = probe.MODELS["llama3-8b"]
    assert 7.4e9 < llama.params_per_layer * llama.layers + 2 * llama.vocab * llama.hidden < 8.1e9
    qwen, _ = probe.MODELS["qwen3-30b-a3b"]
    total = qwen.params_per_layer * qwen.layers + 2 * qwen.vocab * qwen.hidden
    active = qwen.active_params_per_layer * qwen.layers + 2 * qwen.vocab * qwen.hidden
    assert 29e9 < total < 32e9 and 3.0e9 < active < 3.6e9  # "30B-A3B"


def test_chunk_attends_to_its_cached_prefix_and_causally_to_itself():
    torch.manual_seed(1)
    s = TINY
    layer = probe.Layer(s, "cpu")
    n, cached = 3, 5
    x = torch.randn(n, s.hidden)
    pk, pv = (
        torch.randn(s.kv_heads, cached, s.head_dim),
        torch.randn(s.kv_heads, cached, s.head_dim),
    )
    buf = (
        torch.cat([pk, torch.full((s.kv_heads, n, s.head_dim), 99.0)], 1),
        torch.cat([pv, torch.full((s.kv_heads, n, s.head_dim), 99.0)], 1),
    )
    with torch.inference_mode():
        got = layer(x, n, buf, None)
        q, k, v = F.linear(F.rms_norm(x, (s.hidden,)), layer.qkv).split([64, 32, 32], dim=-1)
        q = q.view(n, s.heads, s.head_dim).transpose(0, 1)
        k = torch.cat([pk, k.view(n, s.kv_heads, s.head_dim).transpose(0, 1)], 1).repeat_interleave(
            2, 0
        )
        v = torch.cat([pv, v.view(n, s.kv_heads, s.head_dim).transpose(0, 1)], 1).repeat_interleave(
            2, 0
        )
        scores = q @ k.transpose(1, 2) / s.head_dim**0.5
        allowed = torch.arange(cached + n)[None, :] <= (cached + torch.arange(n))[:, None]
        att = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
        h = x + F.linear(att.transpose(0, 1).reshape(n, -1), layer.o)
        gate, up = F.linear(F.rms_norm(h, (s.hidden,)), layer.gate_up).chunk(2, dim=-1)
        want = h + F.linear(F.silu(gate) * up, layer.down)
    assert torch.allclose(got, want, atol=1e-5)


def test_moe_decode_touches_only_the_experts_its_tokens_use():
    layer = probe.Layer(TINY_MOE, "cpu")
    calls = []
    real_bmm = torch.bmm

    def spy(a, b):
        calls.append(b.shape[0])
        return real_bmm(a, b)

    with torch.inference_mode():
        torch.bmm = spy
        try:
            layer(torch.randn(1, 64), 0, None, (torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)))
            layer(torch.randn(64, 64), 64, None, None)
        finally:
            torch.bmm = real_bmm
    assert calls == [2, 2, 8, 8]  # one token x 2 active experts; 64 tokens touch all 8


def run_probe(tmp_path, *extra: str) -> tuple[dict, dict, dict]:
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
            "--cached",
            "0,256",
            "--batches",
            "1,4,16",
            "--contexts",
            "32,128",
            "--mixed",
            "64:4:64",
            "--repeats",
            "2",
            "--copy-mib",
            "8",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert rc == 0
    return (
        json.loads(out.read_text()),
        json.loads((tmp_path / "tiny.measurements.json").read_text()),
        json.loads((tmp_path / "tiny.comparison.json").read_text()),
    )


def test_probe_writes_a_profile_the_twin_loads_and_compares_every_point(tmp_path, capsys):
    data, meas, comp = run_probe(tmp_path)
    known = {f.name for f in fields(profiles.Profile)}
    assert set(data) <= known
    assert {
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
    } <= set(data)
    prof = profiles.load(str(tmp_path / "tiny.json"))  # the twin's own loader and validation
    assert prof.name == "tiny-cpu"
    assert prof.flops_per_token == TINY.flops_per_token
    assert prof.weight_bytes == TINY.weight_bytes
    assert prof.kv_bytes_per_token == TINY.kv_bytes_per_token
    assert prof.peak_flops > 0 and prof.mem_bandwidth > 0 and prof.host_bandwidth == 0
    # every point measured: 4 chunks x 2 cached, 3 batches x 2 contexts, 1 mixed
    kinds = [p["kind"] for p in comp["points"]]
    assert kinds.count("prefill") == 8 and kinds.count("decode") == 6 and kinds.count("mixed") == 1
    model = cost.CostModel(prof)
    for p in comp["points"]:
        assert p["measured_s"] > 0
        assert p["predicted_s"] == pytest.approx(
            probe.predict(model, p["kind"], p["tokens"], p["pairs"], p["kv_read"])
        )
        assert p["error_pct"] == pytest.approx(100 * (p["predicted_s"] / p["measured_s"] - 1))
    cached = {(p["chunk"], p["cached"]) for p in comp["points"] if p["kind"] == "prefill"}
    assert (512, 256) in cached
    assert (
        next(
            p
            for p in comp["points"]
            if p["kind"] == "prefill" and p["chunk"] == 8 and p["cached"] == 256
        )["pairs"]
        == 8 * 256 + 36
    )
    assert comp["within_10pct"] == all(abs(p["error_pct"]) <= 10 for p in comp["points"])
    assert set(comp["max_abs_error_pct"]) == {"prefill", "decode", "mixed"}
    assert meas["ridge_tokens_model"] == model.ridge_tokens()
    assert "max |error|" in capsys.readouterr().out
    # the per-kind overheads, where the twin's format has them
    for kind in ("decode", "mixed"):
        if f"{kind}_overhead_s" in known:
            assert (
                data[f"{kind}_overhead_s"] >= 0 and "median over" in data[f"{kind}_overhead_source"]
            )
        else:
            assert f"{kind}_overhead_s" in comp["twin_fields_not_known"]


def test_probe_runs_a_moe_shape_and_skips_decode_points_over_the_cache_limit(tmp_path):
    out = tmp_path / "moe.json"
    assert (
        probe.main(
            [
                "--name",
                "tiny-moe",
                "--hidden",
                "64",
                "--layers",
                "2",
                "--heads",
                "4",
                "--kv-heads",
                "2",
                "--head-dim",
                "16",
                "--intermediate",
                "32",
                "--experts",
                "8",
                "--active-experts",
                "2",
                "--vocab",
                "100",
                "--dtype",
                "float32",
                "--device",
                "cpu",
                "--chunks",
                "16,64,256",
                "--cached",
                "0",
                "--batches",
                "1,2",
                "--contexts",
                "16,4096",
                "--mixed",
                "",
                "--max-cache-gib",
                "0.0001",
                "--repeats",
                "1",
                "--copy-mib",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    prof = profiles.load(str(out))
    assert prof.flops_per_token == TINY_MOE.flops_per_token
    # the touched-experts fields, so the twin charges a decode of B only the experts it uses
    assert prof.routed_expert_bytes == TINY_MOE.routed_expert_bytes
    assert (prof.routed_experts, prof.experts_per_token) == (8, 2)
    model = cost.CostModel(prof)
    dense = prof.weight_bytes - prof.routed_expert_bytes
    assert model.weights_by_tokens[1] * prof.mem_bandwidth == pytest.approx(
        dense + prof.routed_expert_bytes * 2 / 8
    )
    meas = json.loads((tmp_path / "moe.measurements.json").read_text())
    # one layer's KV at B=2, c=4096: 2 * 4096 * 2 * 2 * 16 * 4 bytes = 2 MiB > 0.0001 GiB
    assert any("B=2 c=4096" in line for line in meas["skipped"])
    assert {(p["batch"], p["context"]) for p in meas["points"] if p["kind"] == "decode"} == {
        (1, 16),
        (2, 16),
    }


def test_model_presets_need_no_dimensions_and_bad_calls_fail(capsys):
    with pytest.raises(SystemExit):
        probe.main(["--hidden", "64", "--out", "x.json"])
    assert "missing" in capsys.readouterr().err


def test_refit_redoes_the_fits_from_the_measurements_file_alone(tmp_path):
    """A refit (no device) of a run's measurements gives that run's profile: the same
    numbers, the measured points untouched, the refit said in the source."""
    data, meas, comp = run_probe(tmp_path)
    refit_out = tmp_path / "again.json"
    assert (
        probe.main(["--refit", str(tmp_path / "tiny.measurements.json"), "--out", str(refit_out)])
        == 0
    )
    again = json.loads(refit_out.read_text())
    assert {k: v for k, v in again.items() if k != "source"} == {
        k: v for k, v in data.items() if k != "source"
    }
    assert "--refit" in again["source"] and "--refit" not in data["source"]
    comp_again = json.loads((tmp_path / "again.comparison.json").read_text())
    assert [p["measured_s"] for p in comp_again["points"]] == [
        p["measured_s"] for p in comp["points"]
    ]
    assert [p["predicted_s"] for p in comp_again["points"]] == pytest.approx(
        [p["predicted_s"] for p in comp["points"]]
    )
    assert comp_again["refitted"] and "refitted" not in comp


def test_refit_refuses_measurements_that_do_not_say_how_they_were_run(tmp_path):
    _, meas, _ = run_probe(tmp_path)
    del meas["run"]["grid"]
    with pytest.raises(ValueError, match="grid"):
        probe.refit(meas, "old.measurements.json")
