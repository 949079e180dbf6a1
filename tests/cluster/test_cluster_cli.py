"""`slipstream cluster up | status | restart | down` as a user runs them: a stack that outlives
the command, and nothing left running afterwards, whether `down` stops a live supervisor,
cleans up after a supervisor killed with SIGKILL, or `up` itself is interrupted; and a
supervisor that restarts what dies (a SIGKILLed operator finishes its rollout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_faults import thresholds
from test_operator_reconcile import events, must_get, pod_identities
from test_rollout import engines, in_sync

from conftest import eventually, processes_mentioning
from slipstream.demo import loop, phases
from slipstream.localkube import apiread, binaries, supervisor

UP_S = 300


def slipstream(*args: str, timeout: float = UP_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slipstream.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def nothing_left(workdir: Path, pids: list[int]) -> None:
    def check() -> None:
        assert not processes_mentioning(str(workdir)), processes_mentioning(str(workdir))
        assert not [p for p in pids if alive(p)], [p for p in pids if alive(p)]

    eventually(check, deadline_s=30, what="every process of the cluster gone")


def test_up_status_down_and_a_killed_supervisor_leave_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    up = slipstream("cluster", "up", f"--workdir={workdir}", "--time-scale=4")
    assert up.returncode == 0, up.stderr
    kubeconfig = workdir / "cluster" / "admin.kubeconfig"
    assert f"export KUBECONFIG={kubeconfig}" in up.stdout.splitlines()
    status = slipstream("cluster", "status", f"--workdir={workdir}")
    assert status.returncode == 0 and "prometheus" in status.stdout and "operator" in status.stdout, status.stdout
    nodes = subprocess.run([str(binaries.default_bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes",
                            "-o", "name"], capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "node/kwok-h200-0" in nodes.stdout
    helm = subprocess.run([str(binaries.default_bin_dir() / "helm"), f"--kubeconfig={kubeconfig}", "list", "-A"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "slipstream" in helm.stdout
    again = slipstream("cluster", "up", f"--workdir={workdir}")
    assert again.returncode == 0 and "already up" in again.stderr

    state = json.loads((workdir / "state.json").read_text())
    pids = [state["supervisor_pid"], *state["pids"].values()]
    # The supervisor dies without cleaning up: `down` still stops every recorded process group.
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    down = slipstream("cluster", "down", f"--workdir={workdir}")
    assert down.returncode == 0, down.stderr
    assert "leftover" in down.stderr
    nothing_left(workdir, pids)
    assert slipstream("cluster", "status", f"--workdir={workdir}").returncode == 3
    assert not (workdir / "state.json").exists()


def test_sigterm_of_up_while_it_starts_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    up = subprocess.Popen([sys.executable, "-m", "slipstream.cli", "cluster", "up", f"--workdir={workdir}"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def apiserver_started() -> list[int]:
        found = [pid for pid, cmd in processes_mentioning(str(workdir)) if "kube-apiserver" in cmd]
        assert found, "no apiserver yet"
        return found

    started = eventually(apiserver_started, deadline_s=120, what="the apiserver started by `up`")
    state = json.loads((workdir / "state.json").read_text())
    up.send_signal(signal.SIGTERM)
    _, err = up.communicate(timeout=120)
    assert up.returncode != 0, err
    nothing_left(workdir, [state["supervisor_pid"], *started])
    assert not (workdir / "state.json").exists()


# -- the supervisor restarts what dies ---------------------------------------------------------------

NS = "supervised"
TIME_SCALE = 8.0
"""Twin seconds per wall second, as the closed-loop test and the demo run."""
CANARY_LOAD_S = 1200.0
"""Twin seconds of heterogeneous traffic: the tuner's first canary (within 3 intervals of
60 s, as the closed-loop test holds it to), the kill, and an analysis window after it."""
CANARY_S = (3 * 60 + 120) / TIME_SCALE + 60
"""Wall seconds until the canary: 3 intervals and the queues' warm-up, plus slack."""
RESTART_S = 180
"""Deadline for the stack to be whole again: a backoff of 1 s, the operator's start (kopf's
first lists, ~20 s on a loaded machine), the peering lifetime of the killed one, the rollout."""


