"""``slipstream demo`` (``make demo``): the operator tuning live traffic, on this machine.

1. Reuse a running ``slipstream cluster up`` (its kubeconfig and time scale), or
   start a stack of its own (control plane, Prometheus, chart installed with
   ``helm install``, the operator as the chart's ServiceAccount, the engine-pod
   runner) in a temporary directory.
2. ``kubectl apply`` a ServingDeployment in mode Auto in namespace
   ``slipstream-demo``; wait until its two simulated engines answer /health.
3. Replay the phases (slipstream.demo.phases: documents, heterogeneous,
   documents) against the engine Service's ready pods, time-scaled, while
   printing the ServingDeployment's Events as they happen and a status line
   (setting, the share of prefill passes the engines capped over the last minute,
   heterogeneity, per-tenant p99 TTFT) under a progress bar.
4. Print Auto beside Off and the best static setting (slipstream.demo.offline: the twin on
   the same traffic for all, and the live Auto run beside it), whole phases.
5. Print the kubectl commands that show the same, write a PNG of the setting, the share
   of prefill passes capped (per minute, read from the engines' /metrics) and per-tenant
   p99 TTFT of the short requests (giants apart) over time, and clean up: the namespace
   when the stack was reused, the whole stack when it was its own.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from slipstream.demo import loop, phases

NAMESPACE = "slipstream-demo"
NAME = "kimi-demo"
DEFAULT_TIME_SCALE = 8.0
"""Twin seconds per wall second: three 720 s phases take 4.5 minutes."""

DEFAULT_PHASE_S = 720.0
CAPPED_WINDOW_S = 60.0
"""Twin seconds of prefill passes behind the status line's "capping N% of passes"."""
READY_S = 120.0


@contextlib.contextmanager
def target_for(args: argparse.Namespace) -> Iterator[tuple[loop.Target, bool]]:
    """(target, reused): a running `cluster up`, else a stack of our own until the block ends.
    Progress goes to stderr under ``--json``, so stdout stays one JSON document."""
    from slipstream.localkube import apiread, binaries, supervisor

    out = sys.stderr if getattr(args, "json", False) else sys.stdout

    workdir = Path(args.workdir).expanduser().resolve()
    state = supervisor.read_state(workdir)
    pid = int(state.get("supervisor_pid", 0)) if state else 0
    if state and state.get("phase") == "Ready" and pid > 1 and supervisor.alive(pid):
        kubeconfig = Path(state["kubeconfig"])
        print(f"reusing the running cluster in {workdir} (slipstream cluster up)", file=out)
        yield loop.Target(kubeconfig, binaries.default_bin_dir() / "kubectl",
                          apiread.ApiReader.from_kubeconfig(kubeconfig), float(state["time_scale"]),
                          state["prometheus_url"]), True  # fmt: skip
        return
    from slipstream.localkube import stack

    with tempfile.TemporaryDirectory(prefix="slipstream-demo-") as tmp:
        print("starting a local control plane, Prometheus and the operator (~30 s) ...", file=out, flush=True)
        started = stack.Stack.start(Path(tmp), stack.StackOptions(time_scale=args.time_scale))
        try:
            cluster = started.cluster
            yield loop.Target(cluster.kubeconfig, cluster.bin_dir / "kubectl",
                              cluster.reader, args.time_scale, _url(started)), False  # fmt: skip
        finally:
            print("stopping the local stack ...", file=out, flush=True)
            started.stop()


def _url(started: Any) -> str:
    assert started.prometheus is not None
    return str(started.prometheus.url)


def run(args: argparse.Namespace) -> int:
    with target_for(args) as (target, reused):
        try:
            return _demo(target, args)
        finally:
            if reused:
                target.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def workload_of(args: argparse.Namespace) -> tuple[Any, list[phases.Phase]]:
    """The phases to replay: the demo's own (``builtin:demo``, ``--phase-s`` each) or a
    phased workload file, specs or traces (``loopbench.load_phases``)."""
    name = getattr(args, "workload", "builtin:demo")
    if name == "builtin:demo":
        return phases.plan(args.phase_s, replicas=2)  # the demo's two engines
    from slipstream.demo import loopbench

    return loopbench.load_phases(name)


