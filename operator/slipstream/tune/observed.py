"""What Prometheus would have shown: a WorkloadSnapshot from the first tokens of one window.

The twin's ``auto`` uses this to give the tuner exactly the view an operator has in a
cluster: per tenant, the rate of first tokens, the TTFT and uncached-prompt-token
histograms binned into SGLang 0.5.18's own bucket bounds (``api.buckets``), and the
cache-hit ratio (cached over prompt tokens), and output lengths in
``sglang:generation_tokens_histogram``'s bounds (SGLang counts a request there when it
finishes; here at its first token: the hook sees first tokens only). Only requests whose
first token came inside the window are counted. ``with_queue_mix`` adds what the patched
engines' queue-mix series show (arrivals, and the requests with no first token yet, by
size class), for a caller that knows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from slipstream.api import buckets
from slipstream.api.snapshot import (
    NO_TRAFFIC,
    PodSetting,
    SizeClassWindow,
    TenantMix,
    TenantWindow,
    WorkloadSnapshot,
    histogram_of,
    invalid,
)
from slipstream.sim import engine, fleet, policies
from slipstream.sim.policies import FirstToken
from slipstream.sim.profiles import Profile
from slipstream.sim.workload import Workload


def snapshot_of(deployment: str, first_tokens: Iterable[FirstToken], now_s: float,
                window_s: float) -> WorkloadSnapshot:
    """The snapshot of the window ``(now_s - window_s, now_s]``; NO_TRAFFIC when empty."""
    if window_s <= 0:
        raise ValueError(f"window must be > 0 s, got {window_s}")
    start = now_s - window_s
    seen = [ft for ft in first_tokens if start < ft.first_token_s <= now_s]
    if not seen:
        return invalid(deployment, now_s, window_s, NO_TRAFFIC,
                       f"no first token in the last {window_s:.0f} s")
    per: dict[str, list[FirstToken]] = {}
    for ft in seen:
        per.setdefault(ft.tenant, []).append(ft)
    tenants = []
    for name, fts in sorted(per.items()):
        prompt = sum(ft.prompt_tokens for ft in fts)
        tenants.append(TenantWindow(
            name,
            len(fts) / window_s,
            histogram_of([ft.first_token_s - ft.arrival_s for ft in fts], buckets.TTFT_BOUNDS_S),
            histogram_of([float(ft.uncached_tokens) for ft in fts], buckets.PROMPT_TOKENS),
            1.0 - sum(ft.uncached_tokens for ft in fts) / prompt if prompt > 0 else 0.0,
            histogram_of([float(ft.output_tokens) for ft in fts], buckets.PROMPT_TOKENS)
            if any(ft.output_tokens for ft in fts) else None,
        ))
    return WorkloadSnapshot(
        deployment, now_s, window_s, tuple(tenants),
        histogram_of([float(ft.uncached_tokens) for ft in seen], buckets.PROMPT_TOKENS),
        detail=f"{len(seen)} first tokens in the last {window_s:.0f} s",
    )


def with_queue_mix(snapshot: WorkloadSnapshot, first_tokens: Iterable[FirstToken],
                   arrivals: Iterable[tuple[str, float]], waiting: Iterable[tuple[str, int]]) -> WorkloadSnapshot:
    """``snapshot`` with the queue mix the engines' series would give for its window:
    ``arrivals`` (tenant, arrival time: those inside the window count), ``waiting`` (tenant,
    uncached tokens of each request with no first token at the window's end), and the
    window's ``first_tokens`` by size class (``sglang:request_arrivals_total`` and the
    size-class series of ``engine.metrics``). An invalid snapshot is returned as it is."""
    if not snapshot.valid:
        return snapshot
    end, start = snapshot.taken_at, snapshot.taken_at - snapshot.window_s
    rows: dict[str, dict[str, list[float]]] = {}
    came: dict[str, int] = {}

    def cls(tenant: str, tokens: float) -> list[float]:
        return rows.setdefault(tenant, {}).setdefault(buckets.size_class(tokens), [0.0] * 5)

    for ft in first_tokens:
        if start < ft.first_token_s <= end:
            row = cls(ft.tenant, ft.uncached_tokens)
            row[0] += 1
            row[1] += ft.uncached_tokens
            row[2] += ft.prompt_tokens - ft.uncached_tokens
    for tenant, tokens in waiting:
        row = cls(tenant, tokens)
        row[3] += 1
        row[4] += tokens
    for tenant, at in arrivals:
        if start < at <= end:
            came[tenant] = came.get(tenant, 0) + 1
    mixes = tuple(
        TenantMix(t, came.get(t, 0) / snapshot.window_s,
                  tuple(SizeClassWindow(name, *rows.get(t, {}).get(name, [0.0] * 5)) for name in buckets.SIZE_CLASS_NAMES))
        for t in sorted(set(rows) | set(came)))  # fmt: skip
    return replace(snapshot, queue_mix=mixes, mix_fallback=None)


def simulated_fleet(parts: Sequence[Workload], under: str, profile: Profile, config: policies.EngineConfig,
                    at_s: float | None, window_s: float) -> tuple[WorkloadSnapshot, list[float]]:  # fmt: skip
    """The snapshot the operator would take of a fleet, one twin engine per part of a
    routed workload (``sim.fleet.route``) running ``under``: every engine's first tokens
    in one window (Prometheus sums the pods), the pods listed (more than one) so the tuner
    spreads the rates over them; and each engine's cache-hit ratio over its whole run."""
    seen: list[FirstToken] = []

    def watch(view: policies.RoundView) -> None:
        seen.extend(view.first_tokens)

    runs = [engine.simulate(part, policies.parse(under, config, controller=watch, interval_s=1.0), profile, config)
            for part in parts]  # fmt: skip
    at = at_s if at_s is not None else max((f.first_token_s for f in seen), default=0.0)
    name = parts[0].name if len(parts) == 1 else parts[0].name.rsplit("@", 1)[0] if parts else "fleet"
    snap = snapshot_of(name, seen, at, window_s)
    if snap.valid and len(parts) > 1:
        snap = replace(snap, pods=tuple(PodSetting(f"{name}-{k}", None, "", "") for k in range(len(parts))))
    return snap, fleet.hit_ratios(runs)


def simulated(workload: Workload, under: str, profile: Profile, config: policies.EngineConfig,
              at_s: float | None, window_s: float) -> WorkloadSnapshot:
    """The snapshot the operator would take of one twin engine running ``workload`` under
    the policy ``under``: the window ending at ``at_s`` (None: at the last first token).
    What ``slipstream recommend`` decides on when it is given a workload, not a snapshot:
    the fleet of one (``simulated_fleet``), no pods listed."""
    return simulated_fleet([workload], under, profile, config, at_s, window_s)[0]
