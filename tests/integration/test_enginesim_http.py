"""The engine simulator over real HTTP on 127.0.0.1: serving shapes, admin key, validation,
TTFT that follows the setting in force, SGLang metrics, faults, and refused bodies."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import pytest
from enginesim_util import ADMIN, KEY, sse_events, tenant, with_sim
from prometheus_client.parser import text_string_to_metric_families

from slipstream.api import buckets, models
from slipstream.engine import admin as admin_client
from slipstream.engine import metrics as names
from slipstream.enginesim import metrics as sim_metrics
from slipstream.enginesim import server

try:  # the OpenAI client's own response types, where the package is installed
    import openai.types as openai_types
    import openai.types.chat as openai_chat
except ImportError:  # pragma: no cover - depends on the environment
    openai_types = None
    openai_chat = None


def check_usage(usage: dict[str, Any], prompt: int, completion: int) -> None:
    assert usage["prompt_tokens"] == prompt
    assert usage["completion_tokens"] == completion
    assert usage["total_tokens"] == prompt + completion


def test_completion_shapes_streaming_and_not() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        body = {"model": "m", "prompt": "one two three four", "max_tokens": 5}
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200
            full = await r.json()
            assert float(r.headers[server.TTFT_HEADER]) > 0
        assert full["object"] == "text_completion" and full["model"] == "m"
        assert isinstance(full["id"], str) and isinstance(full["created"], int)
        [choice] = full["choices"]
        assert choice["index"] == 0 and choice["finish_reason"] == "length"
        assert len(choice["text"].split()) == 5
        check_usage(full["usage"], 4, 5)
        if openai_types is not None:
            openai_types.Completion.model_validate(full)

        body = {**body, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 200}
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            events = sse_events(await r.text())
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        usage_chunk = chunks.pop()
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 200
        assert len(chunks) >= 2, "tokens arrive over time, not in one piece"
        text = "".join(c["choices"][0]["text"] for c in chunks)
        assert len(text.split()) == 200
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
        assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
        if openai_types is not None:
            for c in events[:-1]:
                openai_types.Completion.model_validate(c)

    asyncio.run(with_sim(check, "--time-scale", "20"))


def test_chat_and_generate_shapes() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        messages = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
        async with s.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 3}) as r:
            full = await r.json()
        assert full["object"] == "chat.completion"
        msg = full["choices"][0]["message"]
        assert msg["role"] == "assistant" and len(msg["content"].split()) == 3
        assert full["usage"]["completion_tokens"] == 3
        if openai_chat is not None:
            openai_chat.ChatCompletion.model_validate(full)

        body = {"messages": messages, "max_tokens": 30, "stream": True}
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            events = sse_events(await r.text())
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert len(content.split()) == 30
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        if openai_chat is not None:
            for c in chunks:
                openai_chat.ChatCompletionChunk.model_validate(c)

        gen = {"input_ids": list(range(100)), "sampling_params": {"max_new_tokens": 7}}
        async with s.post(url + "/generate", json=gen) as r:
            out = await r.json()
        assert len(out["text"].split()) == 7
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == 100 and meta["completion_tokens"] == 7
        assert meta["finish_reason"] == {"type": "length", "length": 7} and meta["e2e_latency"] > 0
        async with s.post(url + "/generate", json={**gen, "stream": True}) as r:
            events = sse_events(await r.text())
        assert events[-1] == "[DONE]" and events[-2]["meta_info"]["completion_tokens"] == 7
        counts = [e["meta_info"]["completion_tokens"] for e in events[:-1]]
        assert counts == sorted(counts) and counts[0] >= 1

    asyncio.run(with_sim(check, "--time-scale", "20"))


def test_admin_endpoints_need_the_key_and_never_show_it() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        change = {"server_args": {"long_prefill_token_threshold": 2048}}
        async with s.post(url + "/set_internal_state", json=change) as r:
            assert r.status == 401
        async with s.post(url + "/set_internal_state", json=change,
                          headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with s.post(url + "/set_internal_state", json=change, headers=ADMIN) as r:
            assert r.status == 200 and (await r.json())["updated"] is True
        for path in ("/get_server_info", "/server_info"):  # open to any client, as SGLang's
            async with s.get(url + path) as r:
                assert r.status == 200
                text = await r.text()
            assert KEY not in text
            info = json.loads(text)
            # redacted as the patched engine redacts (tests/engine/test_http.py)
            assert info["admin_api_key"] == "<redacted>" and info["api_key"] is None
            assert info["internal_states"][0]["admin_api_key"] == "<redacted>"
            assert info["long_prefill_token_threshold"] == 2048
        async with s.get(url + "/health") as r:
            assert r.status == 200

    asyncio.run(with_sim(check))


def test_without_a_key_no_setting_can_change() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        change = {"server_args": {"long_prefill_token_threshold": 2048}}
        async with s.post(url + "/set_internal_state", json=change) as r:
            assert r.status == 403
            assert "SLIPSTREAM_ADMIN_API_KEY" in (await r.json())["error"]
        async with s.get(url + "/get_server_info") as r:  # nothing set: null, as the engine
            info = await r.json()
        assert info["admin_api_key"] is None and info["api_key"] is None

    asyncio.run(with_sim(check, key=None))


def test_prompts_over_the_kv_pool_are_refused_as_sglang_does() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.get(url + "/get_server_info", headers=ADMIN) as r:
            pool = (await r.json())["max_total_num_tokens"]
        assert pool == 50000
        body = {"prompt": "x", "max_tokens": 1, "slipstream": {"prompt_tokens": pool}}
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 400
            assert (await r.json())["message"].startswith(
                f"Input length ({pool} tokens) exceeds the maximum allowed length")
        # Under the pool but over what an idle engine can admit: the twin refuses it.
        for stream in (False, True):
            body = {"prompt": "x", "max_tokens": 1, "stream": stream, "slipstream": {"prompt_tokens": 49999}}
            async with s.post(url + "/v1/completions", json=body) as r:
                assert r.status == 400
                assert "cannot fit the engine's KV pool" in (await r.json())["message"]
        body = {"prompt": "x", "max_tokens": 1, "slipstream": {"prompt_tokens": 30000}}
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200

    asyncio.run(with_sim(check, "--time-scale", "50", "--max-total-tokens", "50000"))


def test_prompts_over_the_context_length_are_refused_as_sglang_does() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/v1/completions", json={"prompt": "a " * 100}) as r:
            assert r.status == 400
            assert (await r.json())["message"] == (
                "The input (100 tokens) is longer than the model's context length (100 tokens).")
        async with s.post(url + "/v1/completions", json={"prompt": "a " * 99}) as r:
            assert r.status == 200

    asyncio.run(with_sim(check, "--context-length", "100"))


def test_the_operators_admin_client_drives_the_simulator() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        client = admin_client.AdminClient(url, KEY)
        wanted = models.EngineSetting(threshold=1024, mode="floor", schedule_policy="srpt")
        assert await client.apply(wanted) == wanted
        with pytest.raises(admin_client.AdminError) as refused:
            await client.set_internal_state({"long_prefill_token_threshold": 1000})
        assert refused.value.status == 400 and "multiple of the page size 64" in refused.value.body
        assert admin_client.reported_setting(await client.get_server_info()) == wanted

    asyncio.run(with_sim(check, "--page-size", "64"))


@pytest.mark.parametrize(("version_args", "release"), [((), "0.5.23"), (("--sglang-version", "0.5.18"), "0.5.18")])
def test_the_simulator_reports_its_release_and_runs_only_its_orders(version_args: tuple[str, ...], release: str) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        client = admin_client.AdminClient(url, KEY)
        info = await client.get_server_info()
        assert admin_client.version_of(info) == f"{release}+slipstream-engine-sim"
        for order in ("hrrn", "shortest-prefill-first"):
            wanted = models.EngineSetting(threshold=2048, mode="ceiling", schedule_policy=order)
            if release == "0.5.23":
                assert await client.apply(wanted) == wanted, "0.5.23's own orders switch at run time"
            else:
                with pytest.raises(admin_client.AdminError) as refused:
                    await client.apply(wanted)
                assert refused.value.status == 400 and "(SGLang 0.5.18)" in refused.value.body
        # A request is served under the order in force.
        async with s.post(url + "/v1/completions", json={"prompt": "a " * 3000, "max_tokens": 2}) as r:
            assert r.status == 200

    asyncio.run(with_sim(check, *version_args))


@pytest.mark.parametrize(("args", "reason"), [
    ({"long_prefill_token_threshold": 100}, "must be a multiple of the page size 64"),
    ({"long_prefill_token_threshold": 16384}, "must be <= chunked_prefill_size 8192"),
    ({"long_prefill_token_threshold": -64}, "must be 0 (off) or positive"),
    ({"long_prefill_token_threshold": "big"}, "must be an integer"),
    ({"long_prefill_mode": "sideways"}, "long_prefill_mode must be one of ['ceiling', 'floor', 'reflex']"),
    ({"schedule_policy": "lof"}, "schedule_policy can be switched at run time among"),
    ({"max_partial_prefills": 0}, "max_partial_prefills must be an integer >= 1"),
    ({"long_prefill_reflex_hold_seconds": -1}, "long_prefill_reflex_hold_seconds must be a finite number >= 0"),
    ({"long_prefill_reflex_hold_seconds": "soon"}, "long_prefill_reflex_hold_seconds must be a finite number"),
    ({"long_prefill_token_threshold": 2048, "mem_fraction_static": 0.5}, "cannot be changed at run time"),
    ({"long_prefill_token_threshold": 2048, "long_prefill_mode": "nope"}, "long_prefill_mode must be"),
])
def test_refused_settings_say_why_and_change_nothing(args: dict[str, Any], reason: str) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/set_internal_state", json={"server_args": args}, headers=ADMIN) as r:
            assert r.status == 400
            body = await r.json()
        assert body["updated"] is False and reason in body["reason"]
        async with s.get(url + "/get_server_info", headers=ADMIN) as r:
            info = await r.json()
        assert (info["long_prefill_token_threshold"], info["long_prefill_mode"], info["schedule_policy"],
                info["max_partial_prefills"], info["long_prefill_reflex_hold_seconds"]) == (
            4096, "ceiling", "fcfs", 8, 3.0)

    asyncio.run(with_sim(check, "--page-size", "64", "--long-prefill-token-threshold", "4096"))


def test_reflex_mode_and_its_hold_are_set_in_place() -> None:
    # The patched engine's allowlist (engine_image/patches: LIVE_STATE_KEYS): the mode and
    # reflex mode's hold change without a restart and read back from /get_server_info.
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        args = {"long_prefill_mode": "reflex", "long_prefill_reflex_hold_seconds": 0.5}
        async with s.post(url + "/set_internal_state", json={"server_args": args}, headers=ADMIN) as r:
            assert r.status == 200, await r.text()
        async with s.get(url + "/get_server_info", headers=ADMIN) as r:
            info = await r.json()
        assert (info["long_prefill_mode"], info["long_prefill_reflex_hold_seconds"]) == ("reflex", 0.5)

    asyncio.run(with_sim(check, "--long-prefill-token-threshold", "4096"))


async def until_prefilling(url: str, s: aiohttp.ClientSession) -> None:
    """Poll (with a deadline) until the engine reports a prefill part-way through."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        async with s.get(url + "/get_server_info", headers=ADMIN) as r:
            if (await r.json())["num_partial_prefills"] >= 1:
                return
        assert asyncio.get_running_loop().time() < deadline, "no prefill started"
        await asyncio.sleep(0.002)


