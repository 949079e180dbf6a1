"""``slipstream loopbench``: the closed loop measured live against the best static settings.

Mode Auto is worth running only if it beats leaving a good setting on. This benchmark
replays one phased workload on the real stack (control plane, Prometheus, the operator
installed with helm, simulated engines), one run per setting, reusing one stack:

1. The twin ranks the static settings the demo considers (``offline.STATIC``) on the same
   traffic, in hindsight, and the two best over the whole run are taken.
2. Runs, one after the other, each in a fresh namespace: Auto (from the demo's reflex), Off, and the
   two static settings (mode Fixed). Each run is the demo's ServingDeployment (two engine
   simulators) under the workload's requests, time-scaled.
3. Per run: per-phase and whole-run p99 TTFT per tenant, every phase counted from its
   first second (no settling period left out); the time from each phase change to the
   fleet running the setting it ends the phase on (``status`` read once a second); the
   changes (``ThresholdChanged``) and rollbacks (``RolledBack``).
4. Every run also says whether the machine kept the time scale: the engine simulators'
   release lag (``slipstream_enginesim_release_lag_seconds``, read from each pod's
   /metrics at the run's end) and the load's send lag, as p99 twin seconds. A run whose
   lag exceeds ``--max-lag`` is marked refused: its figures are printed but not judged.

The targets (issue 16, item 7): Auto's whole-run worst-tenant p99 at most 1.1x the best
static setting's and at most 0.5x Off's. The process exits 1 when a judged run misses
them, 3 when a run was refused for lag, 0 otherwise.

A workload file (``--workload FILE``) lists phases, each a twin workload spec
(``slipstream.sim.spec``; rates are the fleet's, spread over the two engines) or a replay
of recorded traces, one file per tenant (``traces``)::

    phases:
      - {name: uniform, duration_s: 600, seed: 1, tenants: [...]}
      - {name: giants, duration_s: 600, seed: 2, requests: [...], tenants: [...]}

``--workload random:SEED`` is the randomized phased workload of that seed
(``slipstream.demo.randomized``), the one ``scripts/sweep-random.py`` judges on the twin.
      - name: agents
        duration_s: 600
        traces:
          - {tenant: chat, trace: traces/chat.jsonl, rate_scale: 0.5, window_s: [0, 1200]}

A trace is a Mooncake ``.jsonl`` (``hash_ids``: its prefix blocks) or an Azure ``.csv``
(``slipstream.sim.traces``), its path relative to the workload file's folder;
``window_s`` (default: all of it) keeps the requests arriving in [start, end) trace
seconds from its first arrival, ``rate_scale`` (default 1) makes them that many times as
dense, and the phase keeps those arriving before ``duration_s``. Each trace has a hash-id
space of its own (no sharing across tenants or phases), and its requests carry no warm
blocks: a later turn that re-sends an earlier turn's blocks hits only the cache of the
engine the earlier one went to (the load's round robin, ``offline.split``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from slipstream.demo import loop, phases
from slipstream.enginesim import metrics as sim_metrics
from slipstream.localkube import podrunner
from slipstream.sim import policies, traces
from slipstream.sim.admission import MODES
from slipstream.sim.metrics import nearest_rank
from slipstream.sim.workload import Workload, build

NAMESPACE_PREFIX = "loopbench"
NAME = "bench"
READY_S = 180.0
DEFAULT_MAX_LAG_S = 1.0
"""Twin seconds: the p99 lag a run may have and still be judged. The demo's best static
setting's worst-tenant p99 is about 1 s, so a larger lag could decide the comparison."""
TARGET_VS_BEST = 1.1
TARGET_VS_OFF = 0.5
RANDOM = "random:"
"""``--workload random:SEED``: the randomized phased workload of that seed (``demo.randomized``)."""
TWIN_AGREEMENT = 0.25
"""Live Auto's whole-run worst-tenant p99 is within this share of the twin's model of the
same loop (`twin_loop`) on the same workload (issue 16, item 8)."""


