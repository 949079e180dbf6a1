"""WorkloadSnapshot <-> plain JSON-able dicts (``slipstream recommend --snapshot FILE.json``).

Pure: parsing and formatting only; the caller reads and writes the file. Field names are
the dataclasses' own; errors name the field.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from slipstream.api.snapshot import (
    MIX_FALLBACKS,
    Histogram,
    PodPool,
    PodSetting,
    SizeClassWindow,
    TenantMix,
    TenantWindow,
    WorkloadSnapshot,
)


def to_dict(snapshot: WorkloadSnapshot) -> dict[str, Any]:
    return asdict(snapshot)


def _hist(data: Any, where: str) -> Histogram:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be an object with bounds, counts, total, sum")
    try:
        return Histogram(tuple(float(b) for b in data["bounds"]), tuple(float(c) for c in data["counts"]),
                         float(data["total"]), float(data["sum"]))
    except KeyError as exc:
        raise ValueError(f"{where}.{exc.args[0]} is missing") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def from_dict(data: Any) -> WorkloadSnapshot:
    """A snapshot from ``to_dict``'s shape; ValueError naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError("a snapshot must be a JSON object")
    for key in ("deployment", "taken_at", "window_s"):
        if key not in data:
            raise ValueError(f"snapshot field {key!r} is missing")
    tenants = []
    for k, t in enumerate(data.get("tenants") or ()):
        where = f"tenants[{k}]"
        if not isinstance(t, dict) or "name" not in t or "requests_per_s" not in t:
            raise ValueError(f"{where} needs name and requests_per_s")
        hit, out = t.get("cache_hit_ratio"), t.get("output_tokens")
        tenants.append(TenantWindow(str(t["name"]), float(t["requests_per_s"]),
                                    _hist(t.get("ttft"), f"{where}.ttft"),
                                    _hist(t.get("uncached_tokens"), f"{where}.uncached_tokens"),
                                    None if hit is None else float(hit),
                                    None if out is None else _hist(out, f"{where}.output_tokens")))
    pods = tuple(PodSetting(str(p["pod"]), None if p.get("threshold") is None else int(p["threshold"]),
                            str(p["mode"]), str(p["schedule_policy"]))
                 for p in data.get("pods") or ())
    mix = data.get("uncached_tokens")
    return WorkloadSnapshot(
        str(data["deployment"]), float(data["taken_at"]), float(data["window_s"]), tuple(tenants),
        None if mix is None else _hist(mix, "uncached_tokens"),
        None if data.get("queue_depth") is None else float(data["queue_depth"]),
        pods, data.get("invalid"), str(data.get("detail", "")),
        {str(k): float(v) for k, v in (data.get("extra") or {}).items()},
        kv_pools=tuple(_pool(p, f"kv_pools[{k}]") for k, p in enumerate(data.get("kv_pools") or ())),
        queue_mix=tuple(_mix(m, f"queue_mix[{k}]") for k, m in enumerate(data.get("queue_mix") or ())),
        mix_fallback=_fallback(data.get("mix_fallback")),
    )


def _mix(data: Any, where: str) -> TenantMix:
    if not isinstance(data, dict) or "name" not in data or "arrivals_per_s" not in data:
        raise ValueError(f"{where} needs name, arrivals_per_s and classes")
    classes = []
    for k, c in enumerate(data.get("classes") or ()):
        at = f"{where}.classes[{k}]"
        if not isinstance(c, dict) or "name" not in c:
            raise ValueError(f"{at} needs a name")
        try:
            classes.append(SizeClassWindow(str(c["name"]), *(float(c.get(f, 0.0)) for f in (
                "first_tokens", "uncached_tokens", "cached_tokens", "queued", "queued_tokens"))))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{at}: {exc}") from None
    return TenantMix(str(data["name"]), float(data["arrivals_per_s"]), tuple(classes))


def _fallback(value: Any) -> str | None:
    if value is None or value in MIX_FALLBACKS:
        return None if value is None else str(value)
    raise ValueError(f"mix_fallback must be null or one of {MIX_FALLBACKS}, got {value!r}")


def _pool(data: Any, where: str) -> PodPool:
    if not isinstance(data, dict) or "pod" not in data:
        raise ValueError(f"{where} must be an object with pod, tokens and problem")
    tokens = data.get("tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ValueError(f"{where}.tokens must be a whole number >= 1 or null, got {tokens!r}")
    return PodPool(str(data["pod"]), tokens, str(data.get("problem") or ""))
