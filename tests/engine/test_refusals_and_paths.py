"""What the patch refuses at start-up (and on /set_internal_state), how T relates to C
under DP attention, and the ignore_eos admission path with the radix cache disabled."""

from __future__ import annotations

from types import SimpleNamespace

import harness as h
import pytest
from sglang.srt.configs import NemotronHConfig, Qwen3NextConfig
from sglang.srt.managers import long_prefill as lp
from sglang.srt.server_args import ServerArgs

TUNED = {"long_prefill_token_threshold": 2048}


def args(**kw):
    return ServerArgs(model_path="dummy", chunked_prefill_size=8192, page_size=16, **kw)


def swa_model(arch):
    return SimpleNamespace(is_hybrid_swa=True, hf_config=SimpleNamespace(architectures=[arch]))


def mamba_model(config):
    return SimpleNamespace(is_hybrid_swa=False, hf_config=config, is_draft_model=False)


@pytest.mark.parametrize(
    "arch",
    [
        "DeepseekV4ForCausalLM",
        "GptOssForCausalLM",
        "Llama4ForConditionalGeneration",
        "Gemma4ForCausalLM",
    ],
)
def test_hybrid_swa_models_are_refused_naming_the_family_and_the_flag(arch):
    a = args(**TUNED)
    h.set_model_config(a, swa_model(arch))  # what ServerArgs resolves for a real model
    with pytest.raises(ValueError) as e:
        lp.check_long_prefill_server_args(a)
    msg = str(e.value)
    assert arch in msg and "hybrid sliding-window" in msg
    assert "--long-prefill-token-threshold 0" in msg


@pytest.mark.parametrize("config", [NemotronHConfig, Qwen3NextConfig])
def test_mamba_and_hybrid_linear_models_are_refused(config):
    a = args(schedule_policy="srpt")
    h.set_model_config(a, mamba_model(config()))
    with pytest.raises(ValueError, match="mamba / hybrid linear-attention"):
        lp.check_long_prefill_server_args(a)


@pytest.mark.parametrize(
    "kw, what",
    [
        ({"enable_hierarchical_cache": True}, "HiCache (--enable-hierarchical-cache)"),
        ({"enable_mixed_chunk": True}, "mixed chunking (--enable-mixed-chunk)"),
    ],
)
def test_hicache_and_mixed_chunking_are_refused(kw, what):
    with pytest.raises(ValueError, match=what.replace("(", r"\(").replace(")", r"\)")):
        lp.check_long_prefill_server_args(args(**TUNED, **kw))


def test_stock_settings_start_with_any_model_family():
    a = args()
    h.set_model_config(a, swa_model("GptOssForCausalLM"))
    lp.check_long_prefill_server_args(a)  # T = 0, fcfs: the stock engine, no refusal
    assert (
        lp.model_family_reason(
            SimpleNamespace(is_hybrid_swa=False, hf_config=SimpleNamespace(architectures=["X"]))
        )
        is None
    )


def test_run_time_update_is_refused_for_a_hybrid_swa_model():
    eng = h.make_engine()
    h.set_model_config(eng.s.server_args, swa_model("GptOssForCausalLM"))
    out = h.set_internal_state(eng, **TUNED)
    assert not out.updated and "hybrid sliding-window" in out.reason
    assert eng.s.long_prefill_token_threshold == 0


def test_dp_attention_t_is_per_rank_and_at_most_c_over_dp():
    a = ServerArgs(
        model_path="dummy",
        chunked_prefill_size=8192,
        enable_dp_attention=True,
        dp_size=4,
        tp_size=4,
        long_prefill_token_threshold=4096,
    )
    h.divide_chunk_by_dp(a)  # SGLang's own division of C by the DP size
    assert h.resolved(a).chunked_prefill_size == 2048
    with pytest.raises(ValueError) as e:
        lp.check_long_prefill_server_args(a)
    assert "must be <= chunked_prefill_size 2048" in str(e.value)
    assert "each of the 4 DP ranks" in str(e.value)
    a.long_prefill_token_threshold = 1024
    lp.check_long_prefill_server_args(a)


@pytest.mark.parametrize("value", [0, -1, 2.5, "8"])
def test_max_partial_prefills_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="max_partial_prefills must be an integer >= 1"):
        lp.check_long_prefill_server_args(args(max_partial_prefills=value))


def test_ignore_eos_with_the_radix_cache_off_honours_t_and_tracks_partials():
    # add_one_req_ignore_eos: stock took the whole budget and set only the single
    # chunked request, so a second truncated request dropped out of tracking.
    eng = h.make_engine(chunked_prefill_size=8192, threshold=2048, radix_cache=False)
    assert eng.s.tree_cache.disable
    for r in "ABC":
        eng.add(30_000, rid=r, ignore_eos=True)
    eng.add(500, rid="s", ignore_eos=True)
    assert eng.step() == {"A": 2048, "B": 2048, "C": 2048, "s": 500}
    assert [r.rid for r in eng.s.partial_reqs] == ["A", "B", "C"]
    assert eng.step() == {"A": 2048, "B": 2048, "C": 2048}
    eng.run_to_completion()
    assert sum(a.get("A", 0) for a in eng.rounds) == 30_000
    assert eng.kv_free() == eng.kv_free_at_start and eng.slots_free() == eng.slots_free_at_start


def test_ignore_eos_with_the_radix_cache_off_reserves_kv():
    eng = h.make_engine(
        chunked_prefill_size=8192, threshold=2048, radix_cache=False, kv_tokens=40_000
    )
    for r in "ABC":
        eng.add(30_000, rid=r, ignore_eos=True)
    assert eng.step() == {"A": 2048}  # B would not fit beside A's reserved remainder
    for _ in range(200):
        if not eng.busy():
            break
        assert eng.step()
    assert not eng.busy()
    assert eng.kv_free() == eng.kv_free_at_start and eng.slots_free() == eng.slots_free_at_start
