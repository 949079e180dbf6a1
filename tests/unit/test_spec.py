"""YAML workload specs: generated tenants, cache hits, giant prompts, and clear errors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.sim import bounds, engine, policies, profiles, spec

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


SESSIONS = """
name: s
seed: 4
duration_s: 300
tenants:
  - name: agent
    rate_per_s: 0.1
    prompt_tokens: {dist: constant, value: 1000}
    output_tokens: {dist: constant, value: 50}
    shared_prefix_tokens: 500
    sessions: {turns: {dist: constant, value: 4}, think_s: {dist: constant, value: 10}}
"""


def test_a_sessions_turns_extend_its_history_and_nothing_is_warm_on_arrival():
    reqs = spec.parse(SESSIONS, "s.yaml").workload.requests
    sessions: dict[str, list] = {}
    for r in reqs:
        sessions.setdefault(r.rid.rsplit("-t", 1)[0], []).append(r)
    assert len(sessions) >= 10 and all(r.warm_blocks == 0 for r in reqs)
    for turns in sessions.values():
        turns.sort(key=lambda r: r.arrival_s)
        assert [r.rid.rsplit("-t", 1)[1] for r in turns] == [str(k) for k in range(len(turns))]
        assert all(b.arrival_s - a.arrival_s == pytest.approx(10.0) for a, b in itertools.pairwise(turns))
        for a, b in itertools.pairwise(turns):
            assert b.blocks[:len(a.blocks)] == a.blocks, "turn k starts with turn k-1's blocks"
            assert b.prompt_tokens == a.prompt_tokens + 50 + 1000, "then its output and the new tokens"
        assert turns[0].block_sizes[0] == 500
    firsts = {t[0].blocks[0] for t in sessions.values()}
    assert len(firsts) == 1, "the tenant's system prompt leads every session"
    # one engine runs every turn: each later turn finds its history in the cache
    result = engine.simulate(spec.parse(SESSIONS, "s.yaml").workload, policies.parse("stock", policies.EngineConfig()),
                             profiles.load("kimi-k3-8xh200"), policies.EngineConfig())  # fmt: skip
    later = [j for j in result.jobs if not j.req.rid.endswith("-t0")]
    assert later and all(j.cached >= j.req.prompt_tokens - 1050 for j in later)


@pytest.mark.parametrize("extra, message", [
    ("    cache_hit: 0.5\n", "'cache_hit' cannot be used with 'sessions'"),
    ("    giant: {rate_per_hour: 5, prompt_tokens: {dist: constant, value: 100000}}\n", "'giant' cannot be used"),
])
def test_sessions_refuse_a_warm_share_and_giants_by_name(extra, message):
    with pytest.raises(spec.SpecError, match=message):
        spec.parse(SESSIONS + extra, "s.yaml")


def test_sessions_name_a_bad_field_and_count_their_turns_in_the_request_bound():
    with pytest.raises(spec.SpecError, match="unknown field"):
        spec.parse(SESSIONS.replace("think_s:", "pause_s:"), "s.yaml")
    with pytest.raises(spec.SpecError, match="'turns' .*|dist: lognormal"):
        spec.parse(SESSIONS.replace("turns: {dist: constant, value: 4}", "turns: 4"), "s.yaml")
    huge = SESSIONS.replace("duration_s: 300", "duration_s: 2000000").replace("rate_per_s: 0.1", "rate_per_s: 0.5")
    with pytest.raises(spec.SpecError, match="about 4e\\+06 requests"):  # 0.5 x 4 turns x 2M s
        spec.parse(huge, "s.yaml")


def test_builtin_scenarios_exist():
    assert {"seed-000", "seed-003", "multi-tenant"} <= set(spec.builtin_names())


# Fuzz: any number in any field either loads a spec within the bounds or is refused with a
# SpecError naming the file; never another exception, never more requests than the bound.

NUMBER = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e12", "1.0e+9", "-1e3", "0x10", ".nan", "1_000", "12abc"]),
)
FIELDS = ("duration_s", "seed", "arrival_s", "prompt_tokens", "cached_tokens", "output_tokens",
          "rate_per_s", "rate_per_hour", "cache_hit", "shared_prefix_tokens", "median", "sigma",
          "min", "max", "chunked_prefill_size", "kv_pool_tokens")


def _render(value: object) -> str:
    return value if isinstance(value, str) else repr(value).replace("inf", ".inf").replace("nan", ".nan")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(values=st.fixed_dictionaries({k: NUMBER for k in FIELDS}),
       chosen=st.sets(st.sampled_from(FIELDS), min_size=1, max_size=4))
def test_fuzzed_numbers_load_within_bounds_or_are_refused_by_name(values, chosen):
    v = {k: (_render(values[k]) if k in chosen else None) for k in FIELDS}
    ok = {"duration_s": "60", "seed": "1", "arrival_s": "0", "prompt_tokens": "100",
          "cached_tokens": "0", "output_tokens": "1", "rate_per_s": "0.5",
          "rate_per_hour": "10", "cache_hit": "0", "shared_prefix_tokens": "0",
          "median": "100", "sigma": "0.5", "min": "1", "max": "1000",
          "chunked_prefill_size": "8192", "kv_pool_tokens": "0"}
    f = {k: v[k] or ok[k] for k in FIELDS}
    text = (f"seed: {f['seed']}\nduration_s: {f['duration_s']}\n"
            f"engine: {{chunked_prefill_size: {f['chunked_prefill_size']}, "
            f"kv_pool_tokens: {f['kv_pool_tokens']}}}\n"
            f"requests:\n  - {{id: r, arrival_s: {f['arrival_s']}, prompt_tokens: "
            f"{f['prompt_tokens']}, cached_tokens: {f['cached_tokens']}, "
            f"output_tokens: {f['output_tokens']}}}\n"
            f"tenants:\n  - name: t\n    rate_per_s: {f['rate_per_s']}\n"
            f"    cache_hit: {f['cache_hit']}\n    shared_prefix_tokens: {f['shared_prefix_tokens']}\n"
            f"    prompt_tokens: {{dist: lognormal, median: {f['median']}, sigma: {f['sigma']}, "
            f"min: {f['min']}, max: {f['max']}}}\n"
            f"    giant: {{rate_per_hour: {f['rate_per_hour']}, "
            f"prompt_tokens: {{dist: uniform, min: {f['min']}, max: {f['max']}}}}}\n")
    try:
        loaded = spec.parse(text, "fuzz.yaml")
    except spec.SpecError as exc:
        assert str(exc).startswith("fuzz.yaml"), exc
        return
    reqs = loaded.workload.requests
    assert 1 <= len(reqs) <= bounds.MAX_REQUESTS
    assert all(0 <= r.arrival_s <= bounds.MAX_SPAN_S for r in reqs)
    assert all(1 <= r.prompt_tokens <= bounds.MAX_PROMPT_TOKENS for r in reqs)
    assert all(1 <= r.output_tokens <= bounds.MAX_OUTPUT_TOKENS for r in reqs)


def test_exponents_without_a_dot_or_sign_are_numbers():
    s = spec.parse("requests: [{id: a, arrival_s: 1e1, prompt_tokens: 1.5e3, "
                   "output_tokens: 2E+1}]\n", "e.yaml")
    r = s.workload.requests[0]
    assert (r.arrival_s, r.prompt_tokens, r.output_tokens) == (10.0, 1500, 20)


def test_every_bound_is_documented_in_the_spec_format():
    doc = spec.__doc__ or ""
    for value in (bounds.MAX_SPAN_S, bounds.MAX_REQUESTS, bounds.MAX_PROMPT_TOKENS,
                  bounds.MAX_OUTPUT_TOKENS, bounds.MAX_RATE_PER_S,
                  bounds.MAX_GIANT_RATE_PER_HOUR, bounds.MAX_SIGMA, *bounds.ENGINE.values()):
        assert bounds.words(value) in doc, value
