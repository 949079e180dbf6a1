"""Text tables and JSON objects of simulation results (no I/O here: callers print)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slipstream.sim.engine import SimResult
from slipstream.sim.metrics import request_rows, summarize


def simulate_json(result: SimResult, source_key: str, source: Any) -> dict[str, Any]:
    """The object ``slipstream simulate --json`` prints."""
    rule = result.config
    return {
        source_key: source,
        "policy": result.policy,
        "profile": result.profile.name,
        "rate_scale": result.workload.rate_scale,
        "chunked_prefill_size": rule.chunked_prefill_size,
        "threshold": result.threshold,
        "requests": request_rows(result),
        "summary": _clean(summarize(result)),
    }


def _clean(obj: Any) -> Any:
    """NaN -> None so the JSON is strict."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    return obj


def bench_json(workload: str, rate_scale: float, summaries: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    return {"workload": workload, "rate_scale": rate_scale,
            "policies": {k: _clean(v) for k, v in summaries.items()}}


def _f(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    line = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), line, *(fmt(r) for r in rows)])


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _kv(s: dict[str, Any]) -> str:
    """Peak KV in use as a share of the pool ("-" without a pool)."""
    pool = s.get("kv_pool_tokens")
    return _pct(s["peak_kv_tokens"] / pool) if pool else "-"


COLUMNS = (
    # header, what it measures
    ("worst-tenant p99 slowdown", "p99 TTFT / TTFT alone, of the worst tenant"),
    ("slowdown p50", "median TTFT / TTFT alone"),
    ("slowdown p99", "p99 TTFT / TTFT alone"),
    ("TTFT p50 s", "median time to first token"),
    ("TTFT p99 s", "p99 time to first token"),
    ("ITL p99 s", "p99 of every inter-token gap of every stream"),
    ("max gap p99 s", "p99 over requests of each request's longest inter-token gap"),
    ("offered prefill tok/s", "uncached prompt tokens prefilled / run length (the load, not capacity)"),
    ("busy", "share of the run the engine was running a pass"),
    ("peak KV", "most KV in use at once, share of the profile's pool"),
    ("retractions", "decodes retracted when the pool ran out (SGLang's retract_decode)"),
    ("longest-decile p99 slowdown", "p99 slowdown of the 10% longest prompts"),
)


def comparison_table(summaries: Mapping[str, dict[str, Any]]) -> str:
    """One row per policy, worst-tenant p99 slowdown first (the headline)."""
    header = ["policy", *(h for h, _ in COLUMNS)]
    rows = [[name, _f(s["worst_tenant_slowdown_p99"]), _f(s["slowdown_p50"]), _f(s["slowdown_p99"]),
             _f(s["ttft_p50_s"]), _f(s["ttft_p99_s"]), _f(s["itl_p99_s"], 3), _f(s["max_itl_p99_s"], 3),
             _f(s["prefill_tokens_per_s"], 0), _pct(s["busy_fraction"]), _kv(s),
             str(s.get("retractions", 0)), _f(s["longest_decile_slowdown_p99"])]
            for name, s in summaries.items()]
    return _table(header, rows)


def column_legend() -> str:
    """What each column of ``comparison_table`` measures."""
    return "\n".join(f"  {h}: {what}" for h, what in COLUMNS)


def policy_table(name: str, summary: dict[str, Any]) -> str:
    """Overall and per-tenant figures of one policy."""
    header = ["tenant", "requests", "slowdown p50", "slowdown p99", "TTFT p50 s", "TTFT p99 s"]
    groups = [("(all)", summary), *summary["per_tenant"].items()]
    rows = [[t, str(g["requests"]), _f(g["slowdown_p50"]), _f(g["slowdown_p99"]),
             _f(g["ttft_p50_s"]), _f(g["ttft_p99_s"])] for t, g in groups]
    extra = (f"worst-tenant p99 slowdown {_f(summary['worst_tenant_slowdown_p99'])}, "
             f"ITL p99 {_f(summary['itl_p99_s'], 3)} s, "
             f"max gap p99 {_f(summary['max_itl_p99_s'], 3)} s, "
             f"offered prefill {_f(summary['prefill_tokens_per_s'], 0)} tok/s, "
             f"longest-decile p99 slowdown {_f(summary['longest_decile_slowdown_p99'])}, "
             f"busy {_pct(summary['busy_fraction'])} (prefill {_pct(summary['prefill_busy_fraction'])})")
    if summary.get("kv_pool_tokens"):
        extra += (f", peak KV {summary['peak_kv_tokens']:,} of {summary['kv_pool_tokens']:,} tokens, "
                  f"{summary.get('retractions', 0)} retractions")
    return f"== {name}\n{_table(header, rows)}\n{extra}"


def requests_table(result: SimResult) -> str:
    rows = [[r["id"], r["tenant"], _f(r["arrival_s"]), str(r["uncached_tokens"]),
             _f(r["first_token_s"]), _f(r["ttft_s"]), _f(r["solo_ttft_s"]), _f(r["slowdown"]),
             _f(r["max_itl_s"], 3)] for r in request_rows(result)]
    header = ["id", "tenant", "arrival s", "uncached", "first token s", "TTFT s", "solo s",
              "slowdown", "max gap s"]
    return _table(header, rows)