def _demo(target: loop.Target, args: argparse.Namespace) -> int:
    scale = target.time_scale
    target.kubectl("create", "namespace", NAMESPACE, check=False)
    # No admin-key Secret of our own: the operator generates the engines' key (and may read
    # no Secrets it has not been granted; see docs/operator.md, RBAC).
    sd = loop.serving_deployment(NAME, target.prometheus_url)
    sd["metadata"]["namespace"] = NAMESPACE
    target.apply(sd)
    print(f"applied ServingDeployment {NAMESPACE}/{NAME} (mode Auto, 2 simulated engines, "
          f"time x{scale:g})")  # fmt: skip
    targets = loop.wait_for(lambda: _service_targets(target), READY_S, "the engine Service")
    loop.wait_for(lambda: len(targets()) >= 2, READY_S, "two engine simulators answering /health")
    workload, spans = workload_of(args)
    total = spans[-1].end_s
    bar = tqdm(total=round(total), unit="twin s", file=sys.stdout, dynamic_ncols=True,
               bar_format="{desc} {bar} {n_fmt}/{total_fmt} twin s")  # fmt: skip

    def on_event(event: dict[str, Any]) -> None:
        bar.write(f"  [{event['_twin_s']:6.0f}s] {event.get('type', '')} {event.get('reason', '')}: "
                  f"{event.get('message', '')}")  # fmt: skip

    # The engines' own pass counters, read from their /metrics beside the status: in reflex
    # mode the setting stays put while the engines cap only the passes that need it.
    watcher = loop.Watcher(target, NAMESPACE, NAME, on_event=on_event, engines=targets).start()
    load = loop.LoadRun(workload.requests, targets, scale).start()
    watcher.t0 = load.t0
    try:
        while load.running():
            now = watcher.twin_now()
            phase = next((p for p in spans if p.holds(now)), spans[-1])
            bar.n = min(round(now), bar.total)
            latest = watcher.latest
            line = loop.status_line(latest, watcher.capped_share(CAPPED_WINDOW_S)) if latest else "waiting for status"
            bar.set_description_str(f"{phase.name:16s} {line}"[:150])
            bar.refresh()
            time.sleep(0.5)
        results = load.join()
    finally:
        bar.close()
        watcher.stop()
    print()
    for p in spans:
        p99 = loop.tenant_p99(results, p.start_s, p.end_s)
        shown = "  ".join(f"{t} {v:.2f}s" for t, v in p99.items())
        share = loop.capped_share(watcher.passes, p.start_s, p.end_s)
        capped = "" if share is None else f"; passes capped {share:.0%}"
        print(f"{p.name:16s} p99 TTFT per tenant (twin s): {shown}{capped}")
    failed = sum(1 for r in results if not r.ok)
    print(f"{len(results)} requests, {failed} failed")
    out = Path(args.plot)
    from slipstream.demo import plot

    plot.timeline(watcher.samples, results, spans, out, {r.rid: r.prompt_tokens for r in workload.requests},
                  watcher.passes)  # fmt: skip
    print(f"wrote {out}")
    print_comparison(workload, spans, results)
    print("\nTo watch the same by hand: `slipstream cluster up`, `export KUBECONFIG=...` as it prints,")
    print("then `make demo` (it reuses that cluster), and in another terminal:")
    for command in (
        f"kubectl -n {NAMESPACE} get sd",
        f"kubectl -n {NAMESPACE} describe sd {NAME}",
        f"kubectl -n {NAMESPACE} get events --field-selector involvedObject.name={NAME}",
        f"kubectl -n {NAMESPACE} get pods -o wide",
        f"kubectl -n {NAMESPACE} get cm {NAME}-engine-setting -o yaml",
    ):
        print(f"  {command}")
    print("The twin's benchmark of every policy: slipstream bench --workload builtin:multi-tenant")
    return 0