@dataclass(frozen=True)
class RunSpec:
    """One run: a label and the ServingDeployment's tuning (mode, and the setting in Fixed)."""

    label: str
    mode: str
    setting: str = "stock"
    """A policy name (``ceiling:4096/srpt``, ``stock``): the Fixed setting; Auto starts on stock."""


@dataclass
class RunFigures:
    """What one run measured (twin seconds)."""

    label: str
    mode: str
    setting: str
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    """phase name -> tenant -> p99 TTFT over the whole phase."""
    whole: dict[str, float] = field(default_factory=dict)
    worst_whole: float = math.nan
    settled_s: dict[str, float | None] = field(default_factory=dict)
    """phase name -> twin s from its start to the fleet on its final setting (None: no status)."""
    final_settings: dict[str, str] = field(default_factory=dict)
    changes: int = 0
    rollbacks: int = 0
    rollback_reasons: list[str] = field(default_factory=list)
    """The RollingBack Events' messages: why each rollback happened."""
    story: list[str] = field(default_factory=list)
    """Every Event of the run, ``twin s  Reason: message`` (as `kubectl describe` tells them):
    when the tuner moved, why it held, and how long the canary took."""
    requests: int = 0
    failed: int = 0
    sim_lag_p99_s: float = math.nan
    load_lag_p99_s: float = math.nan
    refused: str = ""
    per_phase: list[str] = field(default_factory=list)
    """Auto's run judged per phase against each phase's best constant on the twin
    (``offline.judgement_lines``; empty for the other runs)."""
    canary_engines: list[int] = field(default_factory=list)
    """Per CanaryStarted Event, the engine its first canary pod was (index in the load's
    round robin over the pods): which engine the twin's loop must canary to compare."""


def setting_fields(name: str) -> dict[str, Any]:
    """The tuning fields of a policy name: ``ceiling:4096/srpt`` -> threshold 4096, engineMode
    ceiling, schedulePolicy srpt; ``stock`` and ``stock/srpt`` have threshold 0; the twin's
    ``spf`` is SGLang's ``shortest-prefill-first``."""
    head, _, order = name.partition("/")
    order = policies.engine_order(order or "fcfs")
    if head == "stock":
        return {"threshold": 0, "engineMode": "ceiling", "schedulePolicy": order}
    mode, _, threshold = head.partition(":")
    if mode not in MODES or not threshold.isdigit():
        raise ValueError(f"setting {name!r}: expected stock[/ORDER] or {'|'.join(MODES)}:T[/ORDER]")
    return {"threshold": int(threshold), "engineMode": mode, "schedulePolicy": order}


def load_phases(path: str | Path) -> tuple[Workload, list[phases.Phase]]:
    """A phased workload file (module docstring), or ``random:SEED`` (a randomized phased
    workload, ``demo.randomized``): one workload, the phases back to back."""
    ref = str(path)
    if ref.startswith(RANDOM):
        from slipstream.demo import randomized

        seed = ref.removeprefix(RANDOM)
        if not seed.isdigit():
            raise ValueError(f"{ref}: expected {RANDOM}SEED with SEED a whole number >= 0")
        return randomized.random_phases(int(seed))
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: cannot read a phased workload ({type(exc).__name__})") from None
    items = doc.get("phases") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{p}: expected a mapping with a non-empty list 'phases' of workload specs")
    folder = p.parent

    def part_of(item: dict[str, Any], where: str, index: int, duration: float) -> Workload | None:
        return trace_phase(item, where, folder, index * PHASE_SPACES, duration) if "traces" in item else None

    return phases.back_to_back(items, str(p), p.stem, part_of)


PHASE_SPACES = 8
"""Hash-id spaces (``workload.BLOCK_SPACE``) per phase: phase i uses spaces 8i .. 8i+7."""
TRACE_FIELDS = {"tenant", "trace", "rate_scale", "window_s"}


