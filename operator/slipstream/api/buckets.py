"""SGLang 0.5.18's histogram bucket bounds: what the engines export, what the twin bins into.

Read from sglang 0.5.18's ``sglang/srt/observability/metrics_collector.py``
(``TokenizerMetricsCollector.__init__``, ``default_bucket_prompt_tokens`` and
``bucket_time_to_first_token``; ``generate_buckets(["default"], ...)`` sorts and
de-duplicates them). The engine simulator exports with these bounds and the twin's
``auto`` bins its first tokens into them, so the tuner sees the same resolution in the
twin as from Prometheus in a cluster.
"""

from __future__ import annotations

TTFT_BOUNDS_S: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0,
)
"""``sglang:time_to_first_token_seconds`` upper bounds (``le``), seconds."""

PROMPT_TOKENS: tuple[float, ...] = (
    100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0,
    7000.0, 8000.0, 9000.0, 10000.0, 12500.0, 15000.0, 17500.0, 20000.0, 22500.0, 25000.0,
    27500.0, 30000.0, 35000.0, 40000.0, 60000.0, 80000.0, 100000.0, 200000.0, 300000.0,
    400000.0, 600000.0, 800000.0, 1000000.0, 1100000.0,
)
"""``sglang:prompt_tokens_histogram`` and ``sglang:uncached_prompt_tokens_histogram`` upper
bounds (``le``), tokens."""


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
``sglang:uncached_prompt_tokens_histogram`` (``PROMPT_TOKENS``), so a class is
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
