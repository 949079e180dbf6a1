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
"""Gauge (patch): 1 for the mode in effect, by label `mode` (ceiling | floor | reflex)."""
SCHEDULE_POLICY = "sglang:schedule_policy"
"""Gauge (patch): 1 for the admission order in effect, by label `policy` (fcfs | lpm | srpt)."""
NUM_PARTIAL_PREFILLS = "sglang:num_partial_prefills"
"""Gauge (patch): chunked (partial) prefills running this round."""
LONG_PREFILL_ROUNDS_TOTAL = "sglang:long_prefill_rounds_total"
"""Counter (patch): prefill rounds of the long-prefill path (T > 0 in force, or two or more
partial prefills left after T was turned off), by label ``capped``: ``true`` when the round
ran under the cap T (every ceiling and floor round; a reflex round when a short request
waits or the hold runs), ``false`` when it ran without (an uncapped reflex round). Both
series start at 0. ``rate(...{capped="true"}) / rate(...)`` is the share of passes capped:
1 in ceiling and floor mode, the reflex's decisions in reflex mode; stock (T = 0) counts
no rounds."""
CAPPED_LABEL = "capped"
CAPPED_VALUES = ("true", "false")

CUSTOM_LABELS_HEADER = "x-custom-labels"
"""HTTP header clients send the tenant in: `x-custom-labels: {"tenant": "acme"}`."""

# ---- The queue mix (the patch, both versions, from its tokenizer manager; the engine simulator) --
# The patched engine classifies the queue gauges by prompt tokens (its tokenizer does not know
# the cached part before the first token), the simulator by the uncached tokens (docs/engine.md).
# Per tenant, so the tuner sees the mix the engines are being sent, not only the requests
# that got through: arrivals are counted when a request arrives, and the requests with no
# first token yet are read by size class, so requests starving in the queue (or a giant
# blocking it with its prefill) are visible while they do. Without these series the
# snapshot falls back to the uncached-prompt histogram (``mix_fallback``).

REQUEST_ARRIVALS_TOTAL = "sglang:request_arrivals_total"
"""Counter: requests arrived, by tenant; counted on arrival, before any prefill."""
QUEUE_REQS_BY_SIZE_CLASS = "sglang:queue_reqs_by_size_class"
"""Gauge: requests with no first token
yet (waiting, or part-way through their prefill), by tenant and ``size_class`` of their
prompt (the patched engine: prompt tokens, since its tokenizer manager does not know the
cached part before the first token; the simulator: uncached tokens), whole from arrival to
the first output."""
QUEUE_TOKENS_BY_SIZE_CLASS = "sglang:queue_tokens_by_size_class"
"""Gauge: the tokens of those requests (as classed above), same labels."""
TTFT_BY_SIZE_CLASS_SECONDS = "sglang:ttft_by_size_class_seconds"
"""Histogram: time to first token by tenant and ``size_class`` (TTFT buckets), so
same-size requests can be compared."""
PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL = "sglang:prompt_tokens_by_size_class_total"
"""Counter: prompt tokens of requests at their first token, by tenant,
``size_class`` and ``cache`` (``cached`` | ``uncached``): a cache-hit ratio per class."""

SIZE_CLASS_LABEL = "size_class"
CACHE_LABEL = "cache"
CACHE_PARTS = ("cached", "uncached")

# The size classes (``SIZE_CLASS_LABEL``'s values) are the snapshot's vocabulary too (the
# tuner reads them), so they live in api.buckets beside the histogram bounds they are made of.
