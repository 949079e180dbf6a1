"""The engine simulator's pure parts: request bodies, setting validation, faults, flags,
and the twin driven by an injected clock (no sockets, no sleeps)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from slipstream.enginesim import admin, bodies, driver, flags
from slipstream.enginesim.clock import Clock
from slipstream.enginesim.pod import SimPod, engine_config
from slipstream.sim import profiles
from slipstream.sim.policies import Setting
from slipstream.sim.workload import Request


def parse(*argv: str, env: dict[str, str] | None = None) -> flags.SimConfig:
    p = argparse.ArgumentParser()
    flags.add_arguments(p)
    return flags.config_from(p.parse_args(list(argv)), env or {})


def test_prompt_sizes_from_text_ids_chat_and_the_slipstream_field() -> None:
    assert bodies.completion({"prompt": "a b  c\nd"}).prompt_tokens == 4
    assert bodies.completion({"prompt": [[1, 2, 3]]}).prompt_tokens == 3
    assert bodies.completion({"prompt": "a", "max_tokens": 0}).output_tokens == 1
    assert bodies.completion({"prompt": "a"}).output_tokens == bodies.DEFAULT_MAX_TOKENS
    chat = bodies.chat({"messages": [{"role": "user", "content": "one two"}], "max_completion_tokens": 9})
    assert (chat.prompt_tokens, chat.output_tokens) == (3, 9)
    gen = bodies.generate({"input_ids": [5] * 10})
    assert (gen.prompt_tokens, gen.output_tokens) == (10, bodies.DEFAULT_MAX_NEW_TOKENS)
    stated = bodies.completion({"prompt": "x", "slipstream": {"prompt_tokens": 5000, "prefix_id": "doc",
                                                              "cached_tokens": 4000}})
    assert stated.prompt_tokens == 5000 and stated.block_sizes == (4000, 1000) and stated.warm_blocks == 0
    again = bodies.completion({"prompt": "y", "slipstream": {"prompt_tokens": 4500, "prefix_id": "doc",
                                                             "cached_tokens": 4000}})
    assert again.blocks[0] == stated.blocks[0] and again.blocks[1] != stated.blocks[1]
    warm = bodies.completion({"prompt": "x", "slipstream": {"prompt_tokens": 100, "cached_tokens": 60}})
    assert warm.warm_blocks == 1 and warm.block_sizes == (60, 40)
    trace = bodies.completion({"prompt": "x", "slipstream": {"prompt_tokens": 700, "blocks": [7, 8],
                                                             "block_sizes": [512, 188]}})
    assert trace.blocks == (7, 8)
    with pytest.raises(bodies.BodyError, match="add up to 701"):
        bodies.completion({"prompt": "x", "slipstream": {"prompt_tokens": 700, "blocks": [7, 8],
                                                         "block_sizes": [512, 189]}})


def test_equal_prompt_prefixes_share_block_ids() -> None:
    shared = " ".join(f"w{i}" for i in range(600))
    a = bodies.completion({"prompt": shared + " tail-a"})
    b = bodies.completion({"prompt": shared + " tail-b other"})
    n = 600 // bodies.TEXT_BLOCK_TOKENS
    assert a.blocks[:n] == b.blocks[:n] and a.blocks[n] != b.blocks[n]
    assert sum(a.block_sizes) == a.prompt_tokens


def test_tenant_labels_keep_only_allowed_keys_and_ignore_garbage() -> None:
    assert bodies.tenant_labels('{"tenant": "acme", "team": "x"}', ("tenant",)) == {"tenant": "acme"}
    assert bodies.tenant_labels("not json", ("tenant",)) == {"tenant": ""}
    assert bodies.tenant_labels('["tenant"]', ("tenant",)) == {"tenant": ""}
    assert bodies.tenant_labels('{"tenant": "a"}', ()) == {}


def test_setting_updates_are_all_or_nothing() -> None:
    live = admin.Live(4096, "ceiling", "fcfs", 8)
    new, reason = admin.apply_updates(live, {"long_prefill_token_threshold": 2048.0, "schedule_policy": "srpt"},
                                      8192, 64)
    assert reason is None and new == admin.Live(2048, "ceiling", "srpt", 8)
    same, reason = admin.apply_updates(live, {"long_prefill_token_threshold": 2048, "long_prefill_mode": "x"},
                                       8192, 64)
    assert same is live and reason is not None and "long_prefill_mode" in reason
    assert admin.apply_updates(live, {"max_partial_prefills": 2}, 8192, 64)[0].max_partial_prefills == 2


def test_faults_update_only_the_fields_given() -> None:
    f = admin.faults_of({"admin": "timeout"}, admin.Faults())
    f = admin.faults_of({"ttft_multiplier": 3}, f)
    assert f == admin.Faults(ttft_multiplier=3.0, admin="timeout", metrics="ok")
    with pytest.raises(bodies.BodyError, match="ttft_multiplier"):
        admin.faults_of({"ttft_multiplier": float("nan")}, f)


def test_flags_validate_and_read_the_admin_key_from_file_or_env(tmp_path: Path) -> None:
    assert parse(env={"SLIPSTREAM_ADMIN_API_KEY": "e"}).admin_api_key == "e"
    key = tmp_path / "key"
    key.write_text("from-file\n")
    assert parse("--admin-api-key-file", str(key), env={"SLIPSTREAM_ADMIN_API_KEY": "e"}).admin_api_key == "from-file"
    key.write_text("")
    with pytest.raises(flags.FlagError, match="is empty"):
        parse("--admin-api-key-file", str(key))
    with pytest.raises(flags.FlagError, match="--time-scale"):
        parse("--time-scale", "0")
    with pytest.raises(flags.FlagError, match="not modelled by the twin"):
        parse("--schedule-policy", "lof")
    assert flags.ignored_flags(["--tp-size", "8", "--mem-fraction-static=0.8", "x"]) == [
        "--tp-size", "--mem-fraction-static"]


def test_the_twin_is_causal_under_the_driver() -> None:
    """A request's first token never moves once the twin clock has passed it."""
    cfg = parse()
    d = driver.make_driver(Setting(0), profiles.load(cfg.profile), engine_config(cfg))
    long = d.submit(Request("long", "t", 0.0, 60000, 2, (1,), (60000,)))
    d.advance(0.5)
    at = max(0.5, d.now_s)  # the twin takes arrivals from its clock on
    short = d.submit(Request("short", "t", at, 500, 2, (2,), (500,)))
    d.advance(100.0)
    first = long.first_token_s
    assert 0 < first <= short.first_token_s, "stock: the short prompt waits behind the long one"
    d.advance(200.0)
    assert long.first_token_s == first


def test_the_pump_releases_first_tokens_at_their_twin_time() -> None:
    wall = [0.0]
    cfg = parse("--tokenizer-metrics-allowed-custom-labels", "tenant", "--time-scale", "2")
    pod = SimPod(cfg, Clock(2.0, wall=lambda: wall[0]))
    inc = bodies.completion({"prompt": "x", "max_tokens": 3, "slipstream": {"prompt_tokens": 20000}})
    tracked = pod.submit(inc, {"tenant": "a"})
    before = 0.0
    for _ in range(100):  # jump the wall clock from one due time to the next
        due = pod.step()
        if tracked.first.is_set():
            break
        assert due < float("inf")
        before = pod.clock.now()
        wall[0] = due / 2
    f = tracked.job.first_token_s
    assert tracked.first.is_set() and before < f <= pod.clock.now()
    assert tracked.ttft_s == pytest.approx(f)
    wall[0] = 1000.0
    pod.step()
    assert tracked.done.is_set() and tracked.tokens_at(pod.clock.now()) == 3
    assert b'tenant="a"' in pod.scrape()