def trace_phase(item: dict[str, Any], where: str, folder: Path, space: int, duration_s: float) -> Workload:
    """A phase given as traces, one per tenant (module docstring): their requests, arrivals
    from the phase's start, each trace in hash-id space ``space + k + 1``."""
    extra = sorted(set(item) - {"name", "duration_s", "traces"})
    if extra:
        raise ValueError(f"{where}: a phase of traces takes name, duration_s and traces; "
                         f"{extra} belong to a workload spec phase (give the tenants their own phase)")
    items = item["traces"]
    if not isinstance(items, list) or not items or len(items) >= PHASE_SPACES:
        raise ValueError(f"{where}: traces must be a list of 1..{PHASE_SPACES - 1} "
                         "{tenant, trace[, rate_scale, window_s]} mappings")
    parts = []
    for k, t in enumerate(items):
        at = f"{where}: traces[{k}]"
        if not isinstance(t, dict) or not isinstance(t.get("tenant"), str) or not t["tenant"] \
                or not isinstance(t.get("trace"), str):
            raise ValueError(f"{at}: needs tenant (a name) and trace (a .jsonl or .csv path)")
        if unknown := sorted(set(t) - TRACE_FIELDS):
            raise ValueError(f"{at}: unknown field(s) {unknown}; known: {sorted(TRACE_FIELDS)}")
        scale = t.get("rate_scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < math.inf:
            raise ValueError(f"{at}: rate_scale must be a number > 0, got {scale!r}")
        window = t.get("window_s", [0.0, math.inf])
        if (not isinstance(window, list) or len(window) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in window)
                or not 0 <= window[0] < window[1]):
            raise ValueError(f"{at}: window_s must be [start, end] trace seconds, 0 <= start < end, "
                             f"got {window!r}")
        try:
            trace = traces.load(folder / t["trace"], t["tenant"], tenant_index=space + k + 1)
        except traces.TraceError as exc:
            raise ValueError(f"{at}: {exc}") from None
        start, end = float(window[0]), float(window[1])
        kept = [replace(r, arrival_s=(r.arrival_s - start) / scale) for r in trace.requests
                if start <= r.arrival_s < end and (r.arrival_s - start) / scale < duration_s]
        if not kept:
            raise ValueError(f"{at}: no request of {t['trace']} arrives in window_s {window} within "
                             f"duration_s {duration_s:g} (at rate_scale {scale:g})")
        parts.append(build(t["tenant"], kept))
    names = [w.name for w in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: two traces name the same tenant ({names}): one trace per tenant")
    return build(str(item.get("name") or "traces"), [r for w in parts for r in w.requests])


def best_static(workload: Workload, spans: Sequence[phases.Phase], count: int = 2) -> list[tuple[str, float]]:
    """The ``count`` static settings with the lowest whole-run worst-tenant p99 on the twin."""
    from slipstream.demo import offline  # the twin and the tuner: loaded when a bench runs

    return offline.ranked_static(workload, spans)[:count]


def p99(values: Sequence[float]) -> float:
    return nearest_rank(list(values), 99)


def histogram_p99(text: str, name: str) -> tuple[float, float]:
    """(p99 upper bucket bound, count) of histogram ``name`` in an exposition (NaN, 0 if absent)."""
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
    if not buckets:
        return math.nan, 0.0
    buckets.sort()
    total = buckets[-1][1]
    if total <= 0:
        return 0.0, 0.0
    bound = next(le for le, count in buckets if count >= 0.99 * total)
    return bound, total


def sim_lag_p99(urls: Sequence[str]) -> float:
    """The worst pod's p99 release lag (twin s; a bucket's upper bound) from each /metrics."""
    worst = math.nan
    for url in urls:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=10) as response:
            bound, count = histogram_p99(response.read().decode(), sim_metrics.RELEASE_LAG_SECONDS)
        if count > 0:
            worst = bound if math.isnan(worst) else max(worst, bound)
    return worst


