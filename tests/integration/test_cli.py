"""The command line: bench's JSON and plots, and errors that name the problem and write nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slipstream import cli


def test_bench_json_has_every_policy_summary(capsys, tmp_path):
    plot = tmp_path / "cdf.png"
    code = cli.main(["bench", "--workload", "builtin:multi-tenant", "--policies",
                     "stock,ceiling:4096,floor:2048/srpt", "--json", "--plot", str(plot)])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"] == "multi-tenant" and doc["rate_scale"] == 1.0
    assert list(doc["policies"]) == ["stock", "ceiling:4096", "floor:2048/srpt"]
    for summary in doc["policies"].values():
        assert set(summary["per_tenant"]) == {"chat", "code", "agent", "docs"}
        assert summary["worst_tenant_slowdown_p99"] >= summary["per_tenant"]["code"]["slowdown_p99"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_on_the_public_traces_prints_the_table_and_the_scale(capsys, mooncake, azure):
    code = cli.main(["bench", "--trace", str(mooncake), "--trace", str(azure), "--tenant", "chat",
                     "--tenant", "code", "--policies", "stock,floor:2048/srpt", "--speed"])
    assert code == 0
    captured = capsys.readouterr()
    assert "rate scale:" in captured.err and "target utilization 0.70 +- 0.02" in captured.err
    assert "aligned: traces of different spans cut to the shortest" in captured.err
    out = captured.out
    assert out.splitlines()[1].split()[:4] == ["policy", "worst-tenant", "p99", "slowdown"]
    assert "== floor:2048/srpt" in out and "x trace time" in out
    assert "chat" in out and "code" in out


def test_simulate_plot_on_a_scenario_draws_before_and_after(capsys, tmp_path):
    plot = tmp_path / "panel.png"
    assert cli.main(["simulate", "--scenario", "seed-000", "--policy", "ceiling:4096",
                     "--plot", str(plot)]) == 0
    assert plot.stat().st_size > 10_000
    assert "hit-1" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--scenario", "seed-000", "--policy", "fifo"], "unknown policy 'fifo'"),
    (["simulate", "--scenario", "nope", "--policy", "stock"], "unknown scenario 'nope'"),
    (["simulate", "--trace", "missing.jsonl", "--policy", "stock"], "missing.jsonl: trace file does not exist"),
    (["simulate", "--policy", "stock"], "give exactly one of"),
    (["bench", "--scenario", "seed-000", "--policies", "stock,ceiling:x"], "not a token count"),
    (["simulate", "--scenario", "seed-000", "--policy", "stock", "--profile", "h100-dreams"],
     "unknown profile"),
])
def test_errors_exit_2_with_the_reason_and_write_nothing(capsys, tmp_path, argv, message):
    plot = tmp_path / "never.png"
    assert cli.main([*argv, "--plot", str(plot)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("slipstream: error:")
    assert not plot.exists()


def test_bad_trace_line_is_named(capsys, tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 5, "input_length": -10, "output_length": 1, "hash_ids": []}\n')
    assert cli.main(["simulate", "--trace", str(bad), "--policy", "stock", "--json"]) == 2
    captured = capsys.readouterr()
    assert f"{bad}:2: field 'input_length'" in captured.err and captured.out == ""


def test_profile_json_file_is_loaded_and_checked(capsys, tmp_path):
    from slipstream.sim import profiles

    good = tmp_path / "probe.json"
    good.write_text(profiles.load("llama3-70b-4xa100").to_json())
    assert cli.main(["simulate", "--scenario", "seed-003", "--policy", "stock", "--profile",
                     str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "llama3-70b-4xa100"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"name": "x"}))
    assert cli.main(["simulate", "--scenario", "seed-003", "--policy", "stock", "--profile",
                     str(broken)]) == 2
    assert "is missing" in capsys.readouterr().err


def test_console_script_runs():
    exe = Path(sys.executable).parent / "slipstream"
    done = subprocess.run([str(exe), "simulate", "--scenario", "seed-003", "--policy", "sarathi:256"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "stream-16" in done.stdout
