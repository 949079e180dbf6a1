"""What the engines' metrics said over one window: the hand-off from observe to tune.

Plain, frozen data with no I/O, shared by three producers and one consumer:

- ``slipstream.observe`` builds a ``WorkloadSnapshot`` per ServingDeployment from PromQL
  (``increase(..._bucket[window])`` by tenant, the gauges of each pod);
- the twin's ``auto`` policy (``slipstream.tune.auto``) builds the same type from the
  requests whose first token came inside the last window, binned into the engine's own
  bucket bounds, so the tuner in the twin sees exactly what Prometheus would have shown;
- tests build it directly (the VPA's recommender tests feed histograms straight in).

The controller's loop adds one thing Prometheus does not carry: each pod's KV pool, from
its last read of the pods' ``/get_server_info`` (``kv_pools``).

``slipstream.tune`` consumes it. A snapshot is either valid or carries the reason it is
not (``invalid``); nothing downstream acts on an invalid one, and a failed read is never
turned into "zero traffic" (Dynamo #14765): ``UNREACHABLE`` and ``NO_TRAFFIC`` are
different reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Reasons a snapshot is not usable; each is its own condition reason in status.
NO_TRAFFIC = "NoTraffic"
"""Prometheus answered and no request finished its prefill in the window."""
TOO_FEW_SAMPLES = "TooFewSamples"
"""Some traffic, but fewer first tokens than the tuner's minimum."""
STALE = "StaleMetrics"
"""The newest sample is older than the freshness bound (scrapes stopped)."""
NOT_FINITE = "NotFinite"
"""A value that matters is NaN or infinite."""
UNREACHABLE = "PrometheusUnreachable"
"""The query failed: connection refused, timeout, HTTP error or an unparseable answer."""
NO_SERIES = "NoSeries"
"""Prometheus answered with no series at all for the deployment (not scraped?)."""
REASONS = (NO_TRAFFIC, TOO_FEW_SAMPLES, STALE, NOT_FINITE, UNREACHABLE, NO_SERIES)

# Why a valid snapshot carries no queue mix (``WorkloadSnapshot.mix_fallback``): the tuner
# then falls back to first-token rates and one cache-hit ratio per tenant, and says so.
NO_MIX_SERIES = "NoQueueMixSeries"
"""The engines export no arrivals or size-class series (an engine without the patch's
queue-mix metrics, or not read)."""
UNKNOWN_SIZE_CLASS = "UnknownSizeClass"
"""A ``size_class`` label value that is not one of ``api.buckets.SIZE_CLASSES`` (an
engine with other classes): per-class figures cannot be compared, so none are used."""
MIX_FALLBACKS = (NO_MIX_SERIES, UNKNOWN_SIZE_CLASS)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram's increase over the window.

    ``bounds`` are the finite upper bounds (``le``), ascending; ``counts[i]`` is the
    cumulative number of observations ``<= bounds[i]``; ``total`` is ``_count`` (the +Inf
    bucket) and ``sum`` is ``_sum``. Counts may be fractional: ``increase()``
    extrapolates.
    """

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float
    sum: float

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError("a histogram needs one cumulative count per bound")

    @property
    def finite(self) -> bool:
        values = (*self.counts, self.total, self.sum)
        return all(math.isfinite(v) for v in values) and all(math.isfinite(b) for b in self.bounds)

    @property
    def mean(self) -> float:
        return self.sum / self.total if self.total > 0 else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus's ``histogram_quantile``: linear inside the bucket; NaN when empty.

        Past the last finite bound it returns that bound, as Prometheus does.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        if self.total <= 0 or not self.bounds:
            return math.nan
        rank = q * self.total
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            if count >= rank:
                if count == lower_count:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
            lower_bound, lower_count = bound, count
        return self.bounds[-1]

    def buckets(self) -> list[tuple[float, float, float]]:
        """(lower, upper, observations) per bucket, the +Inf one as (last, inf, n)."""
        out: list[tuple[float, float, float]] = []
        lower, seen = 0.0, 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            out.append((lower, bound, max(0.0, count - seen)))
            lower, seen = bound, count
        out.append((lower, math.inf, max(0.0, self.total - seen)))
        return out


def histogram_of(values: list[float] | tuple[float, ...], bounds: tuple[float, ...]) -> Histogram:
    """Bin raw observations the way a Prometheus client histogram would."""
    ordered = sorted(values)
    counts: list[float] = []
    k = 0
    for bound in bounds:
        while k < len(ordered) and ordered[k] <= bound:
            k += 1
        counts.append(float(k))
    return Histogram(tuple(bounds), tuple(counts), float(len(ordered)), float(sum(ordered)))


@dataclass(frozen=True, slots=True)
class TenantWindow:
    """One tenant over the window."""

    name: str
    requests_per_s: float
    """Rate of first tokens (requests whose prefill finished), per second."""
    ttft: Histogram
    """``sglang:time_to_first_token_seconds`` for this tenant."""
    uncached_tokens: Histogram
    """``sglang:uncached_prompt_tokens_histogram`` for this tenant."""
    cache_hit_ratio: float | None = None
    """Cached over prompt tokens (``cached_tokens_total / prompt_tokens_total``); None
    when the engine does not export the counters per tenant."""
    output_tokens: Histogram | None = None
    """``sglang:generation_tokens_histogram`` for this tenant (output lengths of the
    requests that finished); None when not read. The tuner's twin needs it to load the KV
    pool with decodes as the engines do."""

    @property
    def ttft_p50_s(self) -> float:
        return self.ttft.quantile(0.50)

    @property
    def ttft_p99_s(self) -> float:
        return self.ttft.quantile(0.99)


@dataclass(frozen=True, slots=True)
class SizeClassWindow:
    """One uncached-token size class of one tenant (``api.buckets.SIZE_CLASSES``)."""

    name: str
    """The ``size_class`` label value."""
    first_tokens: float = 0.0
    """Requests of this class that got their first token in the window."""
    uncached_tokens: float = 0.0
    """Uncached prompt tokens of those requests (their prefill work)."""
    cached_tokens: float = 0.0
    """Prompt tokens of those requests served from the prefix cache."""
    queued: float = 0.0
    """Requests of this class waiting now (no prefill token yet), summed over pods."""
    queued_tokens: float = 0.0
    """Their uncached tokens."""

    @property
    def cached_per_uncached(self) -> float | None:
        """Cached over uncached tokens of the class; None with no first token in it."""
        return self.cached_tokens / self.uncached_tokens if self.uncached_tokens > 0 else None

    @property
    def values(self) -> tuple[float, ...]:
        return (self.first_tokens, self.uncached_tokens, self.cached_tokens, self.queued,
                self.queued_tokens)


@dataclass(frozen=True, slots=True)
class TenantMix:
    """One tenant's queue mix over the window: what arrived and what waits, by size class.

    Unlike ``TenantWindow`` (built from first tokens), this counts requests when they
    arrive, so a tenant whose requests starve in the queue shows here while it starves."""

    name: str
    arrivals_per_s: float
    """Requests arrived per second over the window (``sglang:request_arrivals_total``)."""
    classes: tuple[SizeClassWindow, ...]
    """One per ``api.buckets.SIZE_CLASSES``, in that order."""

    @property
    def queued(self) -> float:
        return sum(c.queued for c in self.classes)

    def size_class(self, name: str) -> SizeClassWindow | None:
        return next((c for c in self.classes if c.name == name), None)


@dataclass(frozen=True, slots=True)
class PodSetting:
    """What one engine pod reports it runs (its setting gauges)."""

    pod: str
    threshold: int | None
    """T in force; None when the pod exports no threshold gauge (a stock engine)."""
    mode: str
    """``ceiling``, ``floor`` or ``reflex``; "" when the pod exports no mode gauge."""
    schedule_policy: str
    """``fcfs``, ``lpm`` or ``srpt``; "" when the pod exports no policy gauge."""


@dataclass(frozen=True, slots=True)
class PodPool:
    """One engine pod's KV pool as its admin API reports it (``max_total_num_tokens`` in
    ``/get_server_info``, read by the controller's loop, not by observe)."""

    pod: str
    tokens: int | None
    """Tokens its KV pool holds; None when it never reported a usable value."""
    problem: str = ""
    """Why its last answer gave no usable value ("" when it gave one); ``tokens`` is then
    the value of an earlier answer, if any."""