def settled(samples: Sequence[loop.StatusSample], span: phases.Phase) -> tuple[float | None, str]:
    """(twin s from the phase's start to the fleet on its final setting, that setting)."""
    inside = [s for s in samples if span.holds(s.twin_s) and s.threshold is not None]
    if not inside:
        return None, "?"

    def key(s: loop.StatusSample) -> tuple[Any, ...]:
        return s.threshold, s.mode, s.schedule_policy

    final = key(inside[-1])
    last_other = max((k for k, s in enumerate(inside) if key(s) != final), default=None)
    at = span.start_s if last_other is None else inside[last_other + 1].twin_s
    return at - span.start_s, loop.setting_text(inside[-1])


def figures_of(spec: RunSpec, results: Sequence[loop.Result], samples: Sequence[loop.StatusSample],
               events: Sequence[dict[str, Any]], spans: Sequence[phases.Phase]) -> RunFigures:  # fmt: skip
    """The run's figures from what it recorded (pure: the tests call it on plain data)."""
    fig = RunFigures(spec.label, spec.mode, spec.setting)
    for span in spans:
        fig.phases[span.name] = loop.tenant_p99(results, span.start_s, span.end_s)
        fig.settled_s[span.name], fig.final_settings[span.name] = settled(samples, span)
    fig.whole = loop.tenant_p99(results, spans[0].start_s, spans[-1].end_s)
    fig.worst_whole = max(fig.whole.values(), default=math.nan)
    reasons = [e.get("reason") for e in events]
    fig.changes = reasons.count("ThresholdChanged")
    fig.rollbacks = reasons.count("RolledBack")
    fig.rollback_reasons = [str(e.get("message", ""))[:300] for e in events if e.get("reason") == "RollingBack"]
    fig.story = [f"{float(e.get('_twin_s', math.nan)):7.0f}  {e.get('reason')}: {str(e.get('message', ''))[:240]}"
                 for e in events]  # fmt: skip
    fig.requests = len(results)
    fig.failed = sum(1 for r in results if not r.ok)
    fig.load_lag_p99_s = p99([r.late_s for r in results])
    return fig


def verdict(runs: Sequence[RunFigures]) -> tuple[int, list[str]]:
    """(exit status, lines): Auto against the best static run and Off (module docstring)."""
    by_mode = {r.mode: r for r in runs}
    auto, off = by_mode.get("Auto"), by_mode.get("Off")
    statics = [r for r in runs if r.mode == "Fixed"]
    if any(r.refused for r in runs):
        return 3, [f"refused: {r.label}: {r.refused}" for r in runs if r.refused]
    if auto is None or off is None or not statics:
        return 0, ["(no comparison: Auto, Off and a static run are all needed)"]
    best = min(statics, key=lambda r: r.worst_whole)
    vs_best, vs_off = auto.worst_whole / best.worst_whole, auto.worst_whole / off.worst_whole
    lines = [
        f"Auto whole-run worst-tenant p99 {auto.worst_whole:.2f} s: {vs_best:.2f}x the best static "
        f"({best.label}, {best.worst_whole:.2f} s; target <= {TARGET_VS_BEST}), {vs_off:.2f}x Off "
        f"({off.worst_whole:.2f} s; target <= {TARGET_VS_OFF})"
    ]
    met = vs_best <= TARGET_VS_BEST and vs_off <= TARGET_VS_OFF
    lines.append("targets met" if met else "targets MISSED")
    return (0 if met else 1), lines


