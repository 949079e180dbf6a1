"""The twin's fleet: routers split a workload over engines with their own prefix caches."""

from __future__ import annotations

import json
import math

import pytest

from slipstream import cli
from slipstream.sim import fleet, policies, profiles, spec
from slipstream.sim.workload import Request, Workload, build
from slipstream.tune import observed

PROFILE = profiles.load(profiles.DEFAULT_PROFILE)
CONFIG = policies.EngineConfig(chunked_prefill_size=8192, page_size=1)
BLOCK = 512


def conversations(n: int, turns: int, gap_s: float = 4.0, new_blocks: int = 8) -> Workload:
    """``n`` conversations of ``turns`` turns each, interleaved in time: turn k sends the
    history of turns 0..k-1 (their blocks) and ``new_blocks`` new blocks."""
    reqs = []
    for c in range(n):
        history: list[int] = []
        for k in range(turns):
            history += [c * 10_000 + k * 100 + b for b in range(new_blocks)]
            reqs.append(Request(f"c{c}-t{k}", "agent", k * gap_s + c * gap_s / n, len(history) * BLOCK, 16,
                                tuple(history), (BLOCK,) * len(history)))  # fmt: skip
    return build("conversations", reqs)


@pytest.mark.parametrize("router", list(fleet.ROUTERS))
def test_every_router_sends_every_request_once_in_arrival_order(router: str) -> None:
    w = conversations(6, 5)
    parts = fleet.route(w, 3, router, PROFILE, CONFIG)
    assert len(parts) == 3
    sent = [r.rid for p in parts for r in p.requests]
    assert sorted(sent) == sorted(r.rid for r in w.requests)
    for p in parts:
        assert [r.arrival_s for r in p.requests] == sorted(r.arrival_s for r in p.requests)
    one = fleet.route(w, 1, router, PROFILE, CONFIG)
    assert one[0].requests == w.requests


def test_round_robin_alternates_and_random_is_seeded() -> None:
    w = conversations(4, 4)
    rr = fleet.route(w, 2, "round-robin", PROFILE, CONFIG)
    assert [r.rid for r in rr[0].requests] == [r.rid for r in w.requests[0::2]]
    a, b = (fleet.route(w, 2, "random", PROFILE, CONFIG, seed=7) for _ in range(2))
    assert [p.requests for p in a] == [p.requests for p in b]
    assert all(p.requests for p in a)


def test_prefix_routing_keeps_a_conversation_where_its_history_is_and_hits_more() -> None:
    w = conversations(7, 6)  # odd: round robin sends a conversation's turns to both engines in turn
    parts = fleet.route(w, 2, "prefix", PROFILE, CONFIG)
    home = {r.rid.split("-")[0]: k for k, p in enumerate(parts) for r in p.requests if r.rid.endswith("-t0")}
    for k, p in enumerate(parts):
        assert all(home[r.rid.split("-")[0]] == k for r in p.requests), "a later turn left its history"
    assert sorted(len(p.requests) for p in parts) == [18, 24], "and the conversations spread (4 and 3)"

    def hits(router: str) -> float:
        runs = fleet.simulate_fleet(fleet.route(w, 2, router, PROFILE, CONFIG),
                                    lambda k: policies.parse("stock", CONFIG), PROFILE, CONFIG)  # fmt: skip
        ratios = fleet.hit_ratios(runs)
        merged = fleet.merged(w, runs)
        assert len(merged.jobs) == len(w.requests)
        prompt = sum(r.prompt_tokens for r in w.requests)
        return 1.0 - sum(j.uncached for j in merged.jobs) / prompt if all(math.isfinite(x) for x in ratios) else 0.0

    # round robin sends turn k of a conversation to another engine than turn k-1 whenever
    # the interleaving flips it; prefix affinity finds every turn's history warm
    assert hits("prefix") > hits("round-robin") + 0.2


def test_a_specs_sessions_hit_where_their_earlier_turns_ran():
    """A spec's multi-turn sessions carry no warm share: on two engines their hits follow
    the routing, and prefix affinity finds the history that round robin scatters."""
    text = ("name: s\nseed: 9\nduration_s: 400\ntenants:\n  - name: agent\n    rate_per_s: 0.15\n"
            "    prompt_tokens: {dist: lognormal, median: 2000, sigma: 0.5}\n"
            "    output_tokens: {dist: constant, value: 100}\n"
            "    sessions: {turns: {dist: uniform, min: 4, max: 10}, think_s: {dist: uniform, min: 3, max: 20}}\n")
    w = spec.parse(text, "s.yaml").workload

    def hit(router: str) -> float:
        runs = fleet.simulate_fleet(fleet.route(w, 2, router, PROFILE, CONFIG),
                                    lambda k: policies.parse("stock", CONFIG), PROFILE, CONFIG)  # fmt: skip
        jobs = fleet.merged(w, runs).jobs
        return 1.0 - sum(j.uncached for j in jobs) / sum(j.req.prompt_tokens for j in jobs)

    one = fleet.simulate_fleet([w], lambda k: policies.parse("stock", CONFIG), PROFILE, CONFIG)
    assert hit("prefix") == pytest.approx(fleet.hit_ratios(one)[0], abs=0.02), "as if on one engine"
    assert hit("prefix") > hit("round-robin") + 0.15 and hit("prefix") > hit("random") + 0.15


