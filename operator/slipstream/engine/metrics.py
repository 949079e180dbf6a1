"""Names of the engine's Prometheus metrics and of the tenant label header.

Stock SGLang 0.5.18 names, plus the gauges the Slipstream patch adds. `observe/` builds
its queries from these; the operator renders the engine flags that make them appear.
"""

from __future__ import annotations

TTFT_SECONDS = "sglang:time_to_first_token_seconds"
"""Histogram: time to first token, per request (tenant label from the custom-labels header)."""
UNCACHED_PROMPT_TOKENS = "sglang:uncached_prompt_tokens_histogram"
"""Histogram: prompt tokens not served from the prefix cache, per request; buckets reach 1M."""
GENERATION_TOKENS = "sglang:generation_tokens_histogram"
"""Histogram: output tokens of each finished request (tenant label as above)."""
E2E_REQUEST_LATENCY_SECONDS = "sglang:e2e_request_latency_seconds"
PROMPT_TOKENS_TOTAL = "sglang:prompt_tokens_total"
CACHED_TOKENS_TOTAL = "sglang:cached_tokens_total"
NUM_QUEUE_REQS = "sglang:num_queue_reqs"
NUM_RUNNING_REQS = "sglang:num_running_reqs"

LONG_PREFILL_TOKEN_THRESHOLD = "sglang:long_prefill_token_threshold"
"""Gauge (patch): T in effect; 0 is off."""
LONG_PREFILL_MODE = "sglang:long_prefill_mode"
"""Gauge (patch): 1 for the mode in effect, by label `mode` (ceiling | floor)."""
SCHEDULE_POLICY = "sglang:schedule_policy"
"""Gauge (patch): 1 for the admission order in effect, by label `policy` (fcfs | lpm | srpt)."""
NUM_PARTIAL_PREFILLS = "sglang:num_partial_prefills"
"""Gauge (patch): chunked (partial) prefills running this round."""

CUSTOM_LABELS_HEADER = "x-custom-labels"
"""HTTP header clients send the tenant in: `x-custom-labels: {"tenant": "acme"}`."""

# ---- The queue mix (patch and engine simulator) ----------------------------------------
# Per tenant, so the tuner sees the mix the engines are being sent, not only the requests
# that got through: arrivals are counted when a request arrives, and the waiting queue is
# read by size class, so requests starving in the queue are visible while they starve.

REQUEST_ARRIVALS_TOTAL = "sglang:request_arrivals_total"
"""Counter (patch): requests arrived, by tenant; counted on arrival, before any prefill."""
QUEUE_REQS_BY_SIZE_CLASS = "sglang:queue_reqs_by_size_class"
"""Gauge (patch): requests waiting (no prefill token yet), by tenant and ``size_class`` of
their uncached tokens."""
QUEUE_TOKENS_BY_SIZE_CLASS = "sglang:queue_tokens_by_size_class"
"""Gauge (patch): uncached prompt tokens of those waiting requests, same labels."""
TTFT_BY_SIZE_CLASS_SECONDS = "sglang:ttft_by_size_class_seconds"
"""Histogram (patch): time to first token by tenant and ``size_class`` (TTFT buckets), so
same-size requests can be compared."""
PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL = "sglang:prompt_tokens_by_size_class_total"
"""Counter (patch): prompt tokens of requests at their first token, by tenant,
``size_class`` and ``cache`` (``cached`` | ``uncached``): a cache-hit ratio per class."""

SIZE_CLASS_LABEL = "size_class"
CACHE_LABEL = "cache"
CACHE_PARTS = ("cached", "uncached")

SIZE_CLASSES: tuple[tuple[str, float], ...] = (
    ("le1k", 1_000),
    ("le8k", 8_000),
    ("le60k", 60_000),
    ("le300k", 300_000),
    ("gt300k", float("inf")),
)
"""(label value, largest uncached token count in the class), ascending.

Five classes bound every per-class family to tenants x 5 series (x 21 for the TTFT
histogram's buckets, ``_sum`` and ``_count``). Tenant values are bounded as for SGLang's own
per-tenant histograms, by the clients: ``--tokenizer-metrics-allowed-custom-labels`` bounds
the label names, not their values (docs/operator.md, "The queue mix"). Roughly log-spaced (x8, x7.5, x5): chat turns,
documents, long documents, very long contexts, giant cold prompts, each of which costs a
different order of prefill time. Every bound is also a bound of
``sglang:uncached_prompt_tokens_histogram`` (``api.buckets.PROMPT_TOKENS``), so a class is
a whole number of that histogram's buckets. ``le`` semantics: a request of exactly 1,000
uncached tokens is ``le1k``.
"""
SIZE_CLASS_NAMES: tuple[str, ...] = tuple(name for name, _ in SIZE_CLASSES)


def size_class(uncached_tokens: float) -> str:
    """The ``size_class`` label of a request with this many uncached prompt tokens."""
    for name, upper in SIZE_CLASSES:
        if uncached_tokens <= upper:
            return name
    return SIZE_CLASSES[-1][0]
