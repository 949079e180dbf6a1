"""The demo's traffic phases: the premise the closed loop is judged on, checked on the twin."""

from __future__ import annotations

from functools import cache

from slipstream.demo import offline, phases
from slipstream.sim import engine, metrics, policies, profiles, spec


@cache
def worst_tenant_p99(kind: str, policy: str) -> float:
    loaded = spec.parse(phases.spec_yaml(kind, 400.0), kind)
    result = engine.simulate(
        loaded.workload,
        policies.parse(policy, loaded.engine),
        profiles.load(phases.PROFILE),
        loaded.engine,
    )
    return max(t["ttft_p99_s"] for t in metrics.summarize(result)["per_tenant"].values())


def test_heterogeneous_phase_gains_at_least_five_fold_from_capped_concurrency():
    # concurrency 2 (T 4096): the most the demo's ServingDeployment allows (loop.serving_deployment)
    stock = worst_tenant_p99(phases.HETEROGENEOUS, "stock")
    capped = worst_tenant_p99(phases.HETEROGENEOUS, "ceiling:4096/srpt")
    assert stock >= 5 * capped, (stock, capped)


def test_documents_phase_loses_to_any_cap():
    stock = worst_tenant_p99(phases.DOCUMENTS, "stock")
    for policy in offline.STATIC:
        if not policy.startswith("stock"):
            assert worst_tenant_p99(phases.DOCUMENTS, policy) >= 1.05 * stock, policy


def test_no_static_setting_is_best_in_both_phases():
    # Every setting Auto may leave on is at least 10% behind the phase's best in one of the
    # demo's two kinds of traffic: a loop that follows the traffic has something to win.
    best = {kind: min(worst_tenant_p99(kind, p) for p in offline.STATIC)
            for kind in (phases.DOCUMENTS, phases.HETEROGENEOUS)}  # fmt: skip
    for policy in offline.STATIC:
        behind = max(worst_tenant_p99(kind, policy) / best[kind] for kind in best)
        assert behind >= 1.1, (policy, behind)


def test_uniform_phase_gains_nothing_from_capping():
    stock = worst_tenant_p99(phases.UNIFORM, "stock")
    capped = worst_tenant_p99(phases.UNIFORM, "ceiling:4096/srpt")
    assert capped >= stock, (stock, capped)


def test_plan_lays_phases_back_to_back_with_unique_ids_and_rare_giants():
    workload, spans = phases.plan(400.0, replicas=2)
    assert [p.kind for p in spans] == ["documents", "heterogeneous", "documents"]
    assert [(p.start_s, p.end_s) for p in spans] == [(0, 400), (400, 800), (800, 1200)]
    ids = [r.rid for r in workload.requests]
    assert len(ids) == len(set(ids))
    for r in workload.requests:
        assert next(p for p in spans if p.holds(r.arrival_s)).name == r.rid.split("/")[0]
    for span in spans:  # both tenants in every phase
        assert {r.tenant for r in workload.requests if span.holds(r.arrival_s)} == set(phases.TENANTS)
    docs = [r for r in workload.requests if not r.rid.startswith("2-")]
    assert all(10_000 <= r.prompt_tokens <= 24_000 for r in docs)
    het = [r for r in workload.requests if r.rid.startswith("2-")]
    for tenant in phases.TENANTS:
        mine = [r for r in het if r.tenant == tenant]
        giants = [r for r in mine if r.prompt_tokens >= phases.GIANT_TOKENS[0]]
        assert giants and len(giants) < 0.01 * len(mine), (tenant, len(giants), len(mine))