def test_least_loaded_steers_around_an_engine_busy_with_a_giant() -> None:
    giant = Request("giant", "docs", 0.0, 200_000, 16, tuple(range(1, 400)), (501,) * 399 + (200_000 - 501 * 399,))
    chats = [Request(f"chat-{k}", "chat", 0.1 + 0.1 * k, 800, 16, (10_000 + k,), (800,)) for k in range(10)]
    parts = fleet.route(build("mixed", [giant, *chats]), 2, "least-loaded", PROFILE, CONFIG)
    assert [r.rid for r in parts[0].requests] == ["giant"]
    assert len(parts[1].requests) == 10
    rr = fleet.route(build("mixed", [giant, *chats]), 2, "round-robin", PROFILE, CONFIG)
    assert len(rr[0].requests) == 6


def test_a_bad_router_or_fleet_size_is_refused_by_name() -> None:
    w = conversations(2, 2)
    with pytest.raises(ValueError, match="routing 'sticky' is not one of round-robin, random, least-loaded, prefix"):
        fleet.route(w, 2, "sticky", PROFILE, CONFIG)
    with pytest.raises(ValueError, match="engines must be at least 1"):
        fleet.route(w, 0, "random", PROFILE, CONFIG)


def test_bench_prints_each_engines_cache_hit_ratio(tmp_path, capsys) -> None:
    spec = tmp_path / "agents.yaml"
    spec.write_text(
        "name: agents\nduration_s: 60\nseed: 3\ntenants:\n"
        "  - name: agent\n    rate_per_s: 2\n    prompt_tokens: {dist: constant, value: 6000}\n"
        "    output_tokens: {dist: constant, value: 16}\n    shared_prefix_tokens: 4000\n"
    )
    assert cli.main(["bench", "--workload", str(spec), "--policies", "stock", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)["fleet"]
    assert single["engines"] == 1 and single["routing"] is None
    assert cli.main(["bench", "--workload", str(spec), "--policies", "stock", "--engines", "2",
                     "--routing", "prefix", "--json"]) == 0  # fmt: skip
    got = json.loads(capsys.readouterr().out)["fleet"]
    assert got["engines"] == 2 and got["routing"] == "prefix" and sum(got["requests"]) == single["requests"][0]
    assert min(got["requests"]) >= 0.4 * single["requests"][0], "the shared system prompt does not pull them all"
    # every request after the first on an engine finds the 4,000-token system prompt warm
    assert all(0.5 < r < 2 / 3 for r in [*got["cache_hit_ratio"]["stock"], *single["cache_hit_ratio"]["stock"]])
    assert cli.main(["bench", "--workload", str(spec), "--policies", "stock"]) == 0
    text = capsys.readouterr().out
    assert "cache-hit ratio (prompt tokens served from the prefix cache), one engine:" in text
    with pytest.raises(SystemExit):
        cli.main(["bench", "--workload", str(spec), "--policies", "stock", "--engines", "2", "--routing", "sticky"])


def test_recommend_observes_a_routed_fleet_and_says_each_engines_hits(tmp_path, capsys) -> None:
    """`recommend --engines 2` takes its window from both engines (the pods listed, so the
    twin spreads the rates over them), as Prometheus sums a deployment's pods."""
    spec_file = tmp_path / "sessions.yaml"
    spec_file.write_text(
        "name: s\nseed: 9\nduration_s: 400\ntenants:\n  - name: agent\n    rate_per_s: 0.15\n"
        "    prompt_tokens: {dist: lognormal, median: 2000, sigma: 0.5}\n"
        "    output_tokens: {dist: constant, value: 100}\n"
        "    sessions: {turns: {dist: uniform, min: 4, max: 10}, think_s: {dist: uniform, min: 3, max: 20}}\n")
    w = spec.load_file(spec_file).workload
    parts = fleet.route(w.scaled(2), 2, "prefix", PROFILE, CONFIG)
    snap, hits = observed.simulated_fleet(parts, "stock", PROFILE, CONFIG, None, 300.0)
    assert len(snap.pods) == 2 and len(hits) == 2 and all(0.3 < h < 1 for h in hits)
    alone = fleet.hit_ratios(fleet.simulate_fleet(parts, lambda k: policies.parse("stock", CONFIG), PROFILE, CONFIG))
    assert hits == alone
    assert cli.main(["recommend", "--workload", str(spec_file), "--engines", "2", "--routing", "prefix",
                     "--json"]) == 0  # fmt: skip
    got = capsys.readouterr()
    assert json.loads(got.out)["fleet"]["routing"] == "prefix"
    assert "cache-hit ratio by engine under stock: engine-0" in got.err


def test_recommend_refuses_a_fleet_size_on_a_snapshot(tmp_path, capsys) -> None:
    snap = tmp_path / "snap.json"
    snap.write_text("{}")
    assert cli.main(["recommend", "--snapshot", str(snap), "--engines", "2"]) == 2
    assert "--engines routes a workload over a fleet" in capsys.readouterr().err
    assert cli.main(["bench", "--workload", "builtin:multi-tenant", "--engines", "0"]) == 2
    assert "--engines must be at least 1, got 0" in capsys.readouterr().err
