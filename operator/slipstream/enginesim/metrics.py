"""The simulated engine's /metrics: SGLang 0.5.18's names, labels and buckets, plus the
patch's gauges (``slipstream.engine.metrics``), every duration in TWIN seconds.

Bucket bounds are copied from sglang/srt/observability/metrics_collector.py of 0.5.18
(TokenizerMetricsCollector: the default TTFT, e2e and prompt-token buckets), so
``histogram_quantile`` over the simulator means what it means over a real engine.
Request metrics carry the tokenizer's labels (model_name, engine_type, then every
``--tokenizer-metrics-allowed-custom-labels`` label, e.g. tenant); the scheduler's gauges
carry model_name, engine_type, tp_rank, pp_rank and moe_ep_rank.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from slipstream.api import buckets
from slipstream.engine import metrics as names
from slipstream.sim import admission

E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
               600, 1200, 1800, 2400)
MAX_PARTIAL_PREFILLS = "sglang:max_partial_prefills"
"""Gauge (patch): the partials cap in force (--max-partial-prefills, settable in place)."""
RELEASE_LAG_SECONDS = "slipstream_enginesim_release_lag_seconds"
"""Histogram (simulator only): how far behind the scaled clock the simulator released each
first token and completion, in twin seconds (its pump woke late, or the twin's passes took
longer than the wall time they stand for). A machine that cannot keep the time scale shows
here; benchmarks over the simulators refuse figures taken while it exceeded their bound."""
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineMetrics:
    """One engine's metric families in their own registry (several servers per process)."""

    def __init__(self, model_name: str, allowed_labels: tuple[str, ...]) -> None:
        self.registry = CollectorRegistry()
        self.base = {"model_name": model_name, "engine_type": "unified"}
        req = [*self.base, *allowed_labels]
        streaming = [*req, "is_streaming"]
        sched = [*self.base, "tp_rank", "pp_rank", "moe_ep_rank"]
        self.sched_labels = {**self.base, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        r = self.registry
        self.ttft = Histogram(names.TTFT_SECONDS, "Histogram of time to first token in seconds.",
                              streaming, buckets=buckets.TTFT_BOUNDS_S, registry=r)
        self.release_lag = Histogram(RELEASE_LAG_SECONDS, "Twin seconds the simulator released a first token or "
                                     "a completion after it was due.", self.base, buckets=LAG_BUCKETS,
                                     registry=r).labels(**self.base)  # fmt: skip
        self.e2e = Histogram(names.E2E_REQUEST_LATENCY_SECONDS,
                             "Histogram of End-to-end request latency in seconds", streaming,
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_hist = Histogram("sglang:prompt_tokens_histogram",
                                     "Histogram of prompt token length.", req,
                                     buckets=buckets.PROMPT_TOKENS, registry=r)
        self.uncached_hist = Histogram(names.UNCACHED_PROMPT_TOKENS,
                                       "Histogram of uncached (compute) prompt token length.", req,
                                       buckets=buckets.PROMPT_TOKENS, registry=r)
        self.generation_hist = Histogram(names.GENERATION_TOKENS,
                                         "Histogram of generation token length.", req,
                                         buckets=buckets.PROMPT_TOKENS, registry=r)
        self.prompt_total = Counter(names.PROMPT_TOKENS_TOTAL, "Number of prefill tokens processed.",
                                    streaming, registry=r)
        self.generation_total = Counter("sglang:generation_tokens_total",
                                        "Number of generation tokens processed.", streaming, registry=r)
        self.cached_total = Counter(names.CACHED_TOKENS_TOTAL,
                                    "Number of cached prompt tokens by source (device/host/storage).",
                                    [*req, "cache_source"], registry=r)
        self.requests_total = Counter("sglang:num_requests_total", "Number of requests processed.",
                                      streaming, registry=r)
        self.aborted_total = Counter("sglang:num_aborted_requests_total", "Number of requests aborted.",
                                     req, registry=r)
        self.running = Gauge(names.NUM_RUNNING_REQS, "The number of running requests.", sched, registry=r)
        self.queued = Gauge(names.NUM_QUEUE_REQS, "The number of requests in the waiting queue.",
                            sched, registry=r)
        self.token_usage = Gauge("sglang:token_usage", "The token usage.", sched, registry=r)
        self.threshold = Gauge(names.LONG_PREFILL_TOKEN_THRESHOLD,
                               "Most prefill tokens one request may take per round (0 = off).",
                               sched, registry=r)
        self.partials = Gauge(names.NUM_PARTIAL_PREFILLS, "Partial (chunked) prefills in progress.",
                              sched, registry=r)
        self.max_partials = Gauge(MAX_PARTIAL_PREFILLS,
                                  "Most partial prefills in progress at once (--max-partial-prefills).",
                                  sched, registry=r)
        self.mode = Gauge(names.LONG_PREFILL_MODE,
                          "1 for the long-prefill mode in force (label mode), else 0.",
                          [*sched, "mode"], registry=r)
        self.policy = Gauge(names.SCHEDULE_POLICY,
                            "1 for the admission order in force (label policy), else 0.",
                            [*sched, "policy"], registry=r)
        self._policies: set[str] = set()
        # The patch's prefill rounds of the long path, capped by T or not, both from 0.
        self.long_rounds = Counter(names.LONG_PREFILL_ROUNDS_TOTAL,
                                   "Prefill rounds of the long-prefill path, by whether T capped them.",
                                   [*sched, names.CAPPED_LABEL], registry=r)
        self._rounds_seen = dict.fromkeys(names.CAPPED_VALUES, 0)
        for capped in self._rounds_seen:
            self.long_rounds.labels(**self.sched_labels, capped=capped)
        # The queue mix (slipstream.engine.metrics: bounded to tenants x SIZE_CLASSES).
        by_class = [*req, names.SIZE_CLASS_LABEL]
        self.arrivals = Counter(names.REQUEST_ARRIVALS_TOTAL, "Number of requests arrived.", req,
                                registry=r)
        self.queue_reqs = Gauge(names.QUEUE_REQS_BY_SIZE_CLASS,
                                "Requests in the waiting queue by uncached-token size class.",
                                by_class, registry=r)
        self.queue_tokens = Gauge(names.QUEUE_TOKENS_BY_SIZE_CLASS,
                                  "Uncached prompt tokens in the waiting queue by size class.",
                                  by_class, registry=r)
        self.ttft_by_class = Histogram(names.TTFT_BY_SIZE_CLASS_SECONDS,
                                       "Histogram of time to first token by uncached-token size class.",
                                       by_class, buckets=buckets.TTFT_BOUNDS_S, registry=r)
        self.class_tokens = Counter(names.PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL,
                                    "Prompt tokens at first token by size class and cache (cached/uncached).",
                                    [*by_class, names.CACHE_LABEL], registry=r)
        self._queue_keys: set[tuple[tuple[str, str], ...]] = set()
        self._known: set[tuple[tuple[str, str], ...]] = set()

    def arrived(self, labels: dict[str, str]) -> None:
        """A request arrived (before the scheduler sees it)."""
        self._known_at_zero(labels)
        self.arrivals.labels(**self.base, **labels).inc()

    def _known_at_zero(self, labels: dict[str, str]) -> None:
        """Create a new tenant's size-class series (the patch's) at 0 on its first arrival.

        Prometheus' ``increase`` counts only what changes between two scrapes of a series:
        a series that first appears holding 150,000 tokens adds nothing. Were the size-class
        series created at a request's first token, the first giant of each tenant and pod
        (the one that marks a phase change) would be missing from every window, and the
        queue mix would see the change a giant or two late. A request's first token comes
        at least one prefill after its arrival, so a scrape of the zeros comes between."""
        key = tuple(sorted(labels.items()))
        if key in self._known:
            return
        self._known.add(key)
        req = {**self.base, **labels}
        # SGLang's own families (the TTFT histogram) are left as upstream makes them, at
        # their first observation: the simulator must not hide what a real engine shows.
        for name in buckets.SIZE_CLASS_NAMES:
            cls = {**req, names.SIZE_CLASS_LABEL: name}
            self.ttft_by_class.labels(**cls)
            for cache in names.CACHE_PARTS:
                self.class_tokens.labels(**cls, cache=cache)

    def queue_mix(self, waiting: list[tuple[dict[str, str], int]]) -> None:
        """The queue now: (tenant labels, uncached tokens) per request with no first token
        yet (waiting, or part-way through its prefill), each whole, as the patched engine
        counts a request's prompt from its arrival to its first output.

        Every class and tenant seen before is reset to 0 first, so a drained queue reads 0
        rather than its last value."""
        reqs: dict[tuple[tuple[str, str], ...], int] = dict.fromkeys(self._queue_keys, 0)
        tokens = dict(reqs)
        for labels, uncached in waiting:
            key = tuple(sorted({**self.base, **labels,
                                names.SIZE_CLASS_LABEL: buckets.size_class(uncached)}.items()))
            reqs[key] = reqs.get(key, 0) + 1
            tokens[key] = tokens.get(key, 0) + uncached
        self._queue_keys.update(reqs)
        for key, n in reqs.items():
            self.queue_reqs.labels(**dict(key)).set(n)
            self.queue_tokens.labels(**dict(key)).set(tokens[key])

    def first_token(self, labels: dict[str, str], stream: bool, ttft_s: float,
                    prompt_tokens: int | None = None, cached_tokens: int = 0) -> None:
        """A first token; with ``prompt_tokens``, also its size class's TTFT and tokens."""
        self.ttft.labels(**self.base, **labels, is_streaming=_flag(stream)).observe(ttft_s)
        if prompt_tokens is None:
            return
        uncached = prompt_tokens - cached_tokens
        cls = {**self.base, **labels, names.SIZE_CLASS_LABEL: buckets.size_class(uncached)}
        self.ttft_by_class.labels(**cls).observe(ttft_s)
        self.class_tokens.labels(**cls, cache="uncached").inc(uncached)
        self.class_tokens.labels(**cls, cache="cached").inc(cached_tokens)

    def aborted(self, labels: dict[str, str]) -> None:
        self.aborted_total.labels(**self.base, **labels).inc()

    def finished(self, labels: dict[str, str], stream: bool, prompt_tokens: int, cached_tokens: int,
                 output_tokens: int, e2e_s: float) -> None:
        """What SGLang's tokenizer records when a request finishes."""
        req = {**self.base, **labels}
        s = _flag(stream)
        self.prompt_total.labels(**req, is_streaming=s).inc(prompt_tokens)
        self.generation_total.labels(**req, is_streaming=s).inc(output_tokens)
        if cached_tokens > 0:
            self.cached_total.labels(**req, cache_source="device").inc(cached_tokens)
        self.requests_total.labels(**req, is_streaming=s).inc()
        self.e2e.labels(**req, is_streaming=s).observe(e2e_s)
        self.prompt_hist.labels(**req).observe(prompt_tokens)
        self.uncached_hist.labels(**req).observe(prompt_tokens - cached_tokens)
        self.generation_hist.labels(**req).observe(output_tokens)

    def scheduler(self, running: int, queued: int, partials: int, threshold: int, mode: str,
                  policy: str, max_partials: int, token_usage: float) -> None:
        """The scheduler's gauges, set just before a scrape (the patch's log_long_prefill)."""
        s = self.sched_labels
        self.token_usage.labels(**s).set(token_usage)
        self.running.labels(**s).set(running)
        self.queued.labels(**s).set(queued)
        self.partials.labels(**s).set(partials)
        self.threshold.labels(**s).set(threshold)
        self.max_partials.labels(**s).set(max_partials)
        for m in admission.MODES:
            self.mode.labels(**s, mode=m).set(1 if m == mode else 0)
        self._policies.add(policy)
        for p in self._policies:
            self.policy.labels(**s, policy=p).set(1 if p == policy else 0)

    def rounds(self, long_rounds: int, capped_rounds: int) -> None:
        """The twin's tallies of long-path prefill rounds (``Engine.long_rounds``,
        ``capped_rounds``) into ``sglang:long_prefill_rounds_total``, set just before a
        scrape: each series rises by what the twin counted since the last one."""
        for capped, total in (("true", capped_rounds), ("false", long_rounds - capped_rounds)):
            if total > self._rounds_seen[capped]:
                self.long_rounds.labels(**self.sched_labels, capped=capped).inc(total - self._rounds_seen[capped])
                self._rounds_seen[capped] = total

    def late(self, lag_s: float) -> None:
        """A release ``lag_s`` twin seconds after it was due (``RELEASE_LAG_SECONDS``)."""
        self.release_lag.observe(max(0.0, lag_s))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _flag(stream: bool) -> str:
    return "true" if stream else "false"
