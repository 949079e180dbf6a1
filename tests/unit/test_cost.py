"""The roofline at seed 003's numbers gives the explainer's own figures."""

from __future__ import annotations

import pytest

from slipstream.sim import profiles
from slipstream.sim.cost import CostModel, chunk_pairs


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