def table(runs: Sequence[RunFigures], spans: Sequence[phases.Phase]) -> list[str]:
    cols = [s.name for s in spans] + ["whole"]
    lines = [f"{'run':34s}" + "".join(f"{c:>18s}" for c in cols) + f"{'changes':>9s}{'rollbacks':>10s}"
             f"{'lag p99 sim/load':>18s}"]  # fmt: skip
    for r in runs:
        worst = [max(r.phases[c].values(), default=math.nan) for c in cols[:-1]] + [r.worst_whole]
        lines.append(f"{r.label:34s}" + "".join(f"{v:18.2f}" for v in worst) + f"{r.changes:9d}{r.rollbacks:10d}"
                     f"{r.sim_lag_p99_s:9.2f}/{r.load_lag_p99_s:.2f}")  # fmt: skip
        settle = "  ".join(f"{c} {'?' if s is None else f'{s:.0f} s'} ({r.final_settings[c]})"
                           for c, s in r.settled_s.items())  # fmt: skip
        lines.append(f"    on the final setting after: {settle}")
        lines += [f"    rolled back: {why}" for why in r.rollback_reasons]
    return lines


def run_one(target: loop.Target, spec: RunSpec, index: int, workload: Workload, spans: Sequence[phases.Phase],
            max_lag_s: float, out: Any, statics: Any = None) -> RunFigures:  # fmt: skip
    """One run in its own namespace, deleted afterwards."""
    ns = f"{NAMESPACE_PREFIX}-{index}"
    target.kubectl("create", "namespace", ns, check=False)
    try:
        sd = loop.serving_deployment(NAME, target.prometheus_url, mode=spec.mode)
        if spec.mode == "Fixed":
            sd["spec"]["tuning"].update(setting_fields(spec.setting))
        sd["metadata"]["namespace"] = ns
        target.apply(sd)
        targets = loop.wait_for(lambda: _service_targets(target, ns), READY_S, f"{ns}: the engine Service")
        loop.wait_for(lambda: len(targets()) >= 2, READY_S, f"{ns}: two engine simulators answering /health")
        if spec.mode == "Fixed":
            loop.wait_for(lambda: _fleet_on(target, ns, spec.setting), READY_S, f"{ns}: the fleet on {spec.setting}")
        watcher = loop.Watcher(target, ns, NAME).start()
        load = loop.LoadRun(workload.requests, targets, target.time_scale).start()
        watcher.t0 = load.t0
        last = 0.0
        while load.running():
            now = watcher.twin_now()
            if now - last >= 60:
                latest = watcher.latest
                print(f"  [{spec.label}] {now:6.0f}/{spans[-1].end_s:.0f} twin s: "
                      f"{loop.status_line(latest) if latest else 'waiting for status'}", file=out, flush=True)  # fmt: skip
                last = now
            time.sleep(0.5)
        results = load.join()
        watcher.stop()
        fig = figures_of(spec, results, watcher.samples, watcher.events, spans)
        urls = list(targets())
        fig.sim_lag_p99_s = sim_lag_p99(urls)
        fig.canary_engines = canary_engines(watcher.events, _pod_urls(target, ns), urls)
        lags = [v for v in (fig.sim_lag_p99_s, fig.load_lag_p99_s) if not math.isnan(v)]
        if lags and max(lags) > max_lag_s:
            fig.refused = (f"the machine did not keep time scale {target.time_scale:g}: p99 lag sim "
                           f"{fig.sim_lag_p99_s:.2f} s, load {fig.load_lag_p99_s:.2f} s > {max_lag_s:g} twin s")
        if spec.mode == "Auto" and statics is not None:
            from slipstream.demo import offline  # the twin: loaded when a bench runs

            fig.per_phase = offline.judgement_lines(offline.judge(
                offline.span_figures(offline.Run(list(results)), spans), statics, spans))
        return fig
    finally:
        target.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _fleet_on(target: loop.Target, ns: str, setting: str) -> bool:
    sd = target.get_sd(ns, NAME)
    want = setting_fields(setting)
    status = (sd or {}).get("status") or {}
    return (status.get("threshold"), status.get("mode") or "ceiling", status.get("schedulePolicy") or "fcfs") == (
        want["threshold"], want["engineMode"], want["schedulePolicy"])


def _pod_urls(target: loop.Target, ns: str) -> dict[str, str]:
    """Pod name -> the base URL the load sends it requests at (as ``ServiceTargets``)."""
    try:
        items = target.reader.get_json(f"/api/v1/namespaces/{ns}/pods")["items"]
    except OSError:
        return {}
    return {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{podrunner.engine_port(p['spec']['containers'][0])}"
            for p in items if (p.get("status") or {}).get("podIP")}  # fmt: skip


