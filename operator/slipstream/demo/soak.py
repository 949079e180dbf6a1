"""``slipstream soak``: the closed loop for hours of twin time, faults injected at random.

1. Start a local stack of its own (control plane, Prometheus, the chart installed with
   ``helm install``, the operator as the chart's ServiceAccount, the engine-pod runner).
2. ``kubectl apply`` a ServingDeployment in mode Auto with the ceiling tuner from stock
   (it moves on the diurnal mix's phase changes, so canaries happen to be interrupted),
   two simulated engines.
3. Replay the diurnal mix (``soak_plan.diurnal_workload``) time-scaled, and meanwhile:
   sample the status and every engine's setting (``/metrics``), the operator's RSS, its
   Events; and inject the seeded faults (``soak_plan.plan_faults``) at their twin times,
   recording when each began and ended.
4. Judge the run (``soak_plan.judge``), print the figures and each check, optionally
   write them as JSON; exit 1 when a check fails.

Faults as injected: ``kube-apiserver`` and ``etcd`` restarted (``Cluster.restart``);
``prometheus-restart`` (``PrometheusServer.restart``) and ``prometheus-outage`` (stopped
for ``hold_s``, then started on its port and data); ``operator-sigkill`` (armed at its
time, it fires at the first canary in flight after it, while no other fault is being
injected, or at the end of the faults' span if none comes; the stack then starts the
operator again as a kubelet would: ``Killer``); ``engine-pod-delete`` (one engine pod deleted; it ends when
the Service has every replica again); ``admin-timeout`` (one engine's admin endpoint hangs
for ``hold_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Self

from slipstream.demo import loop, soak_plan
from slipstream.demo.soak_plan import FaultRun, FleetSample, MemorySample, SoakFault, SoakLimits
from slipstream.sim.metrics import nearest_rank

NAMESPACE = "slipstream-soak"
NAME = "soak"
REPLICAS = 2
INTERVAL_S = 60
COOLDOWN_S = 180
ANALYSIS_S = 120
MID_CANARY = ("Canary", "Analysis")
"""The rollout phases an armed operator kill waits for."""
PEERING_LIFETIME_S = 10
"""The operator's kopf peering lifetime here (wall s; the chart's default is 60): a
SIGKILLed operator's successor waits this out before it acts."""
SAMPLE_S = 1.0
"""Wall seconds between samples of the fleet and the operator's memory."""
READY_S = 120.0
SHOWN = {"Overloaded", "TuningStepFailed", "ModelMismatch", "StalePodCorrected", "Recreated"}
"""Events printed as they come, besides the moves and the canaries' ends."""


def engine_gauges(url: str, timeout_s: float = 2.0) -> tuple[int, str, str]:
    """(threshold, mode, order) an engine reports on its /metrics (the patch's gauges)."""
    from prometheus_client.parser import text_string_to_metric_families

    from slipstream.engine import metrics as m

    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    threshold, mode, order = None, "", ""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == m.LONG_PREFILL_TOKEN_THRESHOLD:
                threshold = int(s.value)
            elif s.name == m.LONG_PREFILL_MODE and s.value == 1:
                mode = s.labels.get("mode", "")
            elif s.name == m.SCHEDULE_POLICY and s.value == 1:
                order = s.labels.get("policy", "")
    if threshold is None:
        raise ValueError(f"{url}: no {m.LONG_PREFILL_TOKEN_THRESHOLD}")
    return threshold, mode, order


def status_setting(doc: dict[str, Any] | None) -> tuple[int, str, str] | None:
    if not doc or doc.get("threshold") is None:
        return None
    return (
        int(doc["threshold"]),
        str(doc.get("mode") or "ceiling"),
        str(doc.get("schedulePolicy") or "fcfs"),
    )


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Background:
    """A daemon thread running ``_run`` until ``stop``, which its loop polls through
    ``_stop`` (an Event it also sleeps on, so a stop ends the wait at once)."""

    name = "soak"
    join_s = 10.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.join_s)

    def _run(self) -> None:
        raise NotImplementedError


