"""The roofline at seed 003's numbers gives the explainer's own figures."""

from __future__ import annotations

import pytest

from slipstream.sim import profiles
from slipstream.sim.cost import DECODE, MIXED, PREFILL, CostModel, chunk_pairs


@pytest.fixture
def llama() -> CostModel:
    return CostModel(profiles.load("llama3-70b-4xa100"))


def test_decode_step_reads_the_weights_in_about_23_ms(llama):
    assert llama.pass_time(16, 16 * 4096, 16 * 512) == pytest.approx(0.023, rel=0.05)


def test_a_16k_prompt_alone_takes_about_1_84_s(llama):
    assert llama.solo_prefill_s(0, 16384, 8192) == pytest.approx(1.84, rel=0.02)


def test_256_prefill_plus_16_decode_tokens_is_a_30_ms_step(llama):
    t = llama.pass_time(256 + 16, chunk_pairs(4096, 256), 4096 + 16 * 512)
    assert t == pytest.approx(0.030, rel=0.05)


def test_the_ridge_is_about_200_prefill_tokens(llama):
    assert 180 <= llama.ridge_tokens() <= 220


def test_attention_makes_later_chunks_dearer():
    model = CostModel(profiles.load("kimi-k3-8xh200"))
    first = model.pass_time(8192, chunk_pairs(0, 8192), 0)
    late = model.pass_time(8192, chunk_pairs(500_000, 8192), 500_000)
    assert late > 3 * first


def test_chunk_pairs_adds_up_to_the_whole_prompt():
    whole = chunk_pairs(0, 10_000)
    assert chunk_pairs(0, 4000) + chunk_pairs(4000, 6000) == whole


def test_physical_attention_profile_says_why_the_explainer_is_optimistic():
    attn = CostModel(profiles.load("llama3-70b-4xa100-attn"))
    assert attn.solo_prefill_s(0, 16384, 8192) > 2.0


def test_every_shipped_profile_says_where_each_overhead_and_the_pool_come_from():
    for name in profiles.builtin_names():
        p = profiles.load(name)
        for field in ("overhead_source", "decode_overhead_source", "mixed_overhead_source",
                      "memory_source"):
            assert len(getattr(p, field)) > 20, (name, field)
        assert p.kv_pool_tokens and p.kv_pool_tokens > 100_000


def test_a_decode_step_on_kimi_grows_with_batch_and_a_prefill_pass_keeps_its_fitted_overhead():
    model = CostModel(profiles.load("kimi-k3-8xh200"))
    step = {b: model.pass_time(b, b * 4096, b * 4096, 0, DECODE) for b in (1, 8, 64)}
    assert step[1] < step[8] < step[64]  # more experts read, more KV
    assert 0.02 <= step[64] <= 0.05
    # a pass big enough to touch every expert: the kinds differ by their overheads only
    big = model.pass_time(8192, 0, 0, 0, PREFILL)
    assert big - model.pass_time(8192, 0, 0, 0, DECODE) == pytest.approx(0.09 - 0.0045)
    assert model.pass_time(8192, 0, 0, 0, MIXED) == model.pass_time(8192, 0, 0, 0, DECODE)


def test_a_dense_model_reads_every_weight_whatever_the_batch(llama):
    assert llama.pass_time(1, 0, 0, 0, DECODE) == llama.pass_time(64, 0, 0, 0, DECODE)


def test_a_profile_with_one_overhead_charges_it_to_every_kind_of_pass(tmp_path):
    import json

    data = json.loads(profiles.load("llama3-70b-4xa100-attn").to_json())
    legacy = {k: v for k, v in data.items() if k not in profiles.OPTIONAL_FIELDS}
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(legacy))
    p = profiles.load(str(path))
    assert p.decode_overhead_s == p.mixed_overhead_s == p.overhead_s == 0.002
    assert p.kv_pool_tokens is None  # no memory given: no pool limit


def test_a_pool_that_hbm_cannot_hold_is_refused(tmp_path):
    import json

    data = json.loads(profiles.load("kimi-k3-8xh200").to_json())
    data["weight_bytes"] = data["hbm_bytes"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="leaves no KV pool"):
        profiles.load(str(path))
