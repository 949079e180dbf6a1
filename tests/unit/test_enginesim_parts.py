"""The engine simulator's pure parts: request bodies, setting validation, faults, flags,
and the twin driven by an injected clock (no sockets, no sleeps)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.enginesim import admin, bodies, driver, flags, load
from slipstream.enginesim.clock import Clock
from slipstream.enginesim.pod import SimPod, engine_config
from slipstream.sim import profiles
from slipstream.sim.policies import Setting
from slipstream.sim.workload import Request


def parse(*argv: str, env: dict[str, str] | None = None) -> flags.SimConfig:
    return flags.parse(list(argv), env or {})


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


def trace_body(**extra: object) -> dict:
    return {"prompt": "x", "slipstream": {"prompt_tokens": 1200, "blocks": [7, 8, 9],
                                          "block_sizes": [512, 512, 176], **extra}}


def test_warm_blocks_count_leading_trace_blocks_and_default_to_none() -> None:
    assert bodies.completion(trace_body()).warm_blocks == 0
    for warm in (0, 2, 3):
        assert bodies.completion(trace_body(warm_blocks=warm)).warm_blocks == warm
    assert bodies.chat({"messages": [{"role": "user", "content": "hi"}], **{"slipstream": trace_body(
        warm_blocks=1)["slipstream"]}}).warm_blocks == 1


@pytest.mark.parametrize("warm", [-1, 4, True, 1.0, "2", None, [1]])
def test_a_bad_warm_blocks_is_refused_naming_the_field(warm: object) -> None:
    with pytest.raises(bodies.BodyError, match=r"slipstream\.warm_blocks: must be an integer in 0\.\.len\(blocks\) \(3\)"):
        bodies.completion(trace_body(warm_blocks=warm))


def test_warm_blocks_without_blocks_is_refused() -> None:
    with pytest.raises(bodies.BodyError, match=r"slipstream\.warm_blocks: .*give blocks and block_sizes"):
        bodies.completion({"prompt": "x", "slipstream": {"prompt_tokens": 100, "warm_blocks": 1}})


def test_the_load_generator_sends_warm_blocks_and_the_simulator_reads_them_back() -> None:
    req = Request("r", "t", 0.0, 1200, 5, (7, 8, 9), (512, 512, 176), warm_blocks=2)
    for prompt in ("field", "words"):
        body = load.body_of(req, "m", prompt)
        assert body["slipstream"]["warm_blocks"] == 2
        inc = bodies.completion(json.loads(json.dumps(body)))
        assert (inc.blocks, inc.block_sizes, inc.warm_blocks, inc.prompt_tokens) == (
            req.blocks, req.block_sizes, 2, 1200)
    cold = bodies.completion(load.body_of(replace(req, warm_blocks=0), "m", "field"))
    assert cold.warm_blocks == 0


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
    assert admin.faults_of({"ttft_multiplier_at_threshold": 0}, f).ttft_multiplier_at_threshold == 0
    for wrong in (-1, 2.5, True, "0"):
        with pytest.raises(bodies.BodyError, match="ttft_multiplier_at_threshold"):
            admin.faults_of({"ttft_multiplier_at_threshold": wrong}, f)


def test_flags_validate_and_read_the_admin_key_from_file_or_env(tmp_path: Path) -> None:
    assert parse(env={"SLIPSTREAM_ADMIN_API_KEY": "e"}).admin_api_key == "e"
    key = tmp_path / "key"
    key.write_text("from-file\n")
    assert parse("--admin-api-key-file", str(key), env={"SLIPSTREAM_ADMIN_API_KEY": "e"}).admin_api_key == "from-file"
    assert parse("--admin-api-key", "argv").admin_api_key == "argv"
    assert parse("--admin-api-key", "argv", env={"SLIPSTREAM_ADMIN_API_KEY": "e"}).admin_api_key == "e"
    key.write_text("")
    with pytest.raises(flags.FlagError, match="is empty"):
        parse("--admin-api-key-file", str(key))
    with pytest.raises(flags.FlagError, match="--time-scale"):
        parse("--time-scale", "0")
    with pytest.raises(flags.FlagError, match="not an order of SGLang 0.5.23"):
        parse("--schedule-policy", "lof")
    # The release decides the orders: 0.5.23's own are refused on 0.5.18, at start and at run time.
    assert parse("--schedule-policy", "hrrn").sglang_version == "0.5.23"
    with pytest.raises(flags.FlagError, match="not an order of SGLang 0.5.18"):
        parse("--schedule-policy", "shortest-prefill-first", "--sglang-version", "0.5.18")
    assert parse(env={flags.SIM_VERSION_ENV: "0.5.18"}).sglang_version == "0.5.18"
    with pytest.raises(flags.FlagError, match="--sglang-version"):
        parse("--sglang-version", "latest")
    assert "0.5.18" in (flags.policy_error("hrrn", "0.5.18") or "")
    assert flags.policy_error("hrrn", "0.5.23") is None
    env = {"T": "2048", "MODE": "floor"}
    assert flags.expand_env(["--long-prefill-token-threshold", "$(T)", "--x=$(MODE)-$(UNSET)", "$$(T)"],
                            env) == ["--long-prefill-token-threshold", "2048", "--x=floor-$(UNSET)", "$(T)"]
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


def test_the_pods_twin_places_warm_blocks_in_its_cache_on_arrival() -> None:
    wall = [0.0]
    pod = SimPod(parse(), Clock(1.0, wall=lambda: wall[0]))
    warm = pod.submit(bodies.completion(trace_body(warm_blocks=2)), {})
    cold = pod.submit(bodies.completion({"prompt": "x", "slipstream": {
        "prompt_tokens": 1200, "blocks": [17, 18, 19], "block_sizes": [512, 512, 176]}}), {})
    wall[0] = 100.0
    pod.step()
    assert warm.first.is_set() and cold.first.is_set()
    assert (warm.job.cached, cold.job.cached) == (1024, 0), "the two warm blocks are a hit at admission"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(["prompt", "messages", "text", "input_ids", "max_tokens", "max_completion_tokens",
                          "stream", "stream_options", "slipstream", "sampling_params", "model"])
SLIP = st.dictionaries(st.sampled_from(["prompt_tokens", "prefix_id", "cached_tokens", "blocks",
                                        "block_sizes", "warm_blocks"]), JSON, max_size=4)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(body=st.dictionaries(FIELDS, JSON, max_size=5), slip=st.none() | SLIP)
def test_fuzzed_bodies_parse_or_raise_body_error(body: dict, slip: dict | None) -> None:
    """Whatever JSON object arrives, parsing gives a request or a BodyError, nothing else."""
    if slip is not None:
        body = {**body, "slipstream": slip}
    for parse in (bodies.completion, bodies.chat, bodies.generate):
        try:
            inc = parse(body)
        except bodies.BodyError:
            continue
        assert 1 <= inc.prompt_tokens <= bodies.MAX_TOKENS_LIMIT
        assert sum(inc.block_sizes) == inc.prompt_tokens and len(inc.blocks) == len(inc.block_sizes)
        assert 0 <= inc.warm_blocks <= len(inc.blocks)
        assert 1 <= inc.output_tokens <= bodies.MAX_TOKENS_LIMIT


@settings(max_examples=100, deadline=None, derandomize=True)
@given(args=st.dictionaries(st.sampled_from([*admin.LONG_PREFILL_KEYS, "other"]), JSON, max_size=4),
       faults=st.dictionaries(st.sampled_from(["ttft_multiplier", "admin", "metrics", "x"]), JSON, max_size=3))
def test_fuzzed_admin_bodies_validate_or_refuse(args: dict, faults: dict) -> None:
    live = admin.Live(0, "ceiling", "fcfs", 8)
    try:
        updates = admin.server_args_of({"server_args": args})
    except bodies.BodyError:
        updates = None
    if updates is not None:
        new, reason = admin.apply_updates(live, updates, 8192, 16)
        if reason is None:
            assert new.threshold % 16 == 0 and 0 <= new.threshold <= 8192 and new.max_partial_prefills >= 1
        else:
            assert new is live
    try:
        f = admin.faults_of(faults, admin.Faults())
    except bodies.BodyError:
        return
    assert f.ttft_multiplier > 0 and f.admin in admin.ADMIN_FAULTS and f.metrics in admin.METRICS_FAULTS


def test_the_partials_cap_reaches_the_twin_at_start_and_in_place() -> None:
    pod = SimPod(parse("--max-partial-prefills", "3"), Clock(1.0, wall=lambda: 0.0))
    assert pod.driver.config.max_partial_prefills == 3
    assert pod.set_state({"max_partial_prefills": 5}) is None
    assert pod.driver.config.max_partial_prefills == 5
    assert pod.set_state({"max_partial_prefills": 0}) is not None
    assert pod.driver.config.max_partial_prefills == 5


def test_a_new_tenants_size_class_series_start_at_zero_on_its_first_arrival() -> None:
    """Before its first token, every size class of a new tenant reads 0, so Prometheus'
    increase() counts the first giant's tokens (a series born holding them would add 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    from slipstream.api import buckets
    from slipstream.engine import metrics as names
    from slipstream.enginesim.metrics import EngineMetrics

    def samples(m: EngineMetrics) -> dict[tuple[str, str, str], float]:
        text = m.exposition().decode()
        return {(s.name, s.labels.get(names.SIZE_CLASS_LABEL, ""), s.labels.get(names.CACHE_LABEL, "")): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.labels.get("tenant") == "code"}  # fmt: skip

    m = EngineMetrics("m", ("tenant",))
    assert not samples(m)
    m.arrived({"tenant": "code"})
    before = samples(m)
    tokens = names.PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL
    for cls in buckets.SIZE_CLASS_NAMES:
        assert before[(tokens, cls, "uncached")] == 0
        assert before[(names.TTFT_BY_SIZE_CLASS_SECONDS + "_count", cls, "")] == 0
    m.first_token({"tenant": "code"}, True, 9.0, prompt_tokens=180_000)
    after = samples(m)
    assert after[(tokens, "le300k", "uncached")] == 180_000
    assert after[(names.TTFT_BY_SIZE_CLASS_SECONDS + "_count", "le300k", "")] == 1