def print_comparison(workload: Any, spans: list[phases.Phase], live: list[loop.Result]) -> None:
    """Auto beside Off and the best constants in hindsight: the twin on the same generated
    traffic for the constants (every setting within the demo's bounds in any mode,
    ``offline.CONSTANTS``, each run once; running the live stack once per setting would take
    twelve times the demo's time, and the engine simulators are that twin in real time) and
    the live Auto run. Worst tenant's p99 TTFT over whole phases, each from its first second
    (no settling exclusion); per phase against that phase's best constant and over its
    first minute (``offline.judge``); and the verdict against the targets (``loopbench``'s)."""
    from slipstream.demo import loopbench, offline

    print("\nthe same traffic on the twin (two engines; about a minute), worst tenant's p99 TTFT "
          "over whole phases, twin s:")
    statics = offline.static_figures(workload, spans)
    ranked = sorted(statics, key=lambda name: statics[name].whole)
    auto_figures = offline.span_figures(offline.Run(live), spans)
    rows = {"auto (live, above)": auto_figures, "stock (Off)": statics["stock"]}
    for rank, name in enumerate(ranked[:2]):
        rows[f"{name} ({'best' if rank == 0 else 'second best'} static)"] = statics[name]
    cols = [p.name for p in spans] + ["whole"]
    print(f"  {'setting':36s}" + "".join(f"{c:>18s}" for c in cols))
    for name, fig in rows.items():
        print(f"  {name:36s}" + "".join(f"{v:18.2f}" for v in (*fig.phases, fig.whole)))
    print("per phase, the live Auto against that phase's best constant (the per-phase oracle), twin s:")
    print("\n".join(offline.judgement_lines(offline.judge(auto_figures, statics, spans))))
    auto, off, best_name = auto_figures.whole, statics["stock"].whole, ranked[0]
    best = statics[best_name].whole
    ok = auto <= loopbench.TARGET_VS_BEST * best and auto <= loopbench.TARGET_VS_OFF * off
    print(f"Auto (live) {auto:.2f} s over the whole run: {auto / best:.2f}x the best static setting "
          f"({best_name}, {best:.2f} s) and {auto / off:.2f}x Off ({off:.2f} s); targets "
          f"{loopbench.TARGET_VS_BEST:g}x and {loopbench.TARGET_VS_OFF:g}x: {'met' if ok else 'MISSED'}")


def _service_targets(target: loop.Target) -> Any:
    try:
        return target.targets(NAMESPACE, NAME)
    except OSError:
        return None


def add_parser(sub: Any) -> None:
    from slipstream.localkube import supervisor

    demo = sub.add_parser("demo", help="the operator tuning live simulated traffic on a local cluster")
    demo.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE, metavar="S",
                      help="twin seconds per wall second (default %(default)s; a reused cluster keeps its own)")  # fmt: skip
    demo.add_argument("--workload", default="builtin:demo", metavar="builtin:demo|FILE",
                      help="the phased workload (default %(default)s; FILE: specs or traces per phase, "
                           "as slipstream loopbench's)")  # fmt: skip
    demo.add_argument("--phase-s", type=float, default=DEFAULT_PHASE_S, metavar="SECONDS",
                      help="builtin:demo: twin seconds per phase (default %(default)s)")  # fmt: skip
    demo.add_argument("--plot", default="out/demo-timeline.png", help="PNG to write (default %(default)s)")
    demo.add_argument("--workdir", default=str(supervisor.DEFAULT_WORKDIR),
                      help="a running `slipstream cluster up` to reuse (default %(default)s)")  # fmt: skip
    demo.set_defaults(func=run)
