"""`slipstream engine-sim` and `slipstream load` as commands (real processes, 127.0.0.1)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from enginesim_util import KEY

from slipstream.enginesim import load


class Sim:
    def __init__(self, proc: subprocess.Popen[str], url: str, lines: queue.Queue[str]) -> None:
        self.proc, self.url, self.lines = proc, url, lines


def start_sim(*argv: str, key: str | None = KEY) -> Sim:
    env = {k: v for k, v in os.environ.items() if k != "SLIPSTREAM_ADMIN_API_KEY"}
    env["SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD"] = "2048"
    if key:
        env["SLIPSTREAM_ADMIN_API_KEY"] = key
    proc = subprocess.Popen([sys.executable, "-m", "slipstream.cli", "engine-sim", "--host", "127.0.0.1",
                             "--port", "0", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in out], daemon=True).start()
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if " listening on " in line:
            url = line.split(" listening on ")[1].split()[0]
            sim = Sim(proc, url, lines)
            sim.seen = seen  # type: ignore[attr-defined]
            return sim
    proc.kill()
    proc.wait()
    raise AssertionError(f"engine-sim did not start: {''.join(seen)}")


def stop_sim(sim: Sim) -> int:
    sim.proc.send_signal(signal.SIGTERM)
    try:
        return sim.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        sim.proc.kill()
        sim.proc.wait()
        raise


@pytest.fixture
def sim() -> Iterator[Sim]:
    s = start_sim("--long-prefill-token-threshold", "$(SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD)",
                  "--model-path", "/models/kimi", "--served-model-name", "kimi-k3", "--tp-size", "8",
                  "--trust-remote-code", "--enable-metrics", "--tokenizer-metrics-allowed-custom-labels",
                  "tenant", "--time-scale", "20", "--pod-name", "engine-0")
    try:
        yield s
    finally:
        if s.proc.poll() is None:
            stop_sim(s)


def get(url: str, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_engine_sim_takes_a_pods_launch_args_and_stops_on_sigterm(sim: Sim) -> None:
    assert sim.url.startswith("http://127.0.0.1:")
    banner = "".join(sim.seen)  # type: ignore[attr-defined]
    assert "ignoring launch_server flags" in banner and "--tp-size --trust-remote-code" in banner
    assert KEY not in banner
    assert get(sim.url + "/health")[0] == 200
    status, text = get(sim.url + "/get_server_info", KEY)
    assert status == 200 and KEY not in text
    info = json.loads(text)
    assert info["served_model_name"] == "kimi-k3" and info["engine_sim"]["pod_name"] == "engine-0"
    assert info["long_prefill_token_threshold"] == 2048, "$(VAR) in args expands as the kubelet does"
    assert stop_sim(sim) == 0


def test_engine_sim_refuses_a_bad_flag_with_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "slipstream.cli", "engine-sim", "--port", "0",
                           "--page-size", "64", "--long-prefill-token-threshold", "100"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "slipstream: error: long_prefill_token_threshold 100 must be a multiple of the page size 64"]


def write_trace(path: Path, n: int, tokens: int, step_ms: int, first_hash: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            blocks = -(-tokens // 512)
            f.write(json.dumps({"timestamp": i * step_ms, "input_length": tokens, "output_length": 4,
                                "hash_ids": [first_hash + i * 100 + b for b in range(blocks)]}) + "\n")
    return path


def test_load_command_replays_two_tenants_and_stops_by_itself(sim: Sim, tmp_path: Path) -> None:
    a = write_trace(tmp_path / "chat.jsonl", 30, 600, 100, 0)
    b = write_trace(tmp_path / "docs.jsonl", 10, 9000, 300, 10_000)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "slipstream.cli", "load", "--trace", str(a), "--trace", str(b),
                           "--tenant", "chat", "--tenant", "docs", "--target", sim.url, "--time-scale", "20",
                           "--report-every", "0.1", "--max-requests", "35", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    progress = [line for line in lines if "TTFT (twin s)" in line]
    assert progress and "chat: n=" in progress[-1] and "docs: n=" in progress[-1]
    summary = json.loads("\n".join(lines[lines.index("{"):]))
    assert summary["sent"] == 35 and summary["failed"] == 0
    assert summary["tenants"]["chat"]["n"] + summary["tenants"]["docs"]["n"] == 35
    # The long prompts take longer to their first token than the short ones.
    assert summary["tenants"]["docs"]["ttft_p50_s"] > summary["tenants"]["chat"]["ttft_p50_s"]
    assert time.monotonic() - start < 60
    status, text = get(sim.url + "/metrics")
    counts = {line.split("tenant=\"")[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines()
              if line.startswith("sglang:time_to_first_token_seconds_count")}
    assert counts == {"chat": summary["tenants"]["chat"]["n"], "docs": summary["tenants"]["docs"]["n"]}


def test_load_command_says_why_when_nothing_answers(tmp_path: Path) -> None:
    from slipstream.localkube import ports

    (port,) = ports.free_ports(1)  # nothing listens there
    trace = write_trace(tmp_path / "t.jsonl", 3, 100, 10, 0)
    proc = subprocess.run([sys.executable, "-m", "slipstream.cli", "load", "--trace", str(trace),
                           "--target", f"http://127.0.0.1:{port}", "--time-scale", "100", "--report-every", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "no request was answered (3 sent); first error: ClientConnectorError" in proc.stderr


def test_load_api_with_a_callable_target_list_and_a_duration(sim: Sim, tmp_path: Path) -> None:
    from slipstream.sim import traces

    reqs = traces.load(write_trace(tmp_path / "t.jsonl", 200, 512, 50, 0), "t").requests
    asked = []

    def targets() -> list[str]:
        asked.append(1)
        return [] if len(asked) == 1 else [sim.url]

    lines: list[str] = []

    class Out:
        def write(self, s: str) -> None:
            lines.append(s)

        def flush(self) -> None:
            pass

    start = time.monotonic()
    outcomes = load.replay(reqs, targets, time_scale=20, duration_s=0.3, prompt="field",
                           report_every_s=0.1, out=Out())  # type: ignore[arg-type]
    assert time.monotonic() - start < 30
    assert 1 < len(outcomes) < 200, "the duration bounds the requests sent"
    first, *rest = sorted(outcomes, key=lambda o: int(o.rid.split("-")[1]))
    assert not first.ok and first.error == "no target ready"
    assert all(o.ok and o.ttft_s > 0 and o.target == sim.url for o in rest)
    assert any("t: n=" in line for line in lines)

    stopped = threading.Event()
    threading.Timer(0.3, stopped.set).start()
    start = time.monotonic()
    outcomes = load.replay(reqs, [sim.url], time_scale=1, prompt="field", report_every_s=None,
                           stop=stopped.is_set)
    assert time.monotonic() - start < 10 and 1 <= len(outcomes) < 50, "stop ends the sending"

    from slipstream.demo import loop  # the tests' and the demo's load thread stops the same way

    run = loop.LoadRun(reqs, lambda: [sim.url], time_scale=1).start()
    run.stop()
    start = time.monotonic()
    results = run.join(timeout_s=30)
    assert time.monotonic() - start < 10 and len(results) < 50, "LoadRun.stop ends the sending"
    assert all(r.ok for r in results)


def test_load_api_replays_an_azure_trace_with_word_prompts(sim: Sim, azure: Path) -> None:
    from slipstream.sim import traces

    reqs = traces.load(azure, "code").requests[:15]
    outcomes = load.replay(reqs, [sim.url], time_scale=20, rate_scale=5, prompt="words", report_every_s=None)
    assert sorted(o.rid for o in outcomes) == sorted(r.rid for r in reqs)
    assert all(o.ok and o.tenant == "code" for o in outcomes)
    status, text = get(sim.url + "/metrics")
    total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("sglang:prompt_tokens_total{"))
    assert total == sum(r.prompt_tokens for r in reqs)


def test_a_simulator_in_a_thread_serves_synchronous_callers() -> None:
    from slipstream.enginesim import flags, server

    cfg = flags.parse(["--port", "0", "--enable-metrics", "--tp-size", "8", "--page-size", "$(PAGE)"],
                      {"SLIPSTREAM_ADMIN_API_KEY": KEY, "PAGE": "16"})
    with server.InThread(cfg) as sim:
        assert get(sim.url + "/health")[0] == 200
        status, text = get(sim.url + "/get_server_info", KEY)
        assert status == 200 and json.loads(text)["page_size"] == 16
        assert get(sim.url + "/metrics")[0] == 200
    with pytest.raises(OSError):
        get(sim.url + "/health")
