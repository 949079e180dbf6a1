"""YAML workload specs: generated tenants, cache hits, giant prompts, and clear errors."""

from __future__ import annotations

import pytest

from slipstream.sim import engine, policies, profiles, spec

SPEC = """
name: t
seed: 3
duration_s: 300
engine: {chunked_prefill_size: 4096, cache_tokens: 500000}
tenants:
  - name: chat
    rate_per_s: 0.5
    prompt_tokens: {dist: lognormal, median: 3000, sigma: 0.5, max: 20000}
    output_tokens: {dist: constant, value: 20}
    cache_hit: 0.5
    shared_prefix_tokens: 800
  - name: docs
    giant: {rate_per_hour: 60, prompt_tokens: {dist: uniform, min: 100000, max: 200000}}
"""


def test_generated_tenants_are_seeded_and_shaped_as_asked():
    a = spec.parse(SPEC, "t.yaml")
    b = spec.parse(SPEC, "t.yaml")
    assert [r.prompt_tokens for r in a.workload.requests] == [r.prompt_tokens for r in b.workload.requests]
    chat = [r for r in a.workload.requests if r.tenant == "chat"]
    docs = [r for r in a.workload.requests if r.tenant == "docs"]
    assert 100 <= len(chat) <= 200 and 1 <= len(docs) <= 15
    assert all(100_000 <= r.prompt_tokens <= 200_000 for r in docs)
    assert all(r.prompt_tokens <= 20_000 and r.output_tokens == 20 for r in chat)
    assert a.engine.chunked_prefill_size == 4096


def test_cache_hit_shows_up_as_cached_tokens_in_the_twin():
    s = spec.parse(SPEC, "t.yaml")
    result = engine.simulate(s.workload, policies.parse("stock", s.engine),
                             profiles.load("kimi-k3-8xh200"), s.engine)
    chat = [j for j in result.jobs if j.req.tenant == "chat"]
    hit = sum(j.cached for j in chat) / sum(j.req.prompt_tokens for j in chat)
    assert 0.45 <= hit <= 0.85  # 50% conversation hit plus the shared system prompt


@pytest.mark.parametrize("text, message", [
    ("name: x\n", "neither 'requests' nor 'tenants'"),
    ("tenants: [{name: a, rate_per_s: 1, prompt_tokens: {dist: constant, value: 5}}]\n",
     "'duration_s'"),
    ("requests: [{id: a, arrival_s: 0, prompt_tokens: 10, cached_tokens: 10}]\n", "cached_tokens"),
    ("requests: [{id: a, arrival_s: 0, prompt_tokens: -1}]\n", "prompt_tokens"),
    ("engine: {chunked_prefill: 5}\nrequests: []\n", "unknown field"),
    ("duration_s: 5\ntenants: [{name: a, rate_per_s: 1, prompt_tokens: {dist: zipf}}]\n",
     "dist: lognormal"),
    ("colour: red\n", "unknown field"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_specs_name_the_field(text, message):
    with pytest.raises(spec.SpecError, match=message):
        spec.parse(text, "bad.yaml")


def test_builtin_scenarios_exist():
    assert {"seed-000", "seed-003", "multi-tenant"} <= set(spec.builtin_names())
