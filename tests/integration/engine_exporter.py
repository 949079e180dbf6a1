"""A small real exporter with the engine's metric names, labels and buckets.

Stands in for one engine pod's ``/metrics`` (until the engine simulator serves the same):
prometheus_client's own HTTP server on a free loopback port, its own registry, and the
metrics SGLang 0.5.18 (plus the Slipstream patch) exports with the same names, label names
and default buckets (``TokenizerMetricsCollector``: TTFT 0.1 s .. 400 s; prompt tokens
100 .. 1.1M). The test drives the observations; Prometheus scrapes them for real.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from slipstream.engine import metrics
from slipstream.localkube import ports

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
"""sglang 0.5.18 TokenizerMetricsCollector's default ``bucket_time_to_first_token``."""

PROMPT_TOKEN_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
    12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000,
    100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000,
)
"""sglang 0.5.18's ``default_bucket_prompt_tokens`` (also the uncached-token histogram's)."""

BASE_LABELS = {"model_name": "kimi-k3"}
"""The engine's own labels (tenant comes from the custom-labels header)."""


class EngineExporter:
    """One engine pod's metrics, served on 127.0.0.1:<port>/metrics."""

    def __init__(
        self,
        threshold: int | None = 0,
        mode: str = "ceiling",
        policy: str = "fcfs",
        *,
        host: str = ports.LOOPBACK,
        port: int | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        tenant = [*BASE_LABELS, "tenant"]
        self.ttft = Histogram(
            metrics.TTFT_SECONDS, "TTFT", [*tenant, "is_streaming"],
            buckets=TTFT_BUCKETS, registry=self.registry,
        )
        self.uncached = Histogram(
            metrics.UNCACHED_PROMPT_TOKENS, "uncached prompt tokens", tenant,
            buckets=PROMPT_TOKEN_BUCKETS, registry=self.registry,
        )
        self.output = Histogram(
            metrics.GENERATION_TOKENS, "generation tokens", tenant,
            buckets=PROMPT_TOKEN_BUCKETS, registry=self.registry,
        )
        self.prompt_tokens = Counter(
            metrics.PROMPT_TOKENS_TOTAL.removesuffix("_total"), "prompt tokens",
            [*tenant, "is_streaming"], registry=self.registry,
        )
        self.cached_tokens = Counter(
            metrics.CACHED_TOKENS_TOTAL.removesuffix("_total"), "cached tokens",
            [*tenant, "cache_source"], registry=self.registry,
        )
        self.queue = Gauge(metrics.NUM_QUEUE_REQS, "queue", list(BASE_LABELS), registry=self.registry)
        self.threshold = Gauge(
            metrics.LONG_PREFILL_TOKEN_THRESHOLD, "T", list(BASE_LABELS), registry=self.registry
        )
        self.mode = Gauge(metrics.LONG_PREFILL_MODE, "mode", [*BASE_LABELS, "mode"], registry=self.registry)
        self.policy = Gauge(
            metrics.SCHEDULE_POLICY, "policy", [*BASE_LABELS, "policy"], registry=self.registry
        )
        self.set_queue(0)
        if threshold is not None:  # None: a stock engine, which exports no setting gauge
            self.set_setting(threshold, mode, policy)
        self.port = port if port is not None else ports.free_ports(1)[0]
        self._server, self._thread = start_http_server(self.port, addr=host, registry=self.registry)
        self.address = f"{host}:{self.port}"

    def open_tenant(self, tenant: str) -> None:
        """Create the tenant's series at zero (as a first request's labels would)."""
        labels = {**BASE_LABELS, "tenant": tenant}
        self.ttft.labels(**labels, is_streaming="true")
        self.uncached.labels(**labels)
        self.output.labels(**labels)
        self.prompt_tokens.labels(**labels, is_streaming="true")
        self.cached_tokens.labels(**labels, cache_source="device")

    def request(self, tenant: str, ttft_s: float, prompt_tokens: int, cached_tokens: int,
                output_tokens: int = 1) -> None:
        """One finished request, recorded the way SGLang's tokenizer manager records it."""
        labels = {**BASE_LABELS, "tenant": tenant}
        self.ttft.labels(**labels, is_streaming="true").observe(ttft_s)
        self.uncached.labels(**labels).observe(prompt_tokens - cached_tokens)
        self.output.labels(**labels).observe(output_tokens)
        self.prompt_tokens.labels(**labels, is_streaming="true").inc(prompt_tokens)
        if cached_tokens:
            self.cached_tokens.labels(**labels, cache_source="device").inc(cached_tokens)

    def set_queue(self, depth: int) -> None:
        self.queue.labels(**BASE_LABELS).set(depth)

    def set_setting(self, threshold: int, mode: str, policy: str) -> None:
        self.threshold.labels(**BASE_LABELS).set(threshold)
        for m in ("ceiling", "floor"):
            self.mode.labels(**BASE_LABELS, mode=m).set(1 if m == mode else 0)
        for p in ("fcfs", "lpm", "srpt"):
            self.policy.labels(**BASE_LABELS, policy=p).set(1 if p == policy else 0)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