@dataclass(frozen=True, slots=True)
class WorkloadSnapshot:
    """Everything the tuner may know about one ServingDeployment's last window."""

    deployment: str
    """``namespace/name``."""
    taken_at: float
    """Unix seconds (or twin seconds) at the end of the window."""
    window_s: float
    tenants: tuple[TenantWindow, ...] = ()
    uncached_tokens: Histogram | None = None
    """The whole deployment's mix (all tenants)."""
    queue_depth: float | None = None
    """Requests waiting, summed over pods (``sglang:num_queue_reqs``)."""
    pods: tuple[PodSetting, ...] = ()
    """Every pod of the deployment that is scraped (target up) or exports a setting gauge;
    the tuner spreads the deployment's rates over ``len(pods)`` engines."""
    invalid: str | None = None
    """None when usable; else one of ``REASONS``."""
    detail: str = ""
    """Human words for ``invalid`` (the condition message), or what was read."""
    extra: dict[str, float] = field(default_factory=dict)
    """Figures shown in status and Events but not used to decide."""
    queue_mix: tuple[TenantMix, ...] = ()
    """Per tenant that sent requests in the window or has some waiting: arrivals and the
    size-class composition (empty when ``mix_fallback`` says why)."""
    mix_fallback: str | None = None
    """None when ``queue_mix`` was read from the engines; else one of ``MIX_FALLBACKS``."""
    kv_pools: tuple[PodPool, ...] = ()
    """The engine pods' KV pools, from the controller's last read of the pods (observe
    leaves it empty): the tuner runs its candidates with the smallest, and with none the
    profile's (``tune.deployment.twin_pool``)."""
    overload: str = ""
    """Why the fleet is overloaded, from the controller's loop (``tune.overload`` over its
    last few windows; observe leaves it empty); "" when it is not. The tuner then takes the
    setting with the most prefill throughput (``tune.guardrails.throughput_setting``)."""

    @property
    def valid(self) -> bool:
        return self.invalid is None

    @property
    def requests(self) -> float:
        """First tokens in the window, all tenants."""
        return sum(t.ttft.total for t in self.tenants)

    def mix_of(self, tenant: str) -> TenantMix | None:
        return next((m for m in self.queue_mix if m.name == tenant), None)


def invalid(deployment: str, taken_at: float, window_s: float, reason: str, detail: str) -> WorkloadSnapshot:
    """A snapshot that says why nothing may move."""
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    return WorkloadSnapshot(deployment, taken_at, window_s, invalid=reason, detail=detail)
