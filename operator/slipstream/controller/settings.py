"""Settings of the controller: one frozen dataclass, each field with its unit and reason."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

from slipstream.sim import profiles


@dataclass(frozen=True)
class ControllerSettings:
    retry_delay_seconds: float = 30.0
    """Seconds before a ServingDeployment that could not be reconciled (a missing Secret) is
    tried again. 30 s: soon enough after the user creates the Secret, and a retry costs two
    GETs. Env: SLIPSTREAM_RETRY_DELAY_SECONDS."""

    status_interval_seconds: float = 30.0
    """Seconds between refreshes of phase and readiness from the engine Deployment. Engines
    take minutes to load weights, so 30 s loses nothing. Env: SLIPSTREAM_STATUS_INTERVAL_SECONDS."""

    status_watch_seconds: float = 300.0
    """Longest the status refresh uses the drift watch's last view of an engine Deployment
    (`controller.watch.deployments`) before it GETs the Deployment again: a GET per deployment
    per refresh would be the operator's largest apiserver item in a large fleet. A changed
    Deployment sends an event at once; this bounds how long a missed event (a removed label)
    can leave readiness stale. 0: GET every refresh. Env: SLIPSTREAM_STATUS_WATCH_SECONDS."""

    metrics_port: int = 9090
    """Port of the operator's own Prometheus metrics (0: off). Env: SLIPSTREAM_METRICS_PORT."""

    ready_port: int = 0
    """Port of the operator's `/readyz` (`controller.runtime.readiness`: serving, paused by
    kopf's peering, or starting); 0: off. The chart sets it (readinessPort) and probes it.
    Env: SLIPSTREAM_READY_PORT."""

    listen_address: str = "0.0.0.0"
    """Address the metrics and `/readyz` listeners bind. In a pod, every address: Prometheus
    and the kubelet reach the pod IP. `slipstream cluster up` and the tests set 127.0.0.1:
    on a shared machine nothing but loopback is used (docs/localkube.md).
    Env: SLIPSTREAM_LISTEN_ADDRESS."""

    tuning_time_scale: float = 1.0
    """Factor on every duration of spec.tuning (intervalSeconds, cooldownSeconds,
    rollout.analysisWindowSeconds): 0.1 runs a 60 s interval every 6 s. Tests and the demo
    run the loop in seconds; 1 in production. Env: SLIPSTREAM_TUNING_TIME_SCALE."""

    rollout_poll_seconds: float = 5.0
    """Seconds between steps while a rollout is in flight (real seconds, not scaled): a
    canary's verification and the end of its analysis window are noticed this soon.
    Env: SLIPSTREAM_ROLLOUT_POLL_SECONDS."""

    mix_poll_seconds: float = 10.0
    """Seconds between the loop's polls of its queue mix while it waits for its next step
    (scaled by tuning_time_scale): a mix that jumped from the one the last step decided on
    (`tune.mixjump`) makes the step happen now, not at the timer. A poll is answered from
    the fleet read the deployments of a Prometheus share (reused for `reuse_s`): polls
    start at most one fleet read per `reuse_s` per Prometheus, as steps do. 0: no polls, the timer only. Env: SLIPSTREAM_MIX_POLL_SECONDS."""

    admin_timeout_seconds: float = 5.0
    """Timeout of one engine admin call (/get_server_info, /set_internal_state). A hot
    update is one RPC to the scheduler; 5 s bounds a stuck pod without mistaking a busy one
    for dead. Env: SLIPSTREAM_ADMIN_TIMEOUT_SECONDS."""

    admin_attempts: int = 3
    """Rounds of admin calls per rollout phase before it rolls back (spaced by
    rollout_poll_seconds). Env: SLIPSTREAM_ADMIN_ATTEMPTS."""

    prometheus_timeout_seconds: float = 10.0
    """Timeout of one Prometheus query. Env: SLIPSTREAM_PROMETHEUS_TIMEOUT_SECONDS."""

    observe_min_samples: int = 50
    """First tokens a window needs before the tuner may act on it (all tenants): a p99 of
    fewer is one slow request. Env: SLIPSTREAM_OBSERVE_MIN_SAMPLES."""

    observe_max_staleness_seconds: float = 60.0
    """Oldest the newest engine sample may be before the metrics count as stale (four 15 s
    scrapes). Env: SLIPSTREAM_OBSERVE_MAX_STALENESS_SECONDS."""

    canary_min_samples: int = 20
    """First tokens the canary pods (and the baseline pods) need in the analysis window for
    a verdict; fewer: no verdict, and the canary is rolled back. Canaries carry a fraction
    of the traffic, so this is below observe_min_samples. Env: SLIPSTREAM_CANARY_MIN_SAMPLES."""

    admin_seed_secret: str = "slipstream-system/slipstream-admin-seed"
    """NAMESPACE/NAME of the Secret (key `seed`) the generated admin keys are derived from;
    the chart makes it (`<release>-admin-seed` in the release namespace) and sets this.
    Env: SLIPSTREAM_ADMIN_SEED_SECRET."""

    worker_threads: int = 32
    """Threads for blocking work (Kubernetes and Prometheus calls, the twin): Python's
    default is cores + 4, so six on a small node, and one deployment's slow call would
    queue the others'. Env: SLIPSTREAM_WORKER_THREADS."""

    api_connections: int = 24
    """Connections kopf may hold open to the kube-apiserver at once (its watch streams and
    every status patch and Event), and the connection pool of the blocking Kubernetes
    client (at least `worker_threads`, the threads that share it). kopf's own default is no
    limit, and a wave of status-refresh timers (hundreds at once in a large fleet) would
    open a TLS connection each, each with a 256 KiB read buffer (`controller.clients.apisession`).
    Requests beyond it wait for a free connection. Env: SLIPSTREAM_API_CONNECTIONS."""

    gc_interval_seconds: float = 30.0
    """Seconds between full collections of Python's reference cycles (`controller.runtime.malloc`).
    Closed TLS connections are cycles (transport and protocol point at each other) that
    Python's own schedule collects only after ~100,000 more objects outlive their first
    collections, long enough for hundreds of them to pile up in a large fleet. A full
    collection costs a fraction of a second even then (docs/reliability.md, "Scale"),
    under 1% of a core every 30 s. Each collection is
    followed by a `malloc_trim` (`malloc.trim`): the pages of glibc's free chunks go back to
    the system. 0: Python's own schedule only, and no trim.
    Env: SLIPSTREAM_GC_INTERVAL_SECONDS."""

    malloc_arenas: int = 2
    """glibc malloc arenas shared by all the operator's threads (`controller.runtime.malloc`): by
    default each thread grows its own and keeps what it freed; at 100 deployments those
    arenas were 196 MB of a 453 MB RSS. 0: leave glibc's own setting (8 per core, or the
    MALLOC_ARENA_MAX environment variable). Env: SLIPSTREAM_MALLOC_ARENAS."""

    malloc_mmap_threshold_bytes: int = 131072
    """Blocks of at least this size get pages of their own from glibc, returned when freed
    (`controller.runtime.malloc`). glibc's default starts there but raises the bar to the largest
    block freed, up to 32 MB: after the first fleet read freed its 10 MB response body,
    the next bodies came from the heap and stayed in it. 0: leave glibc's own (dynamic)
    setting. Env: SLIPSTREAM_MALLOC_MMAP_THRESHOLD_BYTES."""

    tuner_threads: int = 0
    """Tuner runs (the twin's recommendations) at once, on threads of their own so that
    they never hold the worker_threads the Kubernetes and Prometheus calls need. The twin
    is pure Python under the GIL: a second run at once adds no throughput, but each run
    holds its simulated workload while it runs, and many interleaved runs scatter their
    allocations over the allocator's arenas, which then stay mapped (`scripts/bench-memory.py`
    shows it: docs/reliability.md, "Scale"). 0: the CPUs this process may use (its affinity and
    cgroup CPU quota; the chart's limit of 1 CPU gives 1), at most 4.
    Env: SLIPSTREAM_TUNER_THREADS."""

    canary_sub_window_seconds: float = 10.0
    """> 0: the canary analysis runs the sequential rule (`rollout.sequential`: same-size
    requests on both sides, a clipped score per sub-window, a Wald test) over sub-windows of
    this many seconds (scaled by tuning_time_scale, as spec durations are), never shorter
    than two `engine_scrape_interval_seconds`: Prometheus' ``increase`` needs two scrapes
    inside a range, so a shorter sub-window has no cells and the rule could only roll back
    for want of evidence. The rule decides when the analysis window ends
    (`canary_analysis_limit_windows`). `slipstream canary-check` measured the rule at 10 s (docs/operator.md).
    0: compare one window's per-tenant p99 instead (`analysis.compare`), which one giant
    prompt on the canary decides. Env: SLIPSTREAM_CANARY_SUB_WINDOW_SECONDS."""

    canary_analysis_limit_windows: float = 1.0
    """Analysis windows by which the sequential rule must decide (at least 1). 1: it decides
    when the analysis window ends (a truncated Wald test over the window's sub-windows: it
    promotes unless the evidence leans to a regression), so a phase change reaches the
    whole fleet within one interval plus one analysis window. More lets an undecided
    analysis go on until the rule crosses a bound: surer, later. `slipstream canary-check
    --limit` measures both (docs/operator.md). Env: SLIPSTREAM_CANARY_ANALYSIS_LIMIT_WINDOWS."""

    engine_scrape_interval_seconds: float = 5.0
    """How often Prometheus scrapes the engines, in wall seconds (not scaled): the interval
    of the PodMonitor or ServiceMonitor the operator creates, and the floor of the canary's
    sub-windows (two of these). Set it to your scrape interval when your own Prometheus
    scrapes the engines. Env: SLIPSTREAM_ENGINE_SCRAPE_INTERVAL_SECONDS."""

    canary_noise_floor: float = 0.25
    """Fraction of a tenant's p99 TTFT target under which its canary p99 never counts as
    a regression (0.25: with a 2 s target, 0.2 s -> 0.37 s is noise, 0.4 s -> 0.9 s is not).
    Env: SLIPSTREAM_CANARY_NOISE_FLOOR."""

    twin_profile: str = profiles.DEFAULT_PROFILE
    """The twin's cost profile the recommender runs candidates on (name or JSON file; see
    `slipstream bench --profile`). Env: SLIPSTREAM_TWIN_PROFILE."""

    tuner_reuse_seconds: float = 600.0
    """Longest the tuner reuses a deployment's last twin run while its workload has not moved
    (`tune.memo`; scaled by tuning_time_scale). A twin run costs a fraction of a CPU
    second, so without reuse hundreds of deployments need cores of twin runs
    (docs/reliability.md, "Scale"). Each run's own lifetime is drawn between 2/3 of this and this (`tune.memo.lifetime`),
    so runs made together do not all expire together. 0: run the twin every interval.
    Env: SLIPSTREAM_TUNER_REUSE_SECONDS."""

    tuner_dwell_cooldowns: float = 0.0
    """The tuner's dwell in the operator: after leaving a setting, do not return to it for this
    many cooldowns (`tune.guardrails`, `status.leftSettings`). 0 (off) by default: a real
    change of the traffic mix must be followed within a few intervals (the closed-loop test
    checks 3 intervals after each phase change), and the noise-aware hysteresis and the
    cooldown already stop flapping on unchanged traffic; the twin's `auto` uses 3, where it
    cut changes on the shared traces from 15 to 9. Env: SLIPSTREAM_TUNER_DWELL_COOLDOWNS."""

    engine_network_policy: str = ""
    """JSON of who may reach the engines (`controller.netpol.Peers`: the operator's namespace
    and pod labels, Prometheus' selectors, client namespaces), rendered by the chart from
    its values: every ServingDeployment then gets an owned NetworkPolicy on its engine pods.
    Empty: none is made. Env: SLIPSTREAM_ENGINE_NETWORK_POLICY."""

    engine_networks: str = ""
    """Comma-separated CIDRs the operator may contact engine pods in (e.g. 127.0.0.0/8 on a
    test machine, where nothing but loopback may be reached); a pod outside them counts as
    unreachable. Empty: any pod IP. Env: SLIPSTREAM_ENGINE_NETWORKS."""

    peering_lifetime_seconds: int = 60
    """Seconds a replica's entry in the kopf peering object stays valid without renewal
    (kopf's default; it renews 5-10 s before). A replica killed without notice (SIGKILL,
    a lost node) holds the others paused until it expires, so this bounds the takeover
    time. Env: SLIPSTREAM_PEERING_LIFETIME_SECONDS."""

    engine_time_scale: float = 1.0
    """Engine seconds per wall second: 1 for real engines; S for engine simulators run S
    times faster (`slipstream cluster up --time-scale S`, the demo). Their TTFT histograms
    are in engine seconds but Prometheus rates are per wall second, so the tuner divides the
    snapshot's rates by S and stretches its window by S before it runs the twin (else the
    twin sees S times the traffic and predicts queues that never form).
    Env: SLIPSTREAM_ENGINE_TIME_SCALE."""

    def tuner_concurrency(self) -> int:
        """tuner_threads, with 0 resolved to this process's usable CPUs (at most 4)."""
        if self.tuner_threads > 0:
            return self.tuner_threads
        return min(4, usable_cpus(len(os.sched_getaffinity(0)), _read(CPU_MAX)))

    @classmethod
    def from_env(cls) -> ControllerSettings:
        values = {}
        for field in fields(cls):
            raw = os.environ.get(f"SLIPSTREAM_{field.name.upper()}")
            if raw is not None:
                values[field.name] = type(getattr(cls(), field.name))(raw)
        return cls(**values)


CPU_MAX = "/sys/fs/cgroup/cpu.max"
"""cgroup v2: `<quota> <period>` in microseconds (`max <period>`: no quota)."""


def usable_cpus(affinity: int, cpu_max: str | None) -> int:
    """CPUs a process may use: its affinity, cut to its cgroup quota rounded up (a pod's
    CPU limit; `sched_getaffinity` shows every core of the node). At least 1."""
    cpus = max(1, affinity)
    quota, _, period = (cpu_max or "").strip().partition(" ")
    try:
        if quota != "max" and float(period) > 0 and float(quota) > 0:
            cpus = min(cpus, math.ceil(float(quota) / float(period)))
    except ValueError:
        pass  # unreadable: the affinity alone
    return max(1, cpus)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return None