async def burst(url: str, s: aiohttp.ClientSession, tag: str) -> tuple[float, list[float]]:
    """One long cold prompt, then (once the engine is prefilling it) eight short ones:
    (long TTFT, short TTFTs)."""

    async def one(tokens: int) -> float:
        body = {"prompt": "x", "max_tokens": 2, "slipstream": {"prompt_tokens": tokens}}
        async with s.post(url + "/v1/completions", json=body, headers=tenant(tag)) as r:
            assert r.status == 200
            return float(r.headers[server.TTFT_HEADER])

    long = asyncio.create_task(one(60000))
    await until_prefilling(url, s)
    shorts = await asyncio.gather(*(one(500) for _ in range(8)))
    return await long, list(shorts)


def test_a_setting_change_changes_ttft_of_a_heterogeneous_burst() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        long_stock, short_stock = await burst(url, s, "stock")
        change = {"long_prefill_token_threshold": 1024, "schedule_policy": "srpt"}
        async with s.post(url + "/set_internal_state", json={"server_args": change}, headers=ADMIN) as r:
            assert r.status == 200
        long_tuned, short_tuned = await burst(url, s, "tuned")
        # Stock: the short prompts wait behind the long prefill, one chunk at a time.
        # Concurrent partial prefills in srpt order: the short ones overtake the long one.
        assert max(short_tuned) < long_tuned
        assert max(short_tuned) < min(short_stock) / 3
        async with s.get(url + "/metrics") as r:
            families = {f.name: f for f in text_string_to_metric_families(await r.text())}
        counts = {smp.labels["tenant"]: smp.value for smp in families[names.TTFT_SECONDS].samples
                  if smp.name.endswith("_count")}
        assert counts == {"stock": 9, "tuned": 9}

    asyncio.run(with_sim(check, "--time-scale", "10"))