class Samplers(Background):
    """Background sampling of the fleet and the operator's memory, once a SAMPLE_S."""

    name = "soak-samplers"

    def __init__(
        self,
        target: loop.Target,
        stack: Any,
        urls: Callable[[], list[str]],
        twin_now: Callable[[], float],
    ):
        self.target, self.stack, self.urls, self.twin_now = target, stack, urls, twin_now
        self.fleet: list[FleetSample] = []
        self.memory: list[MemorySample] = []
        self.errors = 0
        super().__init__()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except (OSError, ValueError, KeyError):
                self.errors += 1
            self._stop.wait(SAMPLE_S)

    def sample(self) -> None:
        operator = self.stack.operator
        if operator is not None and (rss := rss_mb(operator.pid)) is not None:
            self.memory.append(MemorySample(self.twin_now(), operator.pid, rss))
        sd = self.target.get_sd(NAMESPACE, NAME)
        status = (sd or {}).get("status") or {}
        rollout = status.get("rollout") or {}
        engines = {}
        for url in self.urls():
            try:
                engines[url] = engine_gauges(url)
            except (OSError, ValueError):
                self.errors += 1
        self.fleet.append(FleetSample(self.twin_now(), status_setting(status), str(rollout.get("phase") or "Idle"),
                                      status_setting(rollout.get("candidate")), engines))  # fmt: skip