def _service_targets(target: loop.Target, ns: str) -> Any:
    try:
        return target.targets(ns, NAME)
    except OSError:
        return None


def twin_loop(workload: Workload, spans: Sequence[phases.Phase]) -> dict[str, Any]:
    """The twin's model of the operator's loop on the workload (`demo.offline.closed_loop`:
    two twin engines, the tuner every interval and on mix jumps, the canary on one engine
    for an analysis window, the CRD's default timings), once with each engine as the
    canary: the figures live Auto is checked against (``by_canary``, in the load's round
    robin order of the engines) and their moves (twin s, from, to). The top-level figures
    are those of a canary on engine 0."""
    from slipstream.demo import offline  # the twin and the tuner: loaded when a bench runs

    by_canary = []
    for canary in range(offline.REPLICAS):
        run_ = offline.closed_loop(workload, spans, 0.0, canary=canary)
        figs = offline.figures(run_, spans)
        by_canary.append({"phases": {p.name: figs[p.name] for p in spans}, "whole": figs["whole"],
                          "moves": [f"{t:.0f} {a} -> {b}" for t, a, b, _ in run_.moves]})  # fmt: skip
    return {**by_canary[0], "by_canary": by_canary}


CANARY_PODS = re.compile(r"trying it on canary pod\(s\) (?P<pods>[a-z0-9.,\s-]+?) for ")
"""The canary pods named in a CanaryStarted Event (``rollout.machine``)."""


def canary_engines(events: Sequence[dict[str, Any]], pod_urls: dict[str, str], urls: Sequence[str]) -> list[int]:
    """The engine index (in the load's round robin over ``urls``, sorted as the load sorts
    them) of the first canary pod of each CanaryStarted Event; a pod not found is left out."""
    order = sorted(urls)
    out = []
    for e in events:
        if e.get("reason") != "CanaryStarted" or not (m := CANARY_PODS.search(str(e.get("message", "")))):
            continue
        first = m.group("pods").split(",")[0].strip()
        if (url := pod_urls.get(first)) in order:
            out.append(order.index(url))
    return out


def agreement(runs: Sequence[RunFigures], twin: dict[str, Any] | None) -> dict[str, Any] | None:
    """Live Auto against the twin's loop with the same canary engine as live's first canary
    (engine 0 when live started none, or it is not known): both whole-run worst-tenant
    p99s, their ratio, and whether it is within `TWIN_AGREEMENT` (None without an Auto run
    or a twin figure; a refused run is not judged)."""
    auto = next((r for r in runs if r.mode == "Auto"), None)
    if auto is None or twin is None or auto.refused:
        return None
    by_canary = twin.get("by_canary") or [twin]
    engine = auto.canary_engines[0] if auto.canary_engines and auto.canary_engines[0] < len(by_canary) else 0
    twin_s = by_canary[engine]["whole"]
    if not twin_s > 0:
        return None
    ratio = auto.worst_whole / twin_s
    return {"live_s": auto.worst_whole, "twin_s": twin_s, "ratio": ratio, "canary_engine": engine,
            "within": abs(ratio - 1) <= TWIN_AGREEMENT}  # fmt: skip


def plan_runs(workload: Workload, spans: Sequence[phases.Phase], only: Sequence[str] = ()) -> list[RunSpec]:
    """Auto, Off and the twin's two best static settings in hindsight (``only``: labels kept)."""
    statics = best_static(workload, spans)
    runs = [RunSpec("auto", "Auto"), RunSpec("off", "Off")]
    runs += [RunSpec(f"static {name} (twin {whole:.2f} s)", "Fixed", name) for name, whole in statics]
    return [r for r in runs if not only or r.mode.lower() in only or r.setting in only]


