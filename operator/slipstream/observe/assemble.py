"""From the samples of one interval's queries to a WorkloadSnapshot per ServingDeployment.

Pure: samples, the evaluation time and the rules in, snapshots out; no client, no clock.

A snapshot is valid only when every check below passes; the first that fails names the
reason (``slipstream.api.snapshot.REASONS``) and the detail says it in words:

1. ``NoSeries``: Prometheus has no series at all for the deployment (not one of the
   queries mentions it): its pods are not scraped, or carry no ``servingdeployment`` label.
2. ``StaleMetrics``: the newest sample of its engines' queue gauge is older than
   ``max_staleness_s`` or there is none now (scrapes failing: Prometheus marks a failed
   target's series stale at once) while older samples remain in the window.
3. ``NotFinite``: a value that matters (a bucket, a count, a sum, a token counter, the queue
   depth, a setting gauge) is NaN or infinite.
4. ``NoTraffic``: Prometheus answered and no request got its first token in the window.
5. ``TooFewSamples``: fewer first tokens than ``min_samples``.

``PrometheusUnreachable`` is decided before this (any failed query fails the interval); it
is never confused with NoTraffic, which needs an answer that says "zero".

Histograms are assembled the way Prometheus's ``histogram_quantile`` reads them: buckets
of equal ``le`` coalesced, counts made monotonic (``increase()`` extrapolates each bucket
on its own, so a cumulative count can dip below the one before), ``+Inf`` as the total;
``Histogram.quantile`` then gives the same figure as the server (an integration test
checks it against a real Prometheus).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from slipstream.api import buckets
from slipstream.api import snapshot as snap
from slipstream.engine import metrics
from slipstream.observe import parse, queries

UNLABELLED_TENANT = "unlabelled"
"""Tenant name for requests sent without the tenant header (empty ``tenant`` label)."""


@dataclass(frozen=True, slots=True)
class Rules:
    """When a window's data may be acted on."""

    window_s: float
    """Seconds of history each query covers (``increase(...[window])``)."""
    min_samples: int
    """First tokens needed in the window, all tenants together."""
    max_staleness_s: float
    """Oldest the newest engine sample may be; a few scrape intervals."""


SeriesKey = tuple[str, ...]


def deployment_name(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def split_name(deployment: str) -> SeriesKey:
    """``namespace/name`` -> (namespace, name); ValueError naming the fix otherwise."""
    namespace, sep, name = deployment.partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"deployment {deployment!r} must be written namespace/name")
    return (namespace, name)


def _le(text: str) -> float:
    try:
        return parse.number(text)
    except parse.MalformedAnswer:
        return math.nan


