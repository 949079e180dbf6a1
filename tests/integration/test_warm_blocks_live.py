"""Warm prefix blocks from the load generator to live engine simulators (real processes on
127.0.0.1), and the twin's fleet model of them on cached traffic.

A request's ``warm_blocks`` (leading blocks in the prefix cache on arrival: an earlier
turn, a shared document computed just before) travels in the ``slipstream`` field
(``enginesim.load.body_of``); the simulator's engine places them in its cache as the
twin does (``sim.engine._arrive``). Before it did, a live fleet prefilled cold what the
twin's model of it treated as cached. The last test replays a cached multi-turn phased
workload (spec tenants with warm prefixes, then a Mooncake-format trace whose later
turns re-send earlier ones) on two simulators with the load's round robin, against the
twin's two engines (``demo.offline.static``: ``split`` + one cache per engine).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slipstream.demo import loop, loopbench, offline, phases
from slipstream.engine import metrics as names
from slipstream.enginesim import load
from slipstream.localkube import health, ports, processes
from slipstream.sim import engine, policies, profiles
from slipstream.sim.workload import Request, build

TIME_SCALE = 10.0
"""Twin seconds per wall second: the 270 twin s replay takes about half a minute."""
AGREEMENT = loopbench.TWIN_AGREEMENT
SETTING = "stock"
"""The simulators start on T = 0, fcfs (their flags' defaults): the twin's ``stock``."""


def start_sim(pod: str, workdir: Path) -> tuple[processes.Component, str]:
    (port,) = ports.free_ports(1)
    argv = [sys.executable, "-m", "slipstream.cli", "engine-sim", "--host", ports.LOOPBACK,
            "--port", str(port), "--enable-metrics", "--pod-name", pod,
            "--tokenizer-metrics-allowed-custom-labels", "tenant",
            "--chunked-prefill-size", "8192", "--page-size", "1", "--long-prefill-token-threshold", "0",
            "--schedule-policy", "fcfs", "--profile", phases.PROFILE, "--time-scale", str(TIME_SCALE)]
    sim = processes.Component(pod, argv, workdir / f"{pod}.log",
                              env={k: v for k, v in os.environ.items() if k != "SLIPSTREAM_ADMIN_API_KEY"})
    url = f"http://{ports.LOOPBACK}:{port}"
    try:
        health.wait_healthy(sim, f"{url}/health", deadline_s=60)
    except BaseException:
        sim.stop()
        raise
    return sim, url


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[list[str]]:
    """Two fresh simulators (empty caches, zero counters); their URLs sorted, as the load
    and the Service's ready-pod list order them."""
    running: list[processes.Component] = []
    try:
        urls = []
        for k in range(offline.REPLICAS):
            sim, url = start_sim(f"sim-{k}", tmp_path)
            running.append(sim)
            urls.append(url)
        yield sorted(urls)
    finally:
        for sim in running:
            sim.stop()


def cached_tokens(url: str) -> float:
    """``sglang:cached_tokens_total`` summed over the pod's series (0 before any hit)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == names.CACHED_TOKENS_TOTAL.removesuffix("_total")
               for s in f.samples if s.name.endswith("_total"))  # fmt: skip


def twin_ttft(req: Request) -> float:
    """The twin's TTFT for ``req`` alone on a fresh engine (the demo fleet's config)."""
    cfg = offline.engine_config()
    run = engine.simulate(build("one", [req]), policies.parse(SETTING, cfg), profiles.load(phases.PROFILE), cfg)
    (job,) = run.jobs
    return job.first_token_s - job.arrival_s


def test_warm_blocks_reach_the_simulators_cache_and_lower_ttft_as_the_twin_predicts(sims: list[str]) -> None:
    url = sims[0]
    sizes = (8192,) * 7 + (2000,)  # 59,344 tokens; the first 6 blocks (49,152) warm
    cold = Request("cold", "agent", 0.0, sum(sizes), 4, tuple(range(100, 108)), sizes)
    warm = Request("warm", "agent", 60.0, sum(sizes), 4, tuple(range(200, 208)), sizes, warm_blocks=6)
    warm_tokens = sum(sizes[:6])
    outcomes = {o.rid: o for o in load.replay([cold, warm], [url], TIME_SCALE, prompt="field", report_every_s=None)}
    assert all(o.ok for o in outcomes.values()), outcomes
    # The hit is the warm blocks, exactly: 0 if warm_blocks were dropped on the way.
    assert cached_tokens(url) == warm_tokens
    live_cold, live_warm = outcomes["cold"].ttft_s, outcomes["warm"].ttft_s
    assert live_warm < live_cold / 3, (live_warm, live_cold)
    assert live_cold == pytest.approx(twin_ttft(cold), rel=0.05)
    assert live_warm == pytest.approx(twin_ttft(warm), rel=0.05)
    # The usage the simulator answers with says the same (a request of its own, fresh blocks).
    body = load.body_of(Request("again", "agent", 0.0, sum(sizes), 4, tuple(range(300, 308)), sizes,
                                warm_blocks=6), "m", "field")  # fmt: skip
    body["stream"] = False
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        usage = json.loads(response.read())["usage"]
    assert usage["prompt_tokens"] == sum(sizes) and usage["prompt_tokens_details"]["cached_tokens"] == warm_tokens


def test_a_bad_warm_blocks_is_refused_with_400_and_changes_nothing(sims: list[str]) -> None:
    url = sims[0]
    body = {"prompt": "x", "max_tokens": 1, "slipstream": {"prompt_tokens": 1000, "blocks": [1, 2],
                                                           "block_sizes": [512, 488], "warm_blocks": 3}}
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    message = json.loads(refused.value.read())["message"]
    assert message.startswith("slipstream.warm_blocks: must be an integer in 0..len(blocks) (2)"), message
    with urllib.request.urlopen(f"{url}/get_server_info", timeout=10) as response:
        info = json.loads(response.read())["engine_sim"]
    assert (info["requests_served"], info["requests_in_flight"]) == (0, 0)
    assert cached_tokens(url) == 0


def cached_multi_turn(folder: Path, conversations: int = 30, seed: int = 5) -> Path:
    """A phased workload file: 120 s of spec tenants with warm prefixes (agents re-sending
    a mostly cached 100K context, chat with a shared system prompt), then 150 s of a
    Mooncake-format trace of multi-turn conversations (each turn re-sends the whole
    earlier context and adds 8-40 blocks of 512; no warm blocks: hits only where the
    earlier turn was served). About 360 requests."""
    rng = random.Random(seed)
    rows, next_id = [], 0
    for _ in range(conversations):
        at, ids = rng.uniform(0, 100_000), []
        for _turn in range(4):
            new = rng.randint(8, 40)
            ids, next_id = ids + list(range(next_id, next_id + new)), next_id + new
            rows.append((int(at), len(ids) * 512 - rng.randint(0, 500), ids))
            at += rng.uniform(8_000, 25_000)
    rows.sort(key=lambda r: r[0])
    (folder / "agents.jsonl").write_text("".join(
        json.dumps({"timestamp": t, "input_length": n, "output_length": 8, "hash_ids": ids}) + "\n"
        for t, n, ids in rows))  # fmt: skip
    constant8 = {"dist": "constant", "value": 8}
    doc = {"phases": [
        {"name": "warm", "duration_s": 120, "seed": 3, "tenants": [
            {"name": "agent", "rate_per_s": 0.6, "cache_hit": 0.9, "output_tokens": constant8,
             "prompt_tokens": {"dist": "lognormal", "median": 100000, "sigma": 0.3, "min": 30000, "max": 200000}},
            {"name": "chat", "rate_per_s": 1.5, "cache_hit": 0.3, "shared_prefix_tokens": 1000, "output_tokens": constant8,
             "prompt_tokens": {"dist": "lognormal", "median": 6000, "sigma": 0.5, "min": 200, "max": 12000}}]},
        {"name": "turns", "duration_s": 150, "traces": [{"tenant": "agent", "trace": "agents.jsonl"}]},
    ]}  # fmt: skip
    path = folder / "cached.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.alone  # keeps time scale 10 and proves it held: run in the foreground (tests/run-tiers.sh)
def test_the_twin_agrees_with_two_live_simulators_on_cached_multi_turn_traffic(
        sims: list[str], tmp_path: Path) -> None:  # fmt: skip
    workload, spans = loopbench.load_phases(cached_multi_turn(tmp_path))
    assert 300 <= len(workload.requests) <= 450
    assert sum(r.warm_blocks > 0 for r in workload.requests) >= 150, "the spec phase states warm prefixes"
    outcomes = load.replay(workload.requests, sims, TIME_SCALE, prompt="field", report_every_s=None)
    # The figures mean something only if the machine kept the time scale (loopbench's bound).
    sim_lag = loopbench.sim_lag_p99(sims)
    load_lag = loopbench.p99([o.late_s for o in outcomes])
    print(f"time scale {TIME_SCALE:g} kept: p99 lag sim {sim_lag:.2f} s, load {load_lag:.2f} s (twin)")
    assert all(lag <= loopbench.DEFAULT_MAX_LAG_S for lag in (sim_lag, load_lag)), (  # NaN: no proof, fails
        f"the machine did not keep time scale {TIME_SCALE:g}: p99 lag sim {sim_lag:.2f} s, load "
        f"{load_lag:.2f} s > {loopbench.DEFAULT_MAX_LAG_S:g} twin s; the figures are void")
    assert len(outcomes) == len(workload.requests) and all(o.ok for o in outcomes), \
        [o.error for o in outcomes if not o.ok][:3]
    # The load's routing is the twin's: request k (arrival order) to the (k mod 2)-th pod URL.
    routed = {r.rid: sims[k] for k, part in enumerate(offline.split(workload)) for r in part}
    assert {o.rid: o.target for o in outcomes} == routed
    arrival = {r.rid: r.arrival_s for r in workload.requests}
    live = [loop.Result(o.tenant, o.rid, arrival[o.rid], o.ttft_s, o.ok, o.late_s) for o in outcomes]
    twin_run = offline.static(workload, SETTING)
    end = spans[-1].end_s
    live_p99, twin_p99 = loop.tenant_p99(live, 0, end), loop.tenant_p99(twin_run.results, 0, end)
    by_phase = {s.name: (loop.tenant_p99(live, s.start_s, s.end_s), loop.tenant_p99(twin_run.results, s.start_s, s.end_s))
                for s in spans}  # fmt: skip
    print(f"p99 TTFT per tenant (twin s), live vs twin: whole {live_p99} vs {twin_p99}; by phase {by_phase}")
    assert set(live_p99) == set(twin_p99) == {"agent", "chat"}
    for tenant, want in twin_p99.items():
        assert math.isfinite(want) and want > 0
        assert abs(live_p99[tenant] / want - 1) <= AGREEMENT, (tenant, live_p99[tenant], want)
    # The hits agree too: each engine's cache, fed by the same requests in the same order.
    twin_cached = sum(j.cached for part in offline.split(workload) for j in engine.simulate(
        build("e", part), policies.parse(SETTING, offline.engine_config()), profiles.load(phases.PROFILE),
        offline.engine_config()).jobs)  # fmt: skip
    live_cached = sum(cached_tokens(url) for url in sims)
    print(f"cached tokens: live {live_cached:.0f}, twin {twin_cached}")
    assert live_cached == pytest.approx(twin_cached, rel=0.02)
