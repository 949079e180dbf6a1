"""Loaders for the public request traces (see ../shared/traces/README.md).

- Mooncake JSONL (FAST'25): ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (one id per 512-token block; equal ids are shared prefix blocks).
  Its arrivals come in ~3 s steps; the requests that share a timestamp are spread evenly
  over the interval up to the next distinct timestamp (``spread=True``, the default) or
  kept as one burst (``spread=False``).
- Azure LLM inference CSV (Splitwise, ISCA'24): ``TIMESTAMP,ContextTokens,GeneratedTokens``;
  no prefix data, so every request is one unshared block.

Bad input stops the load with ``TraceError`` naming file:line and the field.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime
from pathlib import Path

from slipstream.sim.workload import BLOCK_SPACE, Request, Workload, block_sizes_for, build, merge

MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be used; the message names file:line and field."""


def _int_field(obj: dict[str, object], name: str, where: str) -> int:
    if name not in obj:
        raise TraceError(f"{where}: field '{name}' is missing")
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: field '{name}' must be an integer, got {value!r}")
    if value < 0:
        raise TraceError(f"{where}: field '{name}' must be >= 0, got {value}")
    return value


def load_mooncake(
    path: Path, tenant: str, tenant_index: int = 0, spread: bool = True
) -> Workload:
    """Requests of a Mooncake JSONL trace as one tenant, in its own hash-id space."""
    rows: list[tuple[float, int, int, list[int]]] = []
    try:
        handle = path.open()
    except OSError as exc:
        raise TraceError(f"{path}: cannot open trace ({exc.strerror})") from None
    with handle:
        for lineno, line in enumerate(handle, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{where}: expected a JSON object per line")
            ts = obj.get("timestamp")
            if (isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts)
                    or ts < 0):
                # json reads NaN, Infinity and 1e400 (= inf) as floats: refuse them here, or
                # the twin's clock would never reach the request
                raise TraceError(f"{where}: field 'timestamp' must be a finite number >= 0 (ms), "
                                 f"got {ts!r}")
            n_in = _int_field(obj, "input_length", where)
            n_out = _int_field(obj, "output_length", where)
            if n_in == 0:
                raise TraceError(f"{where}: field 'input_length' must be > 0")
            ids = obj.get("hash_ids")
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
            ):
                raise TraceError(f"{where}: field 'hash_ids' must be a list of integers >= 0")
            if len(ids) != math.ceil(n_in / MOONCAKE_BLOCK_TOKENS):
                raise TraceError(
                    f"{where}: field 'hash_ids' has {len(ids)} blocks, but input_length {n_in} "
                    f"needs {math.ceil(n_in / MOONCAKE_BLOCK_TOKENS)} of {MOONCAKE_BLOCK_TOKENS}"
                )
            rows.append((float(ts) / 1000.0, n_in, n_out, ids))
    if not rows:
        raise TraceError(f"{path}: the trace holds no requests")
    rows.sort(key=lambda r: r[0])
    arrivals = _spread([r[0] for r in rows]) if spread else [r[0] for r in rows]
    t0 = arrivals[0]
    base = tenant_index * BLOCK_SPACE
    reqs = [
        Request(
            rid=f"{tenant}-{i}",
            tenant=tenant,
            arrival_s=at - t0,
            prompt_tokens=n_in,
            output_tokens=n_out,
            blocks=tuple(base + h for h in ids),
            block_sizes=block_sizes_for(n_in, len(ids), MOONCAKE_BLOCK_TOKENS),
        )
        for i, (at, (_, n_in, n_out, ids)) in enumerate(zip(arrivals, rows, strict=True))
    ]
    return build(tenant, reqs, description=f"mooncake:{path.name}")


def _spread(times: list[float]) -> list[float]:
    """Spread runs of equal timestamps evenly over the gap to the next distinct one."""
    out = list(times)
    i = 0
    n = len(times)
    while i < n:
        j = i
        while j < n and times[j] == times[i]:
            j += 1
        if j < n:
            gap = times[j] - times[i]
            for k in range(i, j):
                out[k] = times[i] + gap * (k - i) / (j - i)
        i = j
    return out


AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def _parse_azure_time(text: str, where: str) -> float:
    head, _, frac = text.strip().partition(".")
    try:
        base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
        fraction = float("0." + frac) if frac else 0.0
    except ValueError:
        raise TraceError(
            f"{where}: field 'TIMESTAMP' must look like 2023-11-16 18:17:03.97996, got {text!r}"
        ) from None
    return base.timestamp() + fraction


def load_azure(path: Path, tenant: str, tenant_index: int = 0) -> Workload:
    """Requests of an Azure LLM inference CSV trace as one tenant."""
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open trace ({exc.strerror})") from None
    rows: list[tuple[float, int, int]] = []
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header != AZURE_HEADER:
            raise TraceError(f"{path}:1: header must be {','.join(AZURE_HEADER)}, got {header}")
        for lineno, row in enumerate(reader, start=2):
            where = f"{path}:{lineno}"
            if not row:
                continue
            if len(row) != 3:
                raise TraceError(f"{where}: expected 3 fields, got {len(row)}")
            at = _parse_azure_time(row[0], where)
            values = []
            for name, text in zip(AZURE_HEADER[1:], row[1:], strict=True):
                try:
                    value = int(text)
                except ValueError:
                    raise TraceError(f"{where}: field '{name}' must be an integer, got {text!r}") from None
                if value < 0:
                    raise TraceError(f"{where}: field '{name}' must be >= 0, got {value}")
                values.append(value)
            if values[0] == 0:
                raise TraceError(f"{where}: field 'ContextTokens' must be > 0")
            rows.append((at, values[0], values[1]))
    if not rows:
        raise TraceError(f"{path}: the trace holds no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    base = tenant_index * BLOCK_SPACE
    reqs = [
        Request(f"{tenant}-{i}", tenant, at - t0, n_in, n_out, (base + i,), (n_in,))
        for i, (at, n_in, n_out) in enumerate(rows)
    ]
    return build(tenant, reqs, description=f"azure:{path.name}")


def load(path: str | Path, tenant: str | None = None, tenant_index: int = 0) -> Workload:
    """Load a trace by its extension: ``.jsonl`` (Mooncake) or ``.csv`` (Azure)."""
    p = Path(path)
    name = tenant or p.stem
    if not p.exists():
        raise TraceError(f"{p}: trace file does not exist (public traces: ../shared/traces/)")
    if p.suffix == ".jsonl":
        return load_mooncake(p, name, tenant_index)
    if p.suffix == ".csv":
        return load_azure(p, name, tenant_index)
    raise TraceError(f"{p}: unknown trace format '{p.suffix}': use .jsonl (Mooncake) or .csv (Azure)")


def load_many(paths: list[str], tenants: list[str] | None = None) -> Workload:
    """Several traces as one workload, one tenant each (``tenants`` match ``paths``; default:
    the file stems), each in its own hash-id space."""
    names_given = tenants or []
    if names_given and len(names_given) != len(paths):
        raise TraceError(f"--tenant given {len(names_given)} times for {len(paths)} --trace")
    parts = [load(path, names_given[k] if names_given else None, tenant_index=k + 1)
             for k, path in enumerate(paths)]
    names = [w.name for w in parts]
    if len(set(names)) != len(names):
        raise TraceError(f"two traces share the tenant name {names}: name them with --tenant")
    return merge("+".join(names), parts) if len(parts) > 1 else parts[0]