def histograms(samples: Iterable[parse.Sample], key: Callable[[parse.Sample], SeriesKey]) -> dict[SeriesKey, snap.Histogram]:
    """One Histogram per key from ``histogram_increase`` rows (bucket and sum parts)."""
    buckets: dict[SeriesKey, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    sums: dict[SeriesKey, float] = defaultdict(float)
    for s in samples:
        k = key(s)
        part = s.label(queries.PART_LABEL)
        if part == queries.SUM_PART:
            sums[k] += s.value
        elif part == queries.BUCKET_PART:
            buckets[k][_le(s.label("le"))] += s.value
            sums.setdefault(k, 0.0)
    return {k: _histogram(buckets.get(k, {}), sums[k]) for k in sums}


def _histogram(by_le: Mapping[float, float], total_sum: float) -> snap.Histogram:
    if any(math.isnan(le) for le in by_le):
        return snap.Histogram((math.nan,), (math.nan,), math.nan, total_sum)
    bounds = sorted(le for le in by_le if not math.isinf(le))
    counts = [by_le[b] for b in bounds]
    total = by_le.get(math.inf, math.nan)
    values = [*counts, total]
    if all(math.isfinite(v) for v in values):
        # ensureMonotonic, as histogram_quantile does.
        for i in range(1, len(values)):
            values[i] = max(values[i], values[i - 1])
    return snap.Histogram(tuple(bounds), tuple(values[:-1]), values[-1], total_sum)


def merge(hists: Sequence[snap.Histogram]) -> snap.Histogram | None:
    """Several histograms with the same bounds added up; None when there are none."""
    if not hists:
        return None
    bounds = hists[0].bounds
    if any(h.bounds != bounds for h in hists):
        nan = tuple(math.nan for _ in bounds)
        return snap.Histogram(bounds, nan, math.nan, math.nan)
    counts = tuple(sum(h.counts[i] for h in hists) for i in range(len(bounds)))
    return snap.Histogram(bounds, counts, sum(h.total for h in hists), sum(h.sum for h in hists))


def _dep(s: parse.Sample) -> SeriesKey:
    return (s.label("namespace"), s.label("servingdeployment"))


def _dep_tenant(tenant_label: str) -> Callable[[parse.Sample], SeriesKey]:
    def key(s: parse.Sample) -> SeriesKey:
        return (*_dep(s), s.label(tenant_label) or UNLABELLED_TENANT)
    return key


def _parts(samples: Iterable[parse.Sample], key: Callable[[parse.Sample], SeriesKey]) -> dict[SeriesKey, dict[str, float]]:
    out: dict[SeriesKey, dict[str, float]] = defaultdict(dict)
    for s in samples:
        out[key(s)][s.label(queries.PART_LABEL)] = s.value
    return out


def _targets(samples: Iterable[parse.Sample]) -> tuple[dict[SeriesKey, dict[str, float]], dict[SeriesKey, set[str]]]:
    """Targets up and down per deployment, and the pods whose target is up."""
    counts: dict[SeriesKey, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    up: dict[SeriesKey, set[str]] = defaultdict(set)
    for s in samples:
        part = s.label(queries.PART_LABEL)
        counts[_dep(s)][part] += s.value
        if part == "up" and s.label(queries.POD_LABEL):
            up[_dep(s)].add(s.label(queries.POD_LABEL))
    return counts, up


def _settings(
    samples: Iterable[parse.Sample], up: Mapping[SeriesKey, set[str]]
) -> tuple[dict[SeriesKey, list[snap.PodSetting]], dict[SeriesKey, list[str]]]:
    """Pod settings per deployment, and the names of gauges that are not finite.

    Every pod is listed: those with any setting gauge and those whose scrape target is up
    (``up``), so a pod that exports no setting gauge (a stock engine, a pod whose gauges are
    not out yet) still counts as one of the deployment's pods: the tuner divides the
    deployment's rates by the number of pods.
    """
    threshold: dict[SeriesKey, float] = {}
    mode: dict[SeriesKey, str] = {}
    policy: dict[SeriesKey, str] = {}
    bad: dict[SeriesKey, list[str]] = defaultdict(list)
    for s in samples:
        pod = (*_dep(s), s.label(queries.POD_LABEL))
        part = s.label(queries.PART_LABEL)
        if not math.isfinite(s.value):
            bad[_dep(s)].append(f"{part} of pod {pod[2]} is {s.value}")
            continue
        if part == "threshold":
            threshold[pod] = s.value
        elif part == "mode":
            mode[pod] = s.label("mode")
        elif part == "policy":
            policy[pod] = s.label("policy")
    named = {*threshold, *mode, *policy, *((*dep, p) for dep, names in up.items() for p in names)}
    pods: dict[SeriesKey, list[snap.PodSetting]] = defaultdict(list)
    for pod in sorted(named):
        # A pod missing a gauge reports it unknown (threshold None, mode or policy ""), so a
        # comparison with any wanted setting fails and the rollout re-applies, never assumes.
        value = threshold.get(pod)
        pods[pod[:2]].append(snap.PodSetting(
            pod[2], None if value is None else int(value), mode.get(pod, ""), policy.get(pod, "")))
    return pods, bad


def unusable(hist: snap.Histogram) -> str | None:
    """Why a histogram's numbers cannot be used (None when they can).

    NaN or infinite values, negative counts (no real ``increase()`` gives one), or
    observations without a single finite bucket bound (no quantile can be read: Prometheus's
    ``histogram_quantile`` returns NaN there too).
    """
    if not hist.finite:
        return "NaN or infinite"
    if hist.total < 0 or any(c < 0 for c in hist.counts):
        return "negative counts"
    if hist.total > 0 and not hist.bounds:
        return "no finite bucket bound"
    return None


def _not_finite(tenant_hists: Mapping[str, snap.Histogram], what: str) -> list[str]:
    return [
        f"{what} of tenant {t}: {why}"
        for t, h in sorted(tenant_hists.items())
        if (why := unusable(h)) is not None
    ]


EMPTY = snap.Histogram((), (), 0.0, 0.0)


FIELDS_READ = ("ttft", "uncached", "output", "tokens", "queue", "targets", "settings", "mix")
"""The ``FleetQueries`` fields ``reduce`` knows (``output`` and ``mix`` may be missing from
``results``)."""

MixRows = dict[str, dict[str, float]]
"""One tenant's queue-mix answer: ``size_class`` (``""`` for the per-tenant arrivals) ->
part (``arrivals``, ``first_tokens``, ``cached``, ``uncached``, ``queued``,
``queued_tokens``) -> value."""


def _mix(samples: Iterable[parse.Sample], key: Callable[[parse.Sample], SeriesKey]) -> dict[SeriesKey, MixRows]:
    out: dict[SeriesKey, MixRows] = defaultdict(lambda: defaultdict(dict))
    for s in samples:
        part = s.label(queries.PART_LABEL)
        if part == "tokens":
            part = s.label(metrics.CACHE_LABEL)
        cls = "" if part == "arrivals" else s.label(metrics.SIZE_CLASS_LABEL)
        rows = out[key(s)][cls]
        rows[part] = rows.get(part, 0.0) + s.value
    return out


def queue_mix(rows: Mapping[str, MixRows], window_s: float) -> tuple[tuple[snap.TenantMix, ...], str | None, list[str]]:
    """Each tenant's queue mix from its ``_mix`` rows: (mixes, fallback reason, garbled).

    No arrivals series for any tenant is ``NoQueueMixSeries`` (an engine without the
    patch's queue-mix metrics); a ``size_class`` outside ``SIZE_CLASSES`` is
    ``UnknownSizeClass``; either way no mix is kept. A NaN, infinite or negative value is
    returned in ``garbled`` (the snapshot is then ``NotFinite``): it must never move a
    threshold, and a missing series must not read as zero traffic."""
    if not any("arrivals" in r.get("", {}) for r in rows.values()):
        return (), snap.NO_MIX_SERIES, []
    garbled = [
        f"queue mix of tenant {t} ({cls or 'all'}): {part} is {v}"
        for t, r in sorted(rows.items()) for cls, parts in sorted(r.items())
        for part, v in sorted(parts.items()) if not (math.isfinite(v) and v >= 0)
    ]
    unknown = sorted({cls for r in rows.values() for cls in r if cls and cls not in buckets.SIZE_CLASS_NAMES})
    if unknown:
        return (), snap.UNKNOWN_SIZE_CLASS, garbled
    mixes = []
    for tenant, r in sorted(rows.items()):
        classes = tuple(
            snap.SizeClassWindow(
                name,
                first_tokens=r.get(name, {}).get("first_tokens", 0.0),
                uncached_tokens=r.get(name, {}).get("uncached", 0.0),
                cached_tokens=r.get(name, {}).get("cached", 0.0),
                queued=r.get(name, {}).get("queued", 0.0),
                queued_tokens=r.get(name, {}).get("queued_tokens", 0.0),
            )
            for name in buckets.SIZE_CLASS_NAMES
        )
        arrivals = r.get("", {}).get("arrivals", 0.0)
        if arrivals > 0 or any(v > 0 for c in classes for v in c.values):
            mixes.append(snap.TenantMix(tenant, arrivals / window_s, classes))
    return tuple(mixes), None, garbled


def reduce(field: str, samples: Sequence[parse.Sample], tenant_label: str = queries.TENANT_LABEL) -> object:
    """One query's answer reduced to what the snapshots read of it, so that the observer can
    drop each answer's samples before it sends the next query: a histogram per deployment
    and tenant (a tuple of counts) instead of a series per bucket. At 500 deployments the
    answers are ~73,000 series; reduced, the largest answer alone is ever alive.

    Settings gauges stay samples (three per pod): the pods they name are joined with the
    targets' up pods in ``combine``."""
    per_tenant = _dep_tenant(tenant_label)
    if field in ("ttft", "uncached", "output"):
        return histograms(samples, per_tenant)
    if field == "tokens":
        return _parts(samples, per_tenant)
    if field == "queue":
        return _parts(samples, _dep)
    if field == "targets":
        return _targets(samples)
    if field == "settings":
        return list(samples)
    if field == "mix":
        return _mix(samples, per_tenant)
    raise ValueError(f"unknown fleet query {field!r}: one of {', '.join(FIELDS_READ)}")


def join(whole: object, shard: object) -> object:
    """A sharded field's reduced answer with one more shard's (``queries.SHARDED``): dicts
    keyed by deployment first, so shards never share a key (a repeated key, from a
    Prometheus that ignored the shard matcher, is the same answer again)."""
    if not isinstance(whole, dict) or not isinstance(shard, dict):
        raise TypeError(f"cannot join reduced answers of types {type(whole).__name__} and {type(shard).__name__}")
    whole.update(shard)
    return whole


def snapshots(
    results: Mapping[str, Sequence[parse.Sample]],
    *,
    now: float,
    rules: Rules,
    deployments: Iterable[str] | None = None,
    tenant_label: str = queries.TENANT_LABEL,
) -> dict[str, snap.WorkloadSnapshot]:
    """A snapshot for each deployment (``namespace/name``) from ``queries.fleet`` answers.

    ``results`` maps each ``FleetQueries`` field name to its samples. Without
    ``deployments``, every deployment any answer mentions gets one.
    """
    reduced = {field: reduce(field, samples, tenant_label) for field, samples in results.items()}
    return combine(reduced, now=now, rules=rules, deployments=deployments)


def combine(
    reduced: Mapping[str, object],
    *,
    now: float,
    rules: Rules,
    deployments: Iterable[str] | None = None,
) -> dict[str, snap.WorkloadSnapshot]:
    """``snapshots`` from answers already ``reduce``d (each field once)."""
    ttft = cast(dict[SeriesKey, snap.Histogram], reduced["ttft"])
    uncached = cast(dict[SeriesKey, snap.Histogram], reduced["uncached"])
    # Optional: without output lengths (an engine that does not export them, a caller
    # that did not ask) each tenant's output_tokens is None and the twin decodes one token.
    output = cast(dict[SeriesKey, snap.Histogram], reduced.get("output", {}))
    tokens = cast(dict[SeriesKey, dict[str, float]], reduced["tokens"])
    # Optional too: without it (an older engine, a caller that did not ask) the snapshot
    # says NoQueueMixSeries and the tuner falls back to first-token rates.
    mix = cast(dict[SeriesKey, MixRows], reduced.get("mix", {}))
    queue = cast(dict[SeriesKey, dict[str, float]], reduced["queue"])
    targets, up_pods = cast(tuple[dict[SeriesKey, dict[str, float]], dict[SeriesKey, set[str]]], reduced["targets"])
    pods, bad_gauges = _settings(cast(list[parse.Sample], reduced["settings"]), up_pods)

    seen = {k[:2] for k in (*ttft, *uncached, *output, *tokens)} | set(queue) | set(targets) | set(pods)
    wanted = sorted(seen) if deployments is None else [split_name(d) for d in deployments]
    by_dep_ttft, by_dep_uncached, by_dep_tokens = _by_deployment(ttft), _by_deployment(uncached), _by_deployment(tokens)
    by_dep_output, by_dep_mix = _by_deployment(output), _by_deployment(mix)
    out: dict[str, snap.WorkloadSnapshot] = {}
    for dep in wanted:
        name = deployment_name(*dep)
        out[name] = _one(
            name,
            now=now,
            rules=rules,
            present=dep in seen,
            ttft=by_dep_ttft.get(dep, {}),
            uncached=by_dep_uncached.get(dep, {}),
            output=by_dep_output.get(dep, {}),
            tokens=by_dep_tokens.get(dep, {}),
            mix=by_dep_mix.get(dep, {}),
            queue=queue.get(dep, {}),
            targets=targets.get(dep, {}),
            pods=tuple(pods.get(dep, ())),
            bad_gauges=bad_gauges.get(dep, []),
        )
    return out


V = TypeVar("V")


def _by_deployment(per_tenant: Mapping[SeriesKey, V]) -> dict[SeriesKey, dict[str, V]]:
    """(namespace, name, tenant) -> value, regrouped as (namespace, name) -> tenant -> value:
    one pass, so assembling N deployments costs O(N), not O(N^2)."""
    out: dict[SeriesKey, dict[str, V]] = defaultdict(dict)
    for key, value in per_tenant.items():
        out[key[:2]][key[2]] = value
    return out


def _ratio(parts: Mapping[str, float]) -> float | None:
    prompt = parts.get("prompt", 0.0)
    if not prompt > 0:
        return None
    return parts.get("cached", 0.0) / prompt


def _one(
    name: str,
    *,
    now: float,
    rules: Rules,
    present: bool,
    ttft: Mapping[str, snap.Histogram],
    uncached: Mapping[str, snap.Histogram],
    output: Mapping[str, snap.Histogram],
    tokens: Mapping[str, Mapping[str, float]],
    mix: Mapping[str, MixRows],
    queue: Mapping[str, float],
    targets: Mapping[str, float],
    pods: tuple[snap.PodSetting, ...],
    bad_gauges: list[str],
) -> snap.WorkloadSnapshot:
    window = rules.window_s
    if not present:
        return snap.invalid(
            name, now, window, snap.NO_SERIES,
            f"Prometheus has no series for {name}: are its engine pods scraped with the labels "
            f"namespace, pod and servingdeployment? (check up{{servingdeployment=\"{name.split('/')[1]}\"}})",
        )
    # Counts from count(); kept as floats so a garbled answer (inf, NaN) cannot raise here.
    up, down = targets.get("up", 0.0), targets.get("down", 0.0)
    scrape = f"{up:g} of {up + down:g} scrape targets up"
    newest = queue.get("newest")
    if newest is None:
        return snap.invalid(
            name, now, window, snap.STALE,
            f"no current sample of the engines' gauges ({scrape}): scrapes are failing",
        )
    if not math.isfinite(newest):
        return snap.invalid(name, now, window, snap.NOT_FINITE, f"newest sample time is {newest}")
    age = now - newest
    if not age <= rules.max_staleness_s:
        return snap.invalid(
            name, now, window, snap.STALE,
            f"newest sample is {age:.1f} s old (limit {rules.max_staleness_s:g} s; {scrape})",
        )

    total_uncached = merge([uncached[t] for t in sorted(uncached)])
    depth = queue.get("depth")
    tenants: list[snap.TenantWindow] = []
    for tenant, hist in sorted(ttft.items()):
        if hist.total > 0 or unusable(hist):
            tenants.append(snap.TenantWindow(
                tenant,
                requests_per_s=hist.total / window,
                ttft=hist,
                uncached_tokens=uncached.get(tenant, EMPTY),
                cache_hit_ratio=_ratio(tokens.get(tenant, {})),
                output_tokens=output.get(tenant),
            ))
    cached = sum(v.get("cached", 0.0) for v in tokens.values())
    prompt = sum(v.get("prompt", 0.0) for v in tokens.values())
    requests = sum(h.total for h in ttft.values())
    extra = {
        "requests": requests,
        "requests_per_s": requests / window,
        "newest_sample_age_s": age,
        "targets_up": up,
        "targets_down": down,
    }
    if prompt > 0:
        extra["cache_hit_ratio"] = cached / prompt
    mixes, mix_fallback, garbled_mix = queue_mix(mix, window)
    if mix_fallback is None:
        extra["arrivals_per_s"] = sum(m.arrivals_per_s for m in mixes)
    full = snap.WorkloadSnapshot(
        name, now, window, tenants=tuple(tenants), uncached_tokens=total_uncached,
        queue_depth=depth, pods=pods, extra=extra, queue_mix=mixes, mix_fallback=mix_fallback,
    )

    not_finite = [
        *_not_finite(ttft, "TTFT histogram"),
        *_not_finite(uncached, "uncached-token histogram"),
        *_not_finite(output, "output-token histogram"),
        *(f"token counters of tenant {t}: {dict(v)}" for t, v in sorted(tokens.items())
          if not all(math.isfinite(x) for x in v.values())),
        *([] if depth is None or math.isfinite(depth) else [f"queue depth ({depth})"]),
        *bad_gauges,
        *garbled_mix,
    ]
    if not_finite:
        return _with(full, snap.NOT_FINITE, "not finite: " + "; ".join(not_finite[:5]))
    if requests <= 0:
        # Requests that arrived and wait still show: starving is not the same as idle.
        waiting = (f"; {sum(m.arrivals_per_s for m in mixes) * window:.0f} arrived, "
                   f"{sum(m.queued for m in mixes):.0f} waiting") if mixes else ""
        return _with(
            full, snap.NO_TRAFFIC,
            f"Prometheus answered: no request got its first token in the last {window:g} s ({scrape}){waiting}",
        )
    if requests < rules.min_samples:
        return _with(
            full, snap.TOO_FEW_SAMPLES,
            f"{requests:.0f} first tokens in the last {window:g} s, fewer than the {rules.min_samples} needed",
        )
    p99 = ", ".join(f"{t.name} {t.ttft_p99_s:.3g} s" for t in tenants)
    return _with(full, None, f"{requests:.0f} first tokens in {window:g} s; TTFT p99 {p99}")


def _with(full: snap.WorkloadSnapshot, reason: str | None, detail: str) -> snap.WorkloadSnapshot:
    """``full`` (everything read) with its verdict: invalid ones still show what was seen."""
    return dataclasses.replace(full, invalid=reason, detail=detail)


def pod_group(
    samples: Iterable[parse.Sample],
    *,
    name: str,
    now: float,
    window_s: float,
    min_samples: int,
    tenant_label: str = queries.TENANT_LABEL,
) -> snap.WorkloadSnapshot:
    """Per-tenant TTFT of a subset of one deployment's pods (``queries.pods_ttft``'s answer).

    For canary analysis: valid only with ``min_samples`` first tokens and finite counts;
    ``tenants[i].ttft_p99_s`` is then that tenant's p99 over those pods.
    """
    hists = histograms(samples, lambda s: (s.label(tenant_label) or UNLABELLED_TENANT,))
    if not hists:
        return snap.invalid(name, now, window_s, snap.NO_SERIES, f"no TTFT series for these pods of {name}")
    tenants = tuple(
        snap.TenantWindow(k[0], h.total / window_s, h, EMPTY)
        for k, h in sorted(hists.items()) if h.total > 0 or unusable(h)
    )
    full = snap.WorkloadSnapshot(name, now, window_s, tenants=tenants)
    bad = _not_finite({t.name: t.ttft for t in tenants}, "TTFT histogram")
    requests = sum(t.ttft.total for t in tenants)
    if bad:
        return _with(full, snap.NOT_FINITE, "not finite: " + "; ".join(bad[:5]))
    if requests <= 0:
        return _with(full, snap.NO_TRAFFIC, f"no first token on these pods in the last {window_s:g} s")
    if requests < min_samples:
        return _with(
            full, snap.TOO_FEW_SAMPLES,
            f"{requests:.0f} first tokens on these pods, fewer than the {min_samples} needed",
        )
    return _with(full, None, f"{requests:.0f} first tokens on these pods in {window_s:g} s")
