"""Upper bounds on every number a workload spec or a trace may give the twin.

Why bounds at all: the twin's cost is linear in requests, and a spec's generated tenants
turn ``rate_per_s x duration_s`` into requests before anything runs. Without a bound,
``duration_s: 1.0e+12`` or ``rate_per_s: 1.0e+9`` generate requests until memory runs out,
and a 1e300 trace timestamp turns into a rate scale of 1e298. Each bound sits far above
any real deployment (the public traces: 12,031 requests over one hour, prompts up to
~130K tokens) and far below what would hang or overflow. The loaders (``spec.py``,
``traces.py``) check them as they read and name the file, the field and the bound.
"""

from __future__ import annotations

MAX_SPAN_S = 10_000_000.0
"""Longest time a workload may span, seconds (about 116 days): ``duration_s``, every
``arrival_s``, and a trace's last arrival after its first."""
MAX_REQUESTS = 2_000_000
"""Most requests one workload may hold: explicit ones plus the *expected* number a spec's
tenants generate (sum of ``(rate_per_s + giant.rate_per_hour / 3600) x duration_s``), or a
trace's rows. The twin runs ~10^4-10^5 requests a second, so this is minutes, not hours."""
MAX_PROMPT_TOKENS = 100_000_000
"""Longest prompt, tokens (100M; every built-in profile's KV pool is under 2M, and a prompt
longer than the pool in use is refused separately, naming its id)."""
MAX_OUTPUT_TOKENS = 10_000_000
"""Longest output, tokens."""
MAX_RATE_PER_S = 100_000.0
"""Highest Poisson rate of one tenant, requests per second."""
MAX_GIANT_RATE_PER_HOUR = 360_000.0
"""Highest rate of a tenant's giant prompts, per hour (100 a second)."""
MAX_TURNS = 10_000
"""Most turns a session of a spec's tenant may have (``sessions.turns``)."""
MAX_SIGMA = 10.0
"""Largest lognormal sigma (e^10 ~ 22,000x the median at one sigma)."""
MAX_SEED = 2**63 - 1
"""Largest RNG seed."""
MAX_TIMESTAMP_MS = 1e13
"""Largest Mooncake ``timestamp`` (ms; 1e13 ms is the year 2286, so absolute epoch times fit)."""
MAX_HASH_ID = (1 << 34) - 1
"""Largest Mooncake hash id: a tiled copy of a trace offsets its ids by 2^34
(``workload.TILE_BLOCK_STRIDE``), so larger ids would collide with a copy's."""

ENGINE = {
    "chunked_prefill_size": 16_777_216,
    "page_size": 65_536,
    "max_prefill_tokens": MAX_PROMPT_TOKENS,
    "cache_tokens": 10_000_000_000,
    "host_cache_tokens": 100_000_000_000,
    "srpt_aging_tokens_per_s": 1e12,
    "kv_pool_tokens": 10_000_000_000,
    "max_running_requests": 1_000_000,
    "max_partial_prefills": 4096,
}
"""Upper bound of each ``engine:`` field of a spec."""


def words(bound: float) -> str:
    """A bound as the messages write it: whole numbers with digits grouped (10,000,000)."""
    if isinstance(bound, int) or float(bound).is_integer() and abs(bound) < 1e16:
        return f"{int(bound):,}"
    return f"{bound:g}"


def shown(value: float) -> str:
    """A refused value as a message shows it: short, even for an integer of 4,000 digits
    (which ``format(value, "g")`` cannot turn into a float)."""
    if isinstance(value, int):
        return f"{value:,}" if abs(value) < 10**16 else f"an integer of {len(str(abs(value)))} digits"
    return f"{value:g}"