class UpCluster:
    """The helpers of test_operator_reconcile and test_rollout take a cluster with
    ``kubectl()`` and a runner with ``simulators()``; `cluster up` gives both through files."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.kubeconfig = workdir / "cluster" / "admin.kubeconfig"

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(binaries.default_bin_dir() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, input=input, check=False)
        assert not check or done.returncode == 0, done.stderr
        return done

    def simulators(self) -> list[dict[str, Any]]:
        return supervisor._simulators(self.workdir)

    def component(self, name: str) -> dict[str, Any]:
        state = json.loads((self.workdir / "state.json").read_text())
        (row,) = [r for r in supervisor.component_rows(state) if r["name"] == name]
        return row


def restarted(up: UpCluster, name: str, old_pid: int, restarts: int) -> dict[str, Any]:
    row = up.component(name)
    assert row["state"] == "running" and row["pid"] != old_pid and row["restarts"] >= restarts, row
    assert not Path(f"/proc/{old_pid}").exists(), f"{name}'s old pid {old_pid} is still listed (a zombie?)"
    return row


ROLLOUT_STARTS = {"CanaryStarted", "CanarySkipped", "RolloutStarted"}
"""The Events a rollout posts once, when it starts (rollout.machine.start)."""


def start_events(cluster: Any, name: str) -> dict[str, str]:
    """The rollout-starting Events of ServingDeployment `name`: uid -> reason and message."""
    return {e["metadata"]["uid"]: f"{e['reason']}: {e.get('message', '')}" for e in events(cluster, NS, name)
            if e["reason"] in ROLLOUT_STARTS}  # fmt: skip


def test_a_sigkilled_operator_is_restarted_and_finishes_its_rollout(tmp_path: Path) -> None:
    """An Auto deployment under heterogeneous traffic starts a rollout (a canary, or straight
    to every pod when the harder cap skips its canary); its engines refuse every change
    (`write-error`: reads answer, /set_internal_state fails), so the rollout is held in phase
    Canary or Promoting, and the operator is SIGKILLed there. The supervisor reaps it and
    starts it again with no hand restart; the engines take changes again, and the restarted
    operator resumes the rollout from status and ends it (promoted, or rolled back by its
    analysis) with every pod on one setting and no engine pod replaced. The rollout that ends
    is the interrupted one, not a fresh one that replaced it: the same candidate, baseline
    and reason in status.rollout, the same `startedAt` when it was held in Promoting (the
    phase that ends it; a Canary goes on to phases of their own), and no rollout-starting
    Event (CanaryStarted, CanarySkipped, RolloutStarted) besides the one it posted before
    the kill. Then a SIGKILLed
    Prometheus comes back the same way, `cluster restart` restarts one on request, and
    `cluster status` says ready again."""
    workdir = tmp_path / "cluster"
    env = {"SLIPSTREAM_ADMIN_TIMEOUT_SECONDS": "1", "SLIPSTREAM_ADMIN_ATTEMPTS": "1000",
           "SLIPSTREAM_PEERING_LIFETIME_SECONDS": "10"}  # fmt: skip
    up_run = slipstream("cluster", "up", f"--workdir={workdir}", f"--time-scale={TIME_SCALE:g}",
                        *[f"--operator-env={k}={v}" for k, v in env.items()])  # fmt: skip
    assert up_run.returncode == 0, up_run.stderr
    load = None
    try:
        up = UpCluster(workdir)
        written = (workdir / "cluster" / "operator.env").read_text()
        assert "python" in written and "-m slipstream.runtime_only" in written, written
        for key in ("KUBECONFIG", "SLIPSTREAM_ENGINE_NETWORKS", "SLIPSTREAM_ADMIN_ATTEMPTS"):
            assert f"\n{key}=" in written, written
        sv: Any = up  # the helpers' parameters are typed for localkube.Cluster and PodRunner
        state = json.loads((workdir / "state.json").read_text())
        kubeconfig = Path(state["kubeconfig"])
        target = loop.Target(kubeconfig, binaries.default_bin_dir() / "kubectl",
                             apiread.ApiReader.from_kubeconfig(kubeconfig), TIME_SCALE,
                             state["prometheus_url"])  # fmt: skip
        up.kubectl("create", "namespace", NS)
        name = "supervised"
        # From stock (T 0, ceiling tuner): heterogeneous traffic then makes Auto move. The demo's
        # default reflex:4096 is already the best setting there and would start no rollout.
        sd = loop.serving_deployment(name, target.prometheus_url, mode="Auto", replicas=2, interval_s=60,
                                     cooldown_s=180, analysis_s=120, max_concurrency=2, threshold=0,
                                     engine_mode="ceiling", schedule_policy="fcfs")  # fmt: skip
        sd["metadata"]["namespace"] = NS
        target.apply(sd)
        pods = engines(sv, sv, NS, name)
        eventually(lambda: in_sync(sv, NS, name), deadline_s=RESTART_S, what="in sync")
        identities = pod_identities(sv, NS, name)
        for engine in pods.values():
            engine.fault("write-error")
        workload, _ = phases.plan(CANARY_LOAD_S, replicas=2, kinds=(phases.HETEROGENEOUS,))
        load = loop.LoadRun(workload.requests, target.targets(NS, name), TIME_SCALE).start()

        def in_flight() -> dict[str, Any]:
            rollout = (must_get(sv, "sd", name, NS).get("status") or {}).get("rollout") or {}
            # A harder cap skips its canary (rollout.machine.skip_canary): then the promotion
            # to every pod is what the failing writes hold.
            assert rollout.get("phase") in ("Canary", "Promoting") and rollout.get("attempts", 0) >= 1, rollout
            return rollout

        rollout = eventually(in_flight, deadline_s=CANARY_S, what="a rollout held by its engines' failing writes")

        def its_start_event() -> dict[str, str]:
            # The rollout in flight posted its start Event (kopf posts after the step's status
            # write): wait for it, so that one posted later can only be a new rollout's.
            found = start_events(sv, name)
            assert len(found) == 1, found
            return found

        started_before = eventually(its_start_event, deadline_s=RESTART_S, what="the rollout's start Event")
        operator = up.component("operator")
        os.kill(operator["pid"], signal.SIGKILL)
        for engine in pods.values():
            engine.fault("ok")
        print(f"operator SIGKILLed in phase {rollout['phase']}: candidate {rollout.get('candidate')}, "
              f"canaries {rollout.get('canaryPods')}")  # fmt: skip
        eventually(lambda: restarted(up, "operator", operator["pid"], 1), deadline_s=RESTART_S,
                   what="the operator restarted by the supervisor")  # fmt: skip

        def finished() -> dict[str, Any]:
            st = must_get(sv, "sd", name, NS)["status"]
            ended = st["rollout"]
            assert ended["phase"] == "Idle" and ended.get("result") in ("Promoted", "RolledBack"), ended
            assert ended.get("finishedAt", "") > rollout["startedAt"], (ended, rollout)
            assert set(thresholds(pods).values()) == {st["threshold"]}, (thresholds(pods), st["threshold"])
            in_sync(sv, NS, name)
            return ended

        ended = eventually(finished, deadline_s=RESTART_S, what="the rollout ended, every pod on one setting")
        print(f"after the restart the rollout ended {ended['result']}: {ended.get('message') or ''}")
        # The interrupted rollout is the one that ended, resumed from status: a restarted
        # operator that started afresh would post another start Event and a new startedAt.
        assert start_events(sv, name) == started_before, "a new rollout started after the restart"
        if rollout["phase"] == "Promoting":
            assert (ended["result"], ended["startedAt"]) == ("Promoted", rollout["startedAt"]), (ended, rollout)
        for key in ("candidate", "baseline", "reason"):
            assert ended.get(key) == rollout.get(key), (key, ended, rollout)
        assert pod_identities(sv, NS, name) == identities, "no engine pod replaced"
        load.stop()  # the rollout has ended: the rest of the traffic adds nothing
        load.join(timeout_s=CANARY_LOAD_S / TIME_SCALE + 120)
        load = None

        prometheus = up.component("prometheus")
        os.kill(prometheus["pid"], signal.SIGKILL)
        eventually(lambda: restarted(up, "prometheus", prometheus["pid"], 1), deadline_s=RESTART_S,
                   what="Prometheus restarted by the supervisor")  # fmt: skip
        before = up.component("prometheus")
        asked = slipstream("cluster", "restart", "prometheus", f"--workdir={workdir}")
        assert asked.returncode == 0 and "restarted prometheus" in asked.stderr, asked.stderr
        restarted(up, "prometheus", before["pid"], before["restarts"] + 1)
        wrong = slipstream("cluster", "restart", "nope", f"--workdir={workdir}")
        assert wrong.returncode == 2 and "COMPONENT is one of:" in wrong.stderr and "operator" in wrong.stderr

        status = slipstream("cluster", "status", f"--workdir={workdir}")
        assert status.returncode == 0 and status.stdout.startswith("ready"), status.stdout
        lines = status.stdout.splitlines()
        for component in ("etcd", "kube-apiserver", "prometheus", "operator", "engine-pod-runner"):
            assert any(line.split()[:1] == ["running"] and f" {component} " in line for line in lines), status.stdout
    finally:
        if load is not None:
            load.stop()
            load.join(timeout_s=CANARY_LOAD_S / TIME_SCALE + 120)
        state = json.loads((workdir / "state.json").read_text()) if (workdir / "state.json").exists() else {}
        down = slipstream("cluster", "down", f"--workdir={workdir}")
    assert down.returncode == 0, down.stderr
    nothing_left(workdir, [int(p) for p in state.get("pids", {}).values()])
