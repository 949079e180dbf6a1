"""Bad input that used to hang the twin or pass silently: each is refused by the CLI with
exit status 2 and one line naming the file, the line and the field."""

from __future__ import annotations

import json

import pytest

from slipstream import cli
from slipstream.sim import profiles

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def refused(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slipstream: error:"), captured.err
    return lines[0]


@pytest.mark.parametrize("raw", ["NaN", "1e400", "Infinity", "-Infinity"])
def test_non_finite_trace_timestamp(capsys, tmp_path, raw):
    trace = tmp_path / "t.jsonl"
    bad = json.dumps(GOOD).replace('"timestamp": 0', f'"timestamp": {raw}')
    trace.write_text(json.dumps(GOOD) + "\n" + bad + "\n")
    line = refused(capsys, ["simulate", "--trace", str(trace), "--policy", "stock"])
    assert f"{trace}:2: field 'timestamp' must be a finite number" in line


ONE = "  - {id: a, arrival_s: 0, prompt_tokens: 100}\n"


@pytest.mark.parametrize("body, where", [
    # a YAML .nan / .inf arrival (used to hang simulate)
    ("requests:\n" + ONE + "  - id: b\n    arrival_s: .nan\n    prompt_tokens: 100\n",
     ":4: requests[1] (b): field 'arrival_s' must be a finite number"),
    ("requests:\n" + ONE + "  - id: b\n    arrival_s: -.inf\n    prompt_tokens: 100\n",
     ":4: requests[1] (b): field 'arrival_s' must be a finite number"),
    # duplicate request ids (used to hang simulate)
    ("requests:\n" + ONE + "  - {id: a, arrival_s: 1, prompt_tokens: 200}\n",
     ":3: requests[1] (a): request id 'a' is used twice"),
    ("duration_s: 100\nrequests:\n  - {id: chat-0, arrival_s: 0, prompt_tokens: 100}\n"
     "tenants:\n  - name: chat\n    rate_per_s: 1\n    prompt_tokens: {dist: constant, value: 50}\n",
     ":5: tenants[0] (chat): request id 'chat-0' is used twice"),
    # an unknown field in a request entry (used to be ignored)
    ("requests:\n  - id: a\n    arrival_s: 0\n    prompt_tokens: 100\n    promt_tokens: 5\n",
     ":5: requests[0] (a): unknown field(s) ['promt_tokens']"),
    # a negative chunked_prefill_size (used to be reported without file and field)
    ("engine:\n  page_size: 1\n  chunked_prefill_size: -8192\nrequests:\n" + ONE,
     ":3: engine: field 'chunked_prefill_size': chunked_prefill_size must be an integer > 0"),
])
def test_bad_spec(capsys, tmp_path, body, where):
    path = tmp_path / "w.yaml"
    path.write_text(body)
    line = refused(capsys, ["simulate", "--workload", str(path), "--policy", "stock"])
    assert f"{path}{where}" in line


@pytest.mark.parametrize("raw", ["NaN", "Infinity"])
def test_non_finite_number_in_a_profile(capsys, tmp_path, raw):
    data = json.loads(profiles.load("kimi-k3-8xh200").to_json())
    text = json.dumps(data, indent=2)
    text = text.replace(f'"overhead_s": {data["overhead_s"]}', f'"overhead_s": {raw}')
    assert raw in text
    path = tmp_path / "p.json"
    path.write_text(text)
    want = text[: text.index('"overhead_s"')].count("\n") + 1
    line = refused(capsys, ["simulate", "--scenario", "seed-000", "--policy", "stock",
                            "--profile", str(path)])
    assert f"{path}:{want}: profile field 'overhead_s' must be a finite number" in line


def test_negative_chunked_prefill_size_on_the_command_line(capsys):
    line = refused(capsys, ["simulate", "--scenario", "seed-000", "--policy", "stock",
                            "--chunked-prefill-size", "-1"])
    assert "chunked_prefill_size must be an integer > 0" in line


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_non_finite_rate_scale(capsys, value):
    line = refused(capsys, ["simulate", "--scenario", "seed-000", "--policy", "stock",
                            "--rate-scale", value])
    assert "rate scale must be a finite number > 0" in line
