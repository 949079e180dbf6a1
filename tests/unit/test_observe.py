"""The pure parts of observe: the queries, the answer parser, the snapshot rules, backoff.

The same code runs against a real Prometheus in tests/integration; here the samples are
written by hand, so each rule is pinned by a case that fails if it moves.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.api import snapshot as snap
from slipstream.observe import assemble, parse, queries
from slipstream.observe.backoff import Backoff

NOW = 1_800_000_000.0
RULES = assemble.Rules(window_s=60.0, min_samples=10, max_staleness_s=10.0)
DEP = {"namespace": "ns", "servingdeployment": "chat"}


# -- queries -------------------------------------------------------------------------


def test_one_query_per_metric_family_each_aggregating_by_deployment():
    fleet = queries.fleet(60)
    assert [name for name, _ in fleet.items()] == ["ttft", "uncached", "output", "tokens", "queue", "settings", "targets", "mix"]
    for _, promql in fleet.items():
        assert "by (namespace, servingdeployment" in promql
        # Selectors name no deployment: the text is the same for one or five hundred.
        selectors = re.findall(r"\{(__name__[^}]*)\}", promql)
        assert selectors
        for matchers in selectors:
            assert matchers.endswith(', servingdeployment!=""'), matchers
    assert "by (namespace, servingdeployment, tenant, le)" in fleet.ttft
    assert "[60000ms]" in fleet.ttft
    assert "by (namespace, servingdeployment, tenant, le)" in fleet.output
    assert queries.name_matcher("sglang:generation_tokens_histogram_bucket") in fleet.output


def test_the_largest_answers_are_sent_in_shards_that_cover_every_name_once():
    reads = queries.fleet_reads(60)
    assert [name for name, _ in reads] == ["ttft"] * 6 + ["uncached"] * 6 + ["output", "tokens", "queue", "settings",
                                                                              "targets"] + ["mix"] * 6
    whole = dict(queries.fleet(60).items())
    for name, promql in reads:
        selectors = re.findall(r"\{(__name__[^}]*)\}", promql)
        shards = {re.search(r'servingdeployment=~"\.\*(.*)"$', m).group(1) if "=~\".*" in m else "" for m in selectors}
        if name in queries.SHARDED:
            assert len(shards) == 1 and shards != {""}, promql  # every selector of a part: the same shard
            (shard,) = shards
            assert promql == whole[name].replace('servingdeployment!=""', 'servingdeployment!="", '
                                                 + queries.shard_matcher(shard))
        else:
            assert promql == whole[name] and shards == {""}
    # Every last character a DNS-1123 name may end in is in exactly one shard.
    for last in "abcdefghijklmnopqrstuvwxyz0123456789":
        assert sum(re.fullmatch(f".*{shard}", f"chat-{last}") is not None for shard in queries.SHARDS) == 1, last


def test_shards_join_by_deployment():
    rows = [parse.Sample({**DEP, "servingdeployment": name, "tenant": "t", "le": le, "part": "bucket"}, v, NOW)
            for name in ("chat", "batch") for le, v in (("1.0", 3.0), ("+Inf", 4.0))]
    rows += [parse.Sample({**DEP, "servingdeployment": name, "tenant": "t", "part": "sum"}, 5.0, NOW) for name in ("chat", "batch")]
    whole = assemble.reduce("ttft", rows)
    parts = [assemble.reduce("ttft", [r for r in rows if r.label("servingdeployment") == n]) for n in ("chat", "batch")]
    assert assemble.join(parts[0], parts[1]) == whole
    with pytest.raises(TypeError, match="cannot join"):
        assemble.join([], {})


def test_metric_names_match_either_spelling():
    matcher = queries.name_matcher("sglang:time_to_first_token_seconds_bucket")
    regex = re.fullmatch(r'__name__=~"(.*)"', matcher).group(1)
    for name in ("sglang:time_to_first_token_seconds_bucket", "sglang_time_to_first_token_seconds_bucket"):
        assert re.fullmatch(regex, name)
    assert not re.fullmatch(regex, "sglangXtime_to_first_token_seconds_bucket")
    assert queries.name_matcher("up") == '__name__="up"'


def test_pod_subset_query_escapes_names_and_refuses_bad_ones():
    promql = queries.pods_ttft("team-a", "chat", ["chat-0", "chat.1"], 30)
    assert 'pod=~"chat\\\\-0|chat\\\\.1"' in promql
    assert 'namespace="team-a", servingdeployment="chat"' in promql
    with pytest.raises(ValueError, match="pod 'a\"b' is not a Kubernetes name"):
        queries.pods_ttft("ns", "chat", ['a"b'], 30)
    with pytest.raises(ValueError, match="pods must name at least one pod"):
        queries.pods_ttft("ns", "chat", [], 30)
    with pytest.raises(ValueError, match="window must be > 0"):
        queries.window(0)


# -- parse ---------------------------------------------------------------------------


def test_parse_reads_prometheus_number_forms():
    result = [{"metric": {"a": "b"}, "value": [NOW, v]} for v in ("1.5", "NaN", "+Inf", "-Inf", "1e3")]
    values = [s.value for s in parse.vector(result)]
    assert values[0] == 1.5 and math.isnan(values[1]) and values[2:] == [math.inf, -math.inf, 1000.0]


@pytest.mark.parametrize("result", [
    {"resultType": "scalar"}, [1, "2"], [{"metric": {}, "value": [1]}],
    [{"metric": {"a": 1}, "value": [1, "2"]}], [{"metric": {}, "value": ["t", "2"]}],
    [{"metric": {}, "value": [1, 2]}], [{"metric": {}, "value": [1, "two"]}],
    [{"metric": {}, "value": [math.nan, "2"]}],
])
def test_parse_refuses_anything_but_an_instant_vector(result):
    with pytest.raises(parse.MalformedAnswer):
        parse.vector(result)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(_json)
def test_parse_is_total(result):
    try:
        samples = parse.vector(result)
    except parse.MalformedAnswer:
        return
    assert all(isinstance(s.value, float) and math.isfinite(s.timestamp) for s in samples)


# -- assemble ------------------------------------------------------------------------


def sample(value: float, **labels: str) -> parse.Sample:
    return parse.Sample({**DEP, **labels}, value, NOW)


def ttft_rows(tenant: str, cumulative: dict[str, float], total_sum: float) -> list[parse.Sample]:
    rows = [sample(v, tenant=tenant, le=le, part="bucket") for le, v in cumulative.items()]
    return [*rows, sample(total_sum, tenant=tenant, part="sum")]


def results(**over: list[parse.Sample]) -> dict[str, list[parse.Sample]]:
    base = {
        "ttft": ttft_rows("acme", {"0.1": 5, "1": 18, "+Inf": 20}, 9.0),
        "uncached": [sample(20, tenant="acme", le="+Inf", part="bucket"),
                     sample(20, tenant="acme", le="1000", part="bucket"),
                     sample(8000, tenant="acme", part="sum")],
        "tokens": [sample(300, tenant="acme", part="cached"), sample(1000, tenant="acme", part="prompt")],
        "queue": [sample(3, part="depth"), sample(NOW - 1, part="newest")],
        "settings": [sample(2048, pod="chat-0", part="threshold"),
                     sample(1, pod="chat-0", mode="floor", part="mode"),
                     sample(1, pod="chat-0", policy="srpt", part="policy")],
        "targets": [sample(1, pod="chat-0", part="up")],
    }
    return {**base, **over}


def one(res: dict[str, list[parse.Sample]], rules: assemble.Rules = RULES) -> snap.WorkloadSnapshot:
    return assemble.snapshots(res, now=NOW, rules=rules, deployments=["ns/chat"])["ns/chat"]


def test_a_valid_snapshot():
    s = one(results())
    assert s.valid, s.detail
    (acme,) = s.tenants
    assert acme.ttft == snap.Histogram((0.1, 1.0), (5.0, 18.0), 20.0, 9.0)
    assert acme.requests_per_s == pytest.approx(20 / 60)
    assert acme.cache_hit_ratio == pytest.approx(0.3)
    assert s.queue_depth == 3 and s.pods == (snap.PodSetting("chat-0", 2048, "floor", "srpt"),)
    assert s.extra["newest_sample_age_s"] == pytest.approx(1.0)


def test_output_tokens_per_tenant_from_the_generation_histogram():
    rows = [*ttft_rows("acme", {"64": 15, "256": 20, "+Inf": 20}, 1500.0),
            *ttft_rows("zeta", {"64": 2, "+Inf": 3}, 400.0)]
    s = one(results(output=rows))
    assert s.valid, s.detail
    (acme,) = s.tenants  # zeta finished requests but got no first token in the window
    assert acme.output_tokens == snap.Histogram((64.0, 256.0), (15.0, 20.0), 20.0, 1500.0)
    assert acme.output_tokens.mean == pytest.approx(75.0)
    # An engine without the histogram: no output lengths, and the snapshot is still usable.
    bare = one(results())
    assert bare.valid and bare.tenants[0].output_tokens is None


def test_pods_are_every_pod_up_or_with_a_setting_gauge():
    settings_rows = [*results()["settings"], sample(1, pod="chat-3", mode="ceiling", part="mode")]
    targets = [sample(1, pod=p, part="up") for p in ("chat-0", "chat-1", "chat-3")]
    s = one(results(settings=settings_rows, targets=[*targets, sample(1, pod="chat-2", part="down")]))
    assert s.valid, s.detail
    # chat-1 exports no setting gauge (a stock engine) and still counts; chat-2 is down.
    assert s.pods == (snap.PodSetting("chat-0", 2048, "floor", "srpt"), snap.PodSetting("chat-1", None, "", ""),
                      snap.PodSetting("chat-3", None, "ceiling", ""))
    assert (s.extra["targets_up"], s.extra["targets_down"]) == (3, 1)
    # A deployment none of whose pods exports a setting gauge still lists its pods.
    bare = one(results(settings=[], targets=targets[:2]))
    assert [p.pod for p in bare.pods] == ["chat-0", "chat-1"] and bare.pods[0].threshold is None


def test_buckets_are_coalesced_and_made_monotonic_as_histogram_quantile_does():
    rows = ttft_rows("acme", {"0.1": 6, "1": 5, "1.0": 1, "+Inf": 20}, 9.0)
    (acme,) = one(results(ttft=rows)).tenants
    assert acme.ttft.counts == (6.0, 6.0) and acme.ttft.total == 20.0


@pytest.mark.parametrize("res, reason, words", [
    ({k: [] for k in ("ttft", "uncached", "output", "tokens", "queue", "settings", "targets")},
     snap.NO_SERIES, "no series"),
    ({"queue": [sample(3, part="depth")], "targets": [sample(1, part="down")]},
     snap.STALE, "0 of 1 scrape targets up"),
    ({"queue": [sample(NOW - 30, part="newest")]}, snap.STALE, "30.0 s old"),
    ({"queue": [sample(math.nan, part="newest")]}, snap.NOT_FINITE, "newest sample time"),
    ({"ttft": ttft_rows("acme", {"0.1": math.nan, "+Inf": 20}, 9.0)}, snap.NOT_FINITE, "TTFT histogram"),
    ({"output": ttft_rows("acme", {"64": math.nan, "+Inf": 20}, 900.0)}, snap.NOT_FINITE, "output-token histogram"),
    ({"ttft": ttft_rows("acme", {"0.1": -1, "+Inf": -1}, 9.0)}, snap.NOT_FINITE, "negative"),
    ({"ttft": ttft_rows("acme", {"+Inf": 20}, 9.0)}, snap.NOT_FINITE, "no finite bucket"),
    ({"tokens": [sample(math.inf, tenant="acme", part="cached")]}, snap.NOT_FINITE, "token counters"),
    ({"settings": [sample(math.nan, pod="chat-0", part="threshold")]}, snap.NOT_FINITE, "threshold"),
    ({"ttft": ttft_rows("acme", {"0.1": 0, "+Inf": 0}, 0)}, snap.NO_TRAFFIC, "Prometheus answered"),
    ({"ttft": []}, snap.NO_TRAFFIC, "no request"),
    ({"ttft": ttft_rows("acme", {"0.1": 1, "+Inf": 4}, 1)}, snap.TOO_FEW_SAMPLES, "fewer than the 10"),
])
def test_each_reason(res, reason, words):
    s = one(results(**res))
    assert s.invalid == reason
    assert words in s.detail


def test_tenants_without_the_label_are_named_unlabelled_and_deployments_need_a_namespace():
    rows = [*ttft_rows("", {"0.1": 20, "+Inf": 20}, 1.0)]
    (t,) = one(results(ttft=rows)).tenants
    assert t.name == assemble.UNLABELLED_TENANT
    with pytest.raises(ValueError, match="must be written namespace/name"):
        assemble.snapshots(results(), now=NOW, rules=RULES, deployments=["chat"])


_label = st.sampled_from(["ns", "chat", "acme", "", "0.1", "1", "+Inf", "bucket", "sum", "cached",
                          "prompt", "depth", "newest", "threshold", "mode", "policy", "up", "down", "zz"])
_samples = st.lists(st.builds(
    parse.Sample,
    st.dictionaries(st.sampled_from(["namespace", "servingdeployment", "tenant", "le", "part", "pod",
                                     "mode", "policy"]), _label),
    st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([NOW, NOW - 1, 0.0, 1.0, 20.0]),
    st.just(NOW),
), max_size=25)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.fixed_dictionaries({k: _samples for k in ("ttft", "uncached", "output", "tokens", "queue", "settings", "targets")}))
def test_assemble_never_raises_and_valid_means_usable(res):
    for s in assemble.snapshots(res, now=NOW, rules=RULES).values():
        assert s.invalid is None or s.invalid in snap.REASONS
        if s.valid:
            assert s.requests >= RULES.min_samples
            assert all(math.isfinite(t.ttft_p99_s) and math.isfinite(t.ttft_p50_s) for t in s.tenants)


# -- backoff -------------------------------------------------------------------------


def test_backoff_doubles_to_its_cap_and_resets_on_success():
    b = Backoff(initial_s=10, max_s=35)
    assert not b.waiting(0)
    assert [b.failed(t, "down") for t in (0, 10, 30, 65)] == [10, 20, 35, 35]
    assert b.waiting(99) and not b.waiting(100)
    assert b.failing_since == 0 and b.failures == 4
    b.succeeded()
    assert not b.waiting(0) and b.failures == 0 and b.failing_since is None