def run(args: argparse.Namespace) -> int:
    from slipstream.demo import driver, offline

    workload, spans = driver.workload_of(args)
    out = sys.stderr if args.json else sys.stdout
    print(f"workload {args.workload}: {', '.join(f'{s.name} {s.end_s - s.start_s:.0f} s' for s in spans)}; "
          f"{len(workload.requests)} requests", file=out)  # fmt: skip
    print("ranking the static settings on the twin (hindsight) ...", file=out, flush=True)
    specs = plan_runs(workload, spans, [o.strip() for o in args.runs.split(",")] if args.runs else ())
    twin = statics = None
    if any(s.mode == "Auto" for s in specs):
        print("running every constant on the twin, for the per-phase oracle ...", file=out, flush=True)
        statics = offline.static_figures(workload, spans)
        print("running the twin's model of the loop on the same traffic ...", file=out, flush=True)
        twin = twin_loop(workload, spans)
    runs: list[RunFigures] = []
    with driver.target_for(args) as (target, _reused):
        print(f"stack ready (time x{target.time_scale:g}); {len(specs)} run(s): "
              f"{', '.join(s.label for s in specs)}", file=out, flush=True)  # fmt: skip
        for index, spec in enumerate(specs):
            runs.append(run_one(target, spec, index, workload, spans, args.max_lag, out, statics))
            print(f"  [{spec.label}] done: worst-tenant p99 {runs[-1].worst_whole:.2f} s", file=out, flush=True)
    status, lines = verdict(runs)
    for r in runs:
        if r.per_phase:
            lines.append(f"per phase, the live {r.label} against that phase's best constant on the twin "
                         "(the per-phase oracle):")
            lines += r.per_phase
    agree = agreement(runs, twin)
    if agree is not None:
        lines.append(f"live Auto {agree['live_s']:.2f} s against the twin's loop (canary engine "
                     f"{agree['canary_engine']}, as live) {agree['twin_s']:.2f} s: "
                     f"{agree['ratio']:.2f}x ({'within' if agree['within'] else 'OUTSIDE'} "
                     f"{TWIN_AGREEMENT:.0%})")  # fmt: skip
    if args.json:
        print(json.dumps({"workload": args.workload, "phases": [asdict(s) for s in spans],
                          "runs": [asdict(r) for r in runs], "twin_auto": twin, "twin_agreement": agree,
                          "verdict": lines, "exit": status}, indent=2))  # fmt: skip
    else:
        print("\nworst tenant's p99 TTFT (twin s), whole phases from their first second:")
        for line in table(runs, spans) + lines:
            print(line)
    return status


def add_parser(sub: Any) -> None:
    from slipstream.demo import driver
    from slipstream.localkube import supervisor

    p = sub.add_parser("loopbench", help="Auto, Off and the best static settings, live on the local stack")
    p.add_argument("--workload", default="builtin:demo", metavar="builtin:demo|random:SEED|FILE",
                   help="the phased workload (default %(default)s; random:SEED: a randomized one, "
                        "slipstream.demo.randomized; FILE: see the module docstring)")
    p.add_argument("--phase-s", type=float, default=driver.DEFAULT_PHASE_S, metavar="S",
                   help="builtin:demo: twin seconds per phase (default %(default)s)")
    p.add_argument("--time-scale", type=float, default=driver.DEFAULT_TIME_SCALE, metavar="S",
                   help="twin seconds per wall second (default %(default)s; a reused cluster keeps its own)")
    p.add_argument("--runs", default="", metavar="LIST",
                   help="only these runs: auto, off, fixed, or a static setting's name (default: all four)")
    p.add_argument("--max-lag", type=float, default=DEFAULT_MAX_LAG_S, metavar="S",
                   help="p99 lag (twin s) past which a run is refused (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (progress on stderr)")
    p.add_argument("--workdir", default=str(supervisor.DEFAULT_WORKDIR),
                   help="a running `slipstream cluster up` to reuse (default %(default)s)")
    p.set_defaults(func=run)
