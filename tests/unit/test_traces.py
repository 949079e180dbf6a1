"""Trace loaders: the real public traces, and bad input named by file:line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.sim import bounds, traces
from slipstream.sim.workload import BLOCK_SPACE, merge


def test_mooncake_conversation_trace_loads_whole(mooncake):
    w = traces.load(mooncake, tenant_index=1)
    assert len(w.requests) == 12_031
    assert w.name == "conversation_trace"
    assert 3400 < w.span_s < 3600
    r = w.requests[0]
    assert sum(r.block_sizes) == r.prompt_tokens
    assert all(b // BLOCK_SPACE == 1 for b in r.blocks)
    # every request shares block 0 (a system prompt), as the trace README says
    assert len({req.blocks[0] for req in w.requests}) == 1
    arrivals = [req.arrival_s for req in w.requests]
    assert arrivals == sorted(arrivals)
    # 3 s steps are spread over their interval: far more distinct arrivals than the 1,180 steps
    assert len(set(arrivals)) > 10_000


def test_azure_code_trace_loads_whole(azure):
    w = traces.load(azure, tenant="code", tenant_index=2)
    assert len(w.requests) == 8_819 and w.tenants == ("code",)
    assert max(r.prompt_tokens for r in w.requests) == 7437
    assert all(len(r.blocks) == 1 for r in w.requests)


def test_merged_traces_keep_tenants_and_hash_spaces_apart(mooncake, azure):
    a = traces.load(mooncake, tenant_index=1)
    b = traces.load(azure, tenant_index=2)
    m = merge("both", [a, b])
    assert len(m.requests) == 12_031 + 8_819
    assert set(m.tenants) == {"conversation_trace", "AzureLLMInferenceTrace_code"}
    blocks_a = {x for r in a.requests for x in r.blocks}
    blocks_b = {x for r in b.requests for x in r.blocks}
    assert not blocks_a & blocks_b


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


@pytest.mark.parametrize("bad, field", [
    ({**GOOD, "input_length": -3}, "input_length"),
    ({**GOOD, "output_length": "x"}, "output_length"),
    ({**GOOD, "hash_ids": [1]}, "hash_ids"),
    ({k: v for k, v in GOOD.items() if k != "timestamp"}, "timestamp"),
])
def test_mooncake_bad_field_names_file_line_and_field(tmp_path, bad, field):
    p = write(tmp_path, "t.jsonl", json.dumps(GOOD) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(traces.TraceError, match=rf"t\.jsonl:2: field '{field}'"):
        traces.load(p)


def test_mooncake_malformed_line(tmp_path):
    p = write(tmp_path, "t.jsonl", json.dumps(GOOD) + "\n{not json\n")
    with pytest.raises(traces.TraceError, match=r"t\.jsonl:2: not valid JSON"):
        traces.load(p)


def test_azure_bad_rows(tmp_path):
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    ok = "2023-11-16 18:17:03.9799600,4808,10\n"
    with pytest.raises(traces.TraceError, match=r"a\.csv:3: field 'ContextTokens' must be >= 0"):
        traces.load(write(tmp_path, "a.csv", head + ok + "2023-11-16 18:17:04.1,-5,3\n"))
    with pytest.raises(traces.TraceError, match=r"b\.csv:2: field 'TIMESTAMP'"):
        traces.load(write(tmp_path, "b.csv", head + "yesterday,5,3\n"))
    with pytest.raises(traces.TraceError, match=r"c\.csv:1: header"):
        traces.load(write(tmp_path, "c.csv", "a,b,c\n" + ok))


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(traces.TraceError, match="does not exist"):
        traces.load(tmp_path / "nope.jsonl")
    with pytest.raises(traces.TraceError, match="unknown trace format"):
        traces.load(write(tmp_path, "x.txt", "hi"))


def test_burst_mode_keeps_equal_timestamps(tmp_path):
    rows = [dict(GOOD, timestamp=ts) for ts in (0, 0, 0, 3000)]
    p = write(tmp_path, "t.jsonl", "\n".join(json.dumps(r) for r in rows))
    spread = [r.arrival_s for r in traces.load_mooncake(p, "t").requests]
    burst = [r.arrival_s for r in traces.load_mooncake(p, "t", spread=False).requests]
    assert spread == [0.0, 1.0, 2.0, 3.0]
    assert burst == [0.0, 0.0, 0.0, 3.0]


JSON_NUMBER = st.one_of(st.integers(min_value=-(10**30), max_value=10**30),
                        st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                        st.text(max_size=3))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(field=st.sampled_from(["timestamp", "input_length", "output_length"]),
       value=JSON_NUMBER, hash_id=st.integers(min_value=0, max_value=2**45))
def test_fuzzed_mooncake_columns_load_within_bounds_or_name_the_file(tmp_path_factory, field,
                                                                    value, hash_id):
    row = {**GOOD, field: value, "hash_ids": [1, hash_id]}
    p = tmp_path_factory.mktemp("fuzz") / "f.jsonl"
    p.write_text(json.dumps(GOOD) + "\n" + json.dumps(row) + "\n")
    try:
        w = traces.load(p)
    except traces.TraceError as exc:
        assert str(exc).startswith(str(p)), exc
        return
    assert w.span_s <= bounds.MAX_SPAN_S
    assert all(r.prompt_tokens <= bounds.MAX_PROMPT_TOKENS and
               r.output_tokens <= bounds.MAX_OUTPUT_TOKENS for r in w.requests)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".jsonl", ".csv"]))
def test_fuzzed_bytes_load_or_name_the_file(tmp_path_factory, data, suffix):
    p = tmp_path_factory.mktemp("bytes") / f"b{suffix}"
    p.write_bytes(data)
    try:
        traces.load(p)
    except traces.TraceError as exc:
        assert str(exc).startswith(str(p)), exc
