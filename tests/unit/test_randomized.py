"""Randomized phased workloads (demo.randomized) and the per-phase judgement (demo.offline.judge)."""

from __future__ import annotations

import math

import pytest

from slipstream.demo import loopbench, offline, phases, randomized

SEEDS = range(20)
SMALL = 17
"""A seed whose workload is small (about 1,700 requests): cheap to build and replay."""


@pytest.fixture(scope="module")
def specs() -> dict[int, list[randomized.PhaseSpec]]:
    return {seed: randomized.phase_specs(seed) for seed in SEEDS}


def test_a_seed_fully_determines_the_workload() -> None:
    assert randomized.phase_specs(SMALL) == randomized.phase_specs(SMALL)
    (w1, s1), (w2, s2) = randomized.random_phases(SMALL), randomized.random_phases(SMALL)
    assert s1 == s2
    assert [(r.rid, r.arrival_s, r.prompt_tokens, r.blocks) for r in w1.requests] == [
        (r.rid, r.arrival_s, r.prompt_tokens, r.blocks) for r in w2.requests]  # fmt: skip


def test_seeds_differ(specs: dict[int, list[randomized.PhaseSpec]]) -> None:
    shapes = {tuple((p["name"], p["duration_s"], p["load"]) for p in specs[seed]) for seed in SEEDS}
    assert len(shapes) == len(SEEDS)


def test_every_kind_appears_across_twenty_seeds(specs: dict[int, list[randomized.PhaseSpec]]) -> None:
    seen = {p["name"] for seed in SEEDS for p in specs[seed]}
    assert seen == set(randomized.KINDS)


def test_phases_tenants_and_loads_are_within_bounds(specs: dict[int, list[randomized.PhaseSpec]]) -> None:
    for seed in SEEDS:
        items = specs[seed]
        assert randomized.PHASES[0] <= len(items) <= randomized.PHASES[1], seed
        names = {tuple(t["name"] for t in p["tenants"]) for p in items}
        assert len(names) == 1, f"seed {seed}: every tenant sends in every phase"
        assert randomized.TENANTS[0] <= len(next(iter(names))) <= randomized.TENANTS[1]
        for a, b in zip(items, items[1:], strict=False):
            assert a["name"] != b["name"], f"seed {seed}: a phase change changes the kind"
        for p in items:
            assert randomized.PHASE_S[0] <= p["duration_s"] <= randomized.PHASE_S[1]
            assert randomized.LOAD[0] <= p["load"] <= randomized.LOAD[1]
            assert all(t["rate_per_s"] > 0 for t in p["tenants"])
            for r in p.get("requests", []):
                assert 0 <= r["arrival_s"] < p["duration_s"]
                if p["name"] == "giants":
                    assert 100_000 <= r["prompt_tokens"] <= 250_000


def test_the_generated_load_is_near_its_target() -> None:
    """Within 0.7-1.4x: the draws' own noise (a mixed phase of 120 s has a heavy tail)."""
    items = randomized.phase_specs(SMALL)
    workload, spans = randomized.random_phases(SMALL)
    got = randomized.offered_load(workload, spans)
    assert [p.kind for p in spans] == [p["name"] for p in items]
    for item, load in zip(items, got, strict=True):
        assert 0.7 * item["load"] <= load <= 1.4 * item["load"], (item["name"], item["load"], load)


def test_a_full_budget_chunk_costs_what_the_pass_does() -> None:
    cost = randomized.cost_model()
    assert randomized.saturated_s(cost, 0, 8192, 8192) == pytest.approx(cost.solo_prefill_s(0, 8192, 8192), rel=0.02)
    assert randomized.saturated_s(cost, 0, 1024, 8192) < 0.5 * cost.solo_prefill_s(0, 1024, 8192)


def test_random_seed_is_a_loopbench_workload() -> None:
    workload, spans = loopbench.load_phases(f"random:{SMALL}")
    expect, expect_spans = randomized.random_phases(SMALL)
    assert spans == expect_spans and len(workload.requests) == len(expect.requests)
    assert all(p.kind in randomized.KINDS for p in spans)
    with pytest.raises(ValueError, match="random:SEED"):
        loopbench.load_phases("random:one")


def figures(phase_s: tuple[float, ...], whole: float) -> offline.SpanFigures:
    return offline.SpanFigures(phase_s, tuple(v / 2 for v in phase_s), whole)


def test_judge_takes_each_phase_s_best_static_as_its_oracle() -> None:
    spans = [phases.Phase("1-a", "chat", 0, 100), phases.Phase("2-b", "giants", 100, 200)]
    statics = {"stock": figures((1.0, 9.0), 9.0), "ceiling:4096": figures((2.0, 1.5), 2.5),
               "floor:4096": figures((1.2, 3.0), 3.1)}  # fmt: skip
    judged = offline.judge(figures((1.1, 3.0), 3.0), statics, spans, moves=2)
    assert [(p.oracle, p.oracle_s) for p in judged.phases] == [("stock", 1.0), ("ceiling:4096", 1.5)]
    assert judged.worst_phase().name == "2-b" and judged.worst_phase().vs_oracle == pytest.approx(2.0)
    assert (judged.best_static, judged.best_static_s, judged.off_s) == ("ceiling:4096", 2.5, 9.0)
    assert judged.vs_best == pytest.approx(1.2) and judged.off_vs_best == pytest.approx(3.6)
    worst_first = judged.worst_first()
    assert worst_first is not None and worst_first.name == "2-b"  # the first phase is no change
    assert [p.change for p in judged.phases] == [False, True]


def test_the_oracle_is_no_worse_than_any_static_setting_in_its_phase() -> None:
    items = [randomized.phase_spec("documents", 1, ("chat", "code"), 120.0, 0.3),
             randomized.phase_spec("chat", 2, ("chat", "code"), 120.0, 0.3)]  # fmt: skip
    workload, spans = phases.back_to_back([{k: v for k, v in p.items() if k != "load"} for p in items], "t", "t")
    statics = offline.static_figures(workload, spans)
    judged = offline.judge(statics["stock"], statics, spans)
    for k, p in enumerate(judged.phases):
        each = {name: offline.figures(offline.static(workload, name), spans)[p.name] for name in offline.STATIC}
        assert all(p.oracle_s <= v for v in each.values()), (p.name, p.oracle_s, each)
        assert p.oracle_s == min(each.values()) and each[p.oracle] == p.oracle_s
        assert not math.isnan(p.first_oracle_s) and p.first_oracle_s <= statics["stock"].firsts[k]
    assert judged.off_s == statics["stock"].whole
    assert judged.best_static_s == min(f.whole for f in statics.values())