def test_metrics_have_sglang_names_buckets_labels_and_the_patch_gauges() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        for name, n, stream in (("acme", 3, False), ("zeta", 2, True)):
            for _ in range(n):
                body = {"prompt": "a b c d e f", "max_tokens": 4, "stream": stream,
                        "slipstream": {"prompt_tokens": 2000, "prefix_id": f"doc-{name}", "cached_tokens": 1500}}
                async with s.post(url + "/v1/completions", json=body, headers=tenant(name)) as r:
                    await r.read()
        async with s.post(url + "/v1/completions", json={"prompt": "q", "max_tokens": 1},
                          headers={"x-custom-labels": "not json"}) as r:
            assert r.status == 200
        change = {"server_args": {"long_prefill_token_threshold": 2048, "long_prefill_mode": "floor"}}
        async with s.post(url + "/set_internal_state", json=change, headers=ADMIN) as r:
            assert r.status == 200
        async with s.get(url + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        ttft = families[names.TTFT_SECONDS]
        assert ttft.type == "histogram"
        bounds = sorted({float(smp.labels["le"]) for smp in ttft.samples if smp.name.endswith("_bucket")})
        assert bounds == [*buckets.TTFT_BOUNDS_S, math.inf]
        counts = {(smp.labels["tenant"], smp.labels["is_streaming"]): smp.value
                  for smp in ttft.samples if smp.name.endswith("_count")}
        assert counts == {("acme", "false"): 3, ("zeta", "true"): 2, ("", "false"): 1}
        uncached = families[names.UNCACHED_PROMPT_TOKENS]
        ubounds = sorted({float(smp.labels["le"]) for smp in uncached.samples if smp.name.endswith("_bucket")})
        assert ubounds == [*buckets.PROMPT_TOKENS, math.inf]
        usum = {smp.labels["tenant"]: smp.value for smp in uncached.samples if smp.name.endswith("_sum")}
        # The first request of each tenant computes the shared prefix; the later ones hit it.
        assert usum["acme"] < 3 * 2000 and usum["zeta"] < 2 * 2000
        cached = families[names.CACHED_TOKENS_TOTAL.removesuffix("_total")]
        assert sum(smp.value for smp in cached.samples if smp.name.endswith("_total")) > 0
        gauges = {(smp.name, smp.labels.get("mode") or smp.labels.get("policy")): smp.value
                  for fam in families.values() if fam.type == "gauge" for smp in fam.samples}
        assert gauges[(names.LONG_PREFILL_TOKEN_THRESHOLD, None)] == 2048
        assert gauges[(names.LONG_PREFILL_MODE, "floor")] == 1
        assert gauges[(names.LONG_PREFILL_MODE, "ceiling")] == 0
        assert gauges[(names.SCHEDULE_POLICY, "fcfs")] == 1
        assert gauges[(sim_metrics.MAX_PARTIAL_PREFILLS, None)] == 8
        assert 0 <= gauges[("sglang:token_usage", None)] <= 1
        for gauge in (names.NUM_QUEUE_REQS, names.NUM_RUNNING_REQS, names.NUM_PARTIAL_PREFILLS):
            assert (gauge, None) in gauges

    asyncio.run(with_sim(check, "--time-scale", "20"))


async def long_rounds(url: str, s: aiohttp.ClientSession) -> dict[str, float]:
    """``sglang:long_prefill_rounds_total`` by its ``capped`` label, from /metrics."""
    async with s.get(url + "/metrics") as r:
        families = {f.name: f for f in text_string_to_metric_families(await r.text())}
    family = families[names.LONG_PREFILL_ROUNDS_TOTAL.removesuffix("_total")]
    assert family.type == "counter"
    return {smp.labels[names.CAPPED_LABEL]: smp.value for smp in family.samples
            if smp.name == names.LONG_PREFILL_ROUNDS_TOTAL}


def test_the_reflex_round_counter_rises_with_capped_rounds() -> None:
    """reflex:4096 with no hold, C = 8192: a giant alone is prefilled in eight uncapped
    passes (60,000 tokens, 8,192 a pass); a giant with short requests arriving while it is
    prefilled gets capped passes, and uncapped ones again once they are served."""

    async def check(url: str, s: aiohttp.ClientSession) -> None:
        assert await long_rounds(url, s) == {"true": 0, "false": 0}  # both from 0
        body = {"prompt": "x", "max_tokens": 2, "slipstream": {"prompt_tokens": 60000}}
        async with s.post(url + "/v1/completions", json=body, headers=tenant("alone")) as r:
            assert r.status == 200
        assert await long_rounds(url, s) == {"true": 0, "false": 8}
        _, shorts = await burst(url, s, "mixed")
        assert len(shorts) == 8
        after = await long_rounds(url, s)
        assert after["true"] >= 1  # the passes that served a short one beside the giant
        assert after["false"] > 8  # the giant's first pass, and its passes after the shorts

    asyncio.run(with_sim(check, "--time-scale", "10", "--long-prefill-token-threshold", "4096",
                         "--long-prefill-mode", "reflex", "--long-prefill-reflex-hold-seconds", "0"))


def test_no_metrics_endpoint_without_enable_metrics() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.get(url + "/metrics") as r:
            assert r.status == 404 and (await r.json())["code"] == 404

    async def run() -> None:
        from enginesim_util import config

        cfg = config()
        running = await server.start(type(cfg)(**{**cfg.__dict__, "enable_metrics": False}))
        try:
            async with aiohttp.ClientSession() as s:
                await check(running.url, s)
        finally:
            await running.close()

    asyncio.run(run())


def test_faults_regress_ttft_break_admin_calls_and_garble_metrics() -> None:
    async def ttft(url: str, s: aiohttp.ClientSession) -> float:
        body = {"prompt": "x", "max_tokens": 1, "slipstream": {"prompt_tokens": 8000}}
        async with s.post(url + "/v1/completions", json=body) as r:
            return float(r.headers[server.TTFT_HEADER])

    async def fault(url: str, s: aiohttp.ClientSession, **body: Any) -> aiohttp.ClientResponse:
        async with s.post(url + "/slipstream/faults", json=body, headers=ADMIN) as r:
            await r.read()
            return r

    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/slipstream/faults", json={"admin": "error"}) as r:
            assert r.status == 401
        assert (await fault(url, s, ttft_multiplier=0)).status == 400
        assert (await fault(url, s, admin="sometimes")).status == 400
        assert (await fault(url, s, colour="red")).status == 400
        base = await ttft(url, s)
        assert (await fault(url, s, ttft_multiplier=4)).status == 200
        slow = await ttft(url, s)
        assert slow == pytest.approx(4 * base, rel=0.05)
        client = admin_client.AdminClient(url, KEY, timeout_seconds=0.5)
        await fault(url, s, admin="error")
        with pytest.raises(admin_client.AdminError) as failed:
            await client.apply(models.EngineSetting(threshold=2048))
        assert failed.value.status == 500
        await fault(url, s, admin="timeout")
        with pytest.raises(TimeoutError):
            await client.get_server_info()
        await fault(url, s, admin="refuse")
        with pytest.raises(aiohttp.ClientError):
            await client.get_server_info()
        await fault(url, s, metrics="garbage")
        async with s.get(url + "/metrics") as r:
            garbage = await r.text()
        with pytest.raises(ValueError):
            list(text_string_to_metric_families(garbage))
        await fault(url, s, metrics="error")
        async with s.get(url + "/metrics") as r:
            assert r.status == 500
        await fault(url, s, admin="ok", metrics="ok", ttft_multiplier=1)
        assert (await client.apply(models.EngineSetting(threshold=2048))).threshold == 2048
        assert (await client.apply(models.EngineSetting(threshold=0))).threshold == 0
        assert await ttft(url, s) == pytest.approx(base, rel=0.05)
        # Tied to a setting: slow only for requests arriving while the pod runs it.
        await client.apply(models.EngineSetting(threshold=2048))
        base_2048 = await ttft(url, s)
        await client.apply(models.EngineSetting(threshold=0))
        assert (await fault(url, s, ttft_multiplier=4, ttft_multiplier_at_threshold=2048)).status == 200
        assert await ttft(url, s) == pytest.approx(base, rel=0.05)
        await client.apply(models.EngineSetting(threshold=2048))
        assert await ttft(url, s) == pytest.approx(4 * base_2048, rel=0.05)
        assert (await fault(url, s, ttft_multiplier_at_threshold=-1)).status == 400
        async with s.get(url + "/slipstream/faults", headers=ADMIN) as r:
            assert (await r.json())["ttft_multiplier_at_threshold"] == 2048

    asyncio.run(with_sim(check, "--time-scale", "20"))


@pytest.mark.parametrize(("path", "data", "status", "words"), [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/completions", b"\xff\xfe", 400, "not valid JSON"),
    ("/v1/completions", json.dumps({"prompt": {"a": 1}}).encode(), 400, "prompt: must be"),
    ("/v1/completions", json.dumps({"prompt": ["a", "b"]}).encode(), 400, "batched prompts"),
    ("/v1/completions", json.dumps({"prompt": "a", "max_tokens": -1}).encode(), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": "", "max_tokens": 1}).encode(), 400, "empty"),
    ("/v1/completions", json.dumps({"prompt": "a", "stream": "yes"}).encode(), 400, "stream"),
    ("/v1/completions", json.dumps({"prompt": "a", "slipstream": {"prompt_tokens": 0}}).encode(), 400,
     "slipstream.prompt_tokens"),
    ("/v1/completions", json.dumps({"prompt": "a", "slipstream": {"colour": 1}}).encode(), 400, "unknown field"),
    ("/v1/completions", json.dumps({"prompt": "a", "slipstream": {"prompt_tokens": 10, "cached_tokens": 11}}).encode(),
     400, "cached_tokens"),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    ("/generate", json.dumps({"text": 5}).encode(), 400, "text"),
    ("/set_internal_state", b"{}", 400, "server_args"),
    ("/set_internal_state", json.dumps({"server_args": {"x": [1]}}).encode(), 400, "server_args.x"),
    ("/v1/nowhere", b"{}", 404, "Not Found"),
])
def test_malformed_bodies_get_a_json_error(path: str, data: bytes, status: int, words: str) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + path, data=data, headers={**ADMIN, "Content-Type": "application/json"}) as r:
            assert r.status == status
            body = await r.json()
        assert words in json.dumps(body)
        assert "Traceback" not in json.dumps(body)

    asyncio.run(with_sim(check))


def test_oversized_bodies_get_413_with_or_without_a_length() -> None:
    big = b"{" + b" " * (server.MAX_BODY_BYTES + 1) + b"}"

    async def chunks() -> Any:
        for k in range(0, len(big), 1 << 20):
            yield big[k:k + (1 << 20)]

    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/v1/completions", data=big) as r:
            assert r.status == 413
            assert "limit" in (await r.json())["message"]
        async with s.post(url + "/set_internal_state", data=chunks(), headers=ADMIN) as r:
            assert r.status == 413
            assert (await r.json())["code"] == 413
        async with s.get(url + "/health") as r:
            assert r.status == 200

    asyncio.run(with_sim(check))


def test_a_failing_twin_answers_500_and_unhealthy_never_hangs() -> None:
    async def run() -> None:
        from enginesim_util import config

        running = await server.start(config())
        pod = running.pod

        def broken(until_s: float) -> None:
            raise RuntimeError("engine stalled")

        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
                async with s.post(running.url + "/v1/completions", json={"prompt": "a b"}) as r:
                    assert r.status == 200
                pod.driver.advance = broken  # type: ignore[method-assign]
                for stream in (False, True):
                    body = {"prompt": "a b", "stream": stream}
                    async with s.post(running.url + "/v1/completions", json=body) as r:
                        assert r.status == 500
                        assert "engine stalled" in (await r.json())["message"]
                async with s.get(running.url + "/health") as r:
                    assert r.status == 503
        finally:
            await running.close()

    asyncio.run(run())


def test_random_and_mutated_bodies_never_get_a_500() -> None:
    """A seeded fuzz over HTTP: random bytes and valid bodies with bytes flipped."""
    import random

    rng = random.Random(7)
    valid = [json.dumps({"prompt": "a b c", "max_tokens": 2}).encode(),
             json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode(),
             json.dumps({"server_args": {"long_prefill_token_threshold": 2048}}).encode()]
    paths = ["/v1/completions", "/v1/chat/completions", "/generate", "/set_internal_state",
             "/slipstream/faults"]

    def mutate(data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)

    async def check(url: str, s: aiohttp.ClientSession) -> None:
        for _ in range(60):
            data = (rng.randbytes(rng.randint(0, 64)) if rng.random() < 0.5
                    else mutate(rng.choice(valid)))
            path = rng.choice(paths)
            async with s.post(url + path, data=data, headers=ADMIN) as r:
                assert r.status in (200, 400), (path, data, r.status)
                await r.json()
            if path == "/slipstream/faults":  # keep the engine answering normally
                async with s.post(url + path, json={"admin": "ok", "metrics": "ok", "ttft_multiplier": 1},
                                  headers=ADMIN) as r:
                    assert r.status == 200

    asyncio.run(with_sim(check, "--time-scale", "50"))


def test_a_client_that_leaves_before_its_first_token_is_dropped_from_the_queue() -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async def one(tokens: int, who: str, timeout: float | None = None) -> int:
            body = {"prompt": "x", "max_tokens": 1, "slipstream": {"prompt_tokens": tokens}}
            async with s.post(url + "/v1/completions", json=body, headers=tenant(who),
                              timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                await r.read()
                return r.status

        long = asyncio.create_task(one(150000, "stays"))  # ~9 twin s of prefill
        await until_prefilling(url, s)
        with pytest.raises(TimeoutError):
            await one(500, "leaves", timeout=0.02)  # queued behind the long prefill
        assert await long == 200
        async with s.get(url + "/metrics") as r:
            families = {f.name: f for f in text_string_to_metric_families(await r.text())}
        tenants = {smp.labels["tenant"] for smp in families[names.TTFT_SECONDS].samples}
        assert tenants == {"stays"}, "the request whose client left never got a first token"
        queued = [smp.value for smp in families[names.NUM_QUEUE_REQS].samples]
        assert queued == [0]
        aborted = {smp.labels["tenant"]: smp.value for smp in families["sglang:num_aborted_requests"].samples
                   if smp.name.endswith("_total")}
        assert aborted == {"leaves": 1}

    asyncio.run(with_sim(check, "--time-scale", "10"))