class Injector(Background):
    """Injects the planned faults at their twin times in a thread; records each. The
    operator kills go to a `Killer` of their own, so that waiting for a canary delays no
    other fault; ``busy`` keeps any two faults from being injected at once.

    deadline_s: the twin time by which an armed kill fires, canary or not."""

    name = "soak-faults"
    join_s = READY_S

    def __init__(self, stack: Any, target: loop.Target, faults: list[SoakFault], twin_now: Callable[[], float],
                 samplers: Samplers, seed: int, deadline_s: float):  # fmt: skip
        self.stack, self.target, self.twin_now = stack, target, twin_now
        self.faults = [f for f in faults if f.kind != "operator-sigkill"]
        self.samplers = samplers
        self.rng = random.Random(f"slipstream-soak-targets-{seed}")
        self.runs: list[FaultRun] = []
        self.error: BaseException | None = None
        self.busy = threading.Lock()
        self.killer = Killer(self, [f for f in faults if f.kind == "operator-sigkill"], deadline_s)
        super().__init__()

    def start(self) -> Self:
        self.killer.start()
        return super().start()

    def stop(self) -> None:
        super().stop()
        self.killer.stop()
        self.error = self.error or self.killer.error
        self.runs.sort(key=lambda r: r.start_s)

    def wait_twin(self, at_s: float, stop: threading.Event) -> bool:
        while self.twin_now() < at_s:
            if stop.wait(0.2):
                return False
        return True

    def record(self, fault: SoakFault, start: float, note: str) -> None:
        self.runs.append(FaultRun(fault, start, self.twin_now(), note))
        print(f"  [{start:7.0f}s] fault {fault.kind}: {note} (ended {self.twin_now():.0f} s)", flush=True)

    def _run(self) -> None:
        try:
            for fault in self.faults:
                if not self.wait_twin(fault.at_s, self._stop):
                    return
                with self.busy:
                    start = self.twin_now()
                    self.record(fault, start, self.inject(fault))
        except BaseException as exc:  # noqa: BLE001 - the run reports it
            self.error = exc

    def inject(self, fault: SoakFault) -> str:
        """Do one fault; return once it is over (the part back, the hold passed)."""
        kind = fault.kind
        scale = self.target.time_scale
        if kind in ("kube-apiserver", "etcd"):
            return f"down {self.stack.cluster.restart(kind):.1f} wall s"
        prometheus = self.stack.prometheus
        if kind == "prometheus-restart":
            t0 = time.monotonic()
            prometheus.restart()
            return f"down {time.monotonic() - t0:.1f} wall s"
        if kind == "prometheus-outage":
            prometheus.stop_server()
            self._stop.wait(fault.hold_s / scale)
            prometheus.restart()
            return f"stopped for {fault.hold_s:.0f} twin s"
        if kind == "engine-pod-delete":
            return self.delete_pod()
        if kind == "admin-timeout":
            return self.hang_admin(fault.hold_s)
        raise ValueError(f"unknown fault kind {kind!r}")

    def delete_pod(self) -> str:
        pods = sorted(p["metadata"]["name"] for p in self.target.pods(NAMESPACE, NAME))
        victim = self.rng.choice(pods)
        self.target.kubectl("delete", "pod", victim, f"--namespace={NAMESPACE}", "--wait=false")
        service = self.target.targets(NAMESPACE, NAME)
        loop.wait_for(lambda: victim not in {p["metadata"]["name"] for p in self.target.pods(NAMESPACE, NAME)}
                      and len(service.refresh()) >= REPLICAS, READY_S, "the deleted pod replaced")  # fmt: skip
        return f"deleted {victim}; {REPLICAS} engines answer again"

    def hang_admin(self, hold_s: float) -> str:
        urls = sorted(self.samplers.urls())
        url = self.rng.choice(urls)
        key = self.target.admin_key(NAMESPACE, NAME)

        def faults(mode: str) -> None:
            body = json.dumps({"admin": mode}).encode()
            request = urllib.request.Request(f"{url}/slipstream/faults", data=body, headers={
                "Authorization": f"Bearer {key}", "Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=5):
                pass

        faults("timeout")
        try:
            self._stop.wait(hold_s / self.target.time_scale)
        finally:
            faults("ok")
        return f"{url}'s admin endpoint hung for {hold_s:.0f} twin s"


class Killer(Background):
    """The operator kills: each armed at its planned twin time, fired at the first sample
    that shows a canary in flight (`MID_CANARY`) while no other fault is being injected, or
    at ``deadline_s`` whatever the rollout does. Its fault starts when it fires."""

    name = "soak-kills"
    join_s = READY_S

    def __init__(self, injector: Injector, kills: list[SoakFault], deadline_s: float):
        self.injector, self.kills, self.deadline_s = injector, kills, deadline_s
        self.error: BaseException | None = None
        super().__init__()

    def _run(self) -> None:
        inj = self.injector
        try:
            for fault in self.kills:
                if not inj.wait_twin(fault.at_s, self._stop) or not self.fire(fault):
                    return
        except BaseException as exc:  # noqa: BLE001 - the run reports it
            self.error = exc

    def fire(self, fault: SoakFault) -> bool:
        """Wait for a canary (or the deadline), kill, start again; False when stopped."""
        inj = self.injector
        while not self._stop.is_set():
            if self._due() and inj.busy.acquire(timeout=0.2):
                try:
                    latest = self._latest()  # read again: the lock may have taken a while
                    if not self._due():
                        continue
                    start = inj.twin_now()
                    phase = latest.rollout_phase if latest is not None else "?"
                    os.kill(inj.stack.operator.pid, signal.SIGKILL)
                    time.sleep(1.0)  # the kubelet's first restart backoff (restarts.RestartBackoff.initial_s)
                    inj.stack.restart_operator()
                    inj.record(fault, start, f"SIGKILLed with the rollout {phase} (armed at {fault.at_s:.0f} s), "
                                             "started again")  # fmt: skip
                finally:
                    inj.busy.release()
                return True
            self._stop.wait(0.2)
        return False

    def _latest(self) -> Any:
        fleet = self.injector.samplers.fleet
        return fleet[-1] if fleet else None

    def _due(self) -> bool:
        """A kill may fire now: the last sample shows a canary in flight, or it is late."""
        latest = self._latest()
        mid = latest is not None and latest.rollout_phase in MID_CANARY
        return mid or self.injector.twin_now() >= self.deadline_s


def limits_for(time_scale: float) -> SoakLimits:
    """The checks' bounds for the soak's ServingDeployment at ``time_scale``: a rollout
    may last its canary's analysis window, a few retry rounds and an operator restart's
    peering wait; the samplers see a fault's end up to a period late."""
    peering_twin_s = (PEERING_LIFETIME_S + 5) * time_scale
    return SoakLimits(
        analysis_s=ANALYSIS_S,
        interval_s=INTERVAL_S,
        stuck_s=3 * ANALYSIS_S + 2 * INTERVAL_S + peering_twin_s,
        slack_s=2 * SAMPLE_S * time_scale + peering_twin_s,
    )


def soak(stack: Any, target: loop.Target, args: argparse.Namespace) -> dict[str, Any]:
    """Run the soak on a started stack; return its figures and checks."""
    duration = args.hours * 3600.0
    tail_s = 2 * ANALYSIS_S + INTERVAL_S
    faults = soak_plan.plan_faults(args.seed, duration, min_gap_s=args.fault_gap_s, warmup_s=args.warmup_s,
                                   tail_s=tail_s, hold_s=args.hold_s)  # fmt: skip
    workload, spans = soak_plan.diurnal_workload(args.seed, duration, args.phase_s, REPLICAS, args.start_hour)
    print(f"soak: {duration / 3600:.1f} twin h at x{target.time_scale:g} ({duration / target.time_scale / 60:.0f} "
          f"wall min), {len(workload.requests)} requests in {len(spans)} phases, {len(faults)} faults", flush=True)  # fmt: skip
    target.kubectl("create", "namespace", NAMESPACE, check=False)
    sd = loop.serving_deployment(NAME, target.prometheus_url, engine_mode="ceiling", threshold=0,
                                 schedule_policy="fcfs", interval_s=INTERVAL_S, cooldown_s=COOLDOWN_S,
                                 analysis_s=ANALYSIS_S)  # fmt: skip
    sd["metadata"]["namespace"] = NAMESPACE
    target.apply(sd)
    service = loop.wait_for(lambda: _service(target), READY_S, "the engine Service")
    loop.wait_for(
        lambda: len(service()) >= REPLICAS,
        READY_S,
        f"{REPLICAS} engine simulators answering /health",
    )
    watcher = loop.Watcher(target, NAMESPACE, NAME, on_event=_print_event)
    load = loop.LoadRun(workload.requests, service, target.time_scale)
    samplers = Samplers(target, stack, service, watcher.twin_now)
    injector = Injector(stack, target, faults, watcher.twin_now, samplers, args.seed, deadline_s=duration - tail_s)
    wall0 = time.monotonic()
    load.start()
    watcher.t0 = load.t0
    watcher.start(), samplers.start(), injector.start()
    try:
        results = load.join(timeout_s=duration / target.time_scale + 600)
        # Let the last rollout finish: a soak that ends mid-canary has not shown it ends.
        _wait_idle(samplers, target.time_scale)
    finally:
        injector.stop(), watcher.stop(), samplers.stop()
    if injector.error is not None:
        raise RuntimeError(f"a fault could not be injected: {injector.error!r}") from injector.error
    checks = soak_plan.judge(
        injector.runs,
        watcher.events,
        samplers.fleet,
        samplers.memory,
        limits_for(target.time_scale),
    )
    return _figures(args, target, wall0, results, watcher, samplers, injector, checks)


def _wait_idle(samplers: Samplers, time_scale: float) -> None:
    deadline = (
        time.monotonic() + (3 * ANALYSIS_S + 2 * INTERVAL_S) / time_scale + 2 * PEERING_LIFETIME_S
    )
    while time.monotonic() < deadline:
        latest = samplers.fleet[-1] if samplers.fleet else None
        if latest is not None and latest.rollout_phase in ("", "Idle"):
            return
        time.sleep(SAMPLE_S)


def _figures(args: argparse.Namespace, target: loop.Target, wall0: float, results: list[loop.Result],
             watcher: loop.Watcher, samplers: Samplers, injector: Injector,
             checks: list[soak_plan.SoakCheck]) -> dict[str, Any]:  # fmt: skip
    reasons: dict[str, int] = {}
    for e in watcher.events:
        reasons[str(e.get("reason"))] = reasons.get(str(e.get("reason")), 0) + 1
    late = sorted(r.late_s for r in results)
    settle = soak_plan.settle_times(injector.runs, samplers.fleet)
    return {
        "seed": args.seed,
        "hours": args.hours,
        "time_scale": target.time_scale,
        "wall_s": round(time.monotonic() - wall0, 1),
        "requests": len(results),
        "failed": sum(1 for r in results if not r.ok),
        "send_lag_p99_twin_s": round(nearest_rank(late, 99), 2) if late else None,
        "events": reasons,
        "faults": [
            {
                **asdict(r.fault),
                "start_s": round(r.start_s, 1),
                "end_s": round(r.end_s, 1),
                "note": r.note,
                "settled_after_s": None if t is None else round(t, 1),
            }
            for r, t in zip(injector.runs, settle, strict=True)
        ],  # fmt: skip
        "sample_errors": samplers.errors,
        "watch_errors": watcher.errors,
        "checks": [asdict(c) for c in checks],
        "ok": all(c.ok for c in checks),
    }


def _service(target: loop.Target) -> Any:
    try:
        return target.targets(NAMESPACE, NAME)
    except OSError:
        return None


def _print_event(event: dict[str, Any]) -> None:
    if event.get("reason") in soak_plan.MOVES | soak_plan.DECISION_ENDS | SHOWN:
        print(f"  [{event['_twin_s']:7.0f}s] {event.get('type', '')} {event.get('reason', '')}: "
              f"{str(event.get('message', ''))[:160]}", flush=True)  # fmt: skip


def report(figures: dict[str, Any]) -> None:
    print(f"\n{figures['requests']} requests ({figures['failed']} failed), send lag p99 "
          f"{figures['send_lag_p99_twin_s']} twin s, {figures['wall_s']:.0f} wall s")  # fmt: skip
    print("events: " + ", ".join(f"{k} {v}" for k, v in sorted(figures["events"].items())))
    for f in figures["faults"]:
        print(f"  {f['kind']:20s} at {f['start_s']:7.0f} s, ended {f['end_s']:7.0f} s, fleet accounted for "
              f"{f['settled_after_s']} s later: {f['note']}")  # fmt: skip
    for c in figures["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
    print("soak: " + ("every check passed" if figures["ok"] else "FAILED"))


def run(args: argparse.Namespace) -> int:
    from slipstream.localkube import stack as stack_mod

    env = {"SLIPSTREAM_PEERING_LIFETIME_SECONDS": str(PEERING_LIFETIME_S)}
    with tempfile.TemporaryDirectory(prefix="slipstream-soak-") as tmp:
        print("starting a local control plane, Prometheus and the operator (~30 s) ...", flush=True)
        started = stack_mod.Stack.start(
            Path(tmp), stack_mod.StackOptions(time_scale=args.time_scale, operator_env=env)
        )
        try:
            cluster = started.cluster
            target = loop.Target(cluster.kubeconfig, cluster.bin_dir / "kubectl", cluster.reader, args.time_scale,
                                 str(started.prometheus.url))  # fmt: skip
            figures = soak(started, target, args)
        finally:
            started.stop()
    report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if figures["ok"] else 1


FLAGS: tuple[tuple[str, type, Any, str, str | None], ...] = (
    ("--hours", float, 12.0, "twin hours of diurnal traffic", None),
    ("--seed", int, 1, "traffic and fault seed", None),
    ("--time-scale", float, 16.0, "twin seconds per wall second", "S"),
    ("--phase-s", float, 1800.0, "twin seconds per traffic phase", None),
    ("--fault-gap-s", float, 1800.0, "least twin seconds between two faults' starts", None),
    ("--warmup-s", float, 600.0, "twin seconds before the first fault", None),
    ("--hold-s", float, 120.0, "twin seconds a Prometheus outage or a hanging admin endpoint lasts", None),
    ("--start-hour", float, soak_plan.START_HOUR, "the twin clock's hour of the day at the start", None),
)
"""The soak's numeric flags: (flag, type, default, what it is, metavar)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="the closed loop for hours of twin time with seeded faults, judged")
    for flag, kind, default, what, metavar in FLAGS:
        p.add_argument(flag, type=kind, default=default, metavar=metavar, help=f"{what} (default %(default)s)")
    p.add_argument("--json", help="write the figures and checks to this file")
    p.set_defaults(func=run)
