"""Loaders for the public request traces (see ../shared/traces/README.md).

- Mooncake JSONL (FAST'25): ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (one id per 512-token block; equal ids are shared prefix blocks).
  Its arrivals come in ~3 s steps; the requests that share a timestamp are spread evenly
  over the interval up to the next distinct timestamp (``spread=True``, the default) or
  kept as one burst (``spread=False``).
- Azure LLM inference CSV (Splitwise, ISCA'24): ``TIMESTAMP,ContextTokens,GeneratedTokens``;
  no prefix data, so every request is one unshared block.

Bad input stops the load with ``TraceError`` naming file:line and the field. Every column
has an upper bound (``slipstream.sim.bounds``): ``timestamp`` <= 1e13 ms and the last
arrival at most 10,000,000 s after the first; ``input_length``/``ContextTokens`` <=
100,000,000; ``output_length``/``GeneratedTokens`` <= 10,000,000; each hash id <= 2^34 - 1;
at most 2,000,000 rows. A file that is not UTF-8 text is refused by name.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TextIO

from slipstream.sim import bounds
from slipstream.sim.workload import BLOCK_SPACE, Request, Workload, block_sizes_for, build, merge

MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be used; the message names file:line and field."""


def _int_field(obj: dict[str, object], name: str, where: str, bound: int) -> int:
    if name not in obj:
        raise TraceError(f"{where}: field '{name}' is missing")
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: field '{name}' must be an integer, got {value!r}")
    if value < 0:
        raise TraceError(f"{where}: field '{name}' must be >= 0, got {value}")
    _check_bound(value, bound, name, where)
    return value


def _check_bound(value: float, bound: float, name: str, where: str) -> None:
    if value > bound:
        raise TraceError(f"{where}: field '{name}' must be <= {bounds.words(bound)} (the bound "
                         f"in slipstream.sim.bounds), got {bounds.shown(value)}")


def _check_rows(count: int, where: str) -> None:
    if count > bounds.MAX_REQUESTS:
        raise TraceError(f"{where}: the trace holds more than {bounds.words(bounds.MAX_REQUESTS)} "
                         "requests (the bound in slipstream.sim.bounds): split it")


def _check_span(path: Path, first: float, last: float, field: str) -> None:
    """The last arrival at most ``bounds.MAX_SPAN_S`` after the first: a far timestamp
    would otherwise stretch the span, and with it the fitted rate scale, by its size."""
    if last - first > bounds.MAX_SPAN_S:
        raise TraceError(f"{path}: field '{field}' spans {last - first:.3g} s from the first "
                         f"arrival to the last, more than the bound of "
                         f"{bounds.words(bounds.MAX_SPAN_S)} s (slipstream.sim.bounds)")


def _undecodable(path: Path, exc: UnicodeDecodeError) -> TraceError:
    return TraceError(f"{path}: cannot be decoded as UTF-8 text (byte {exc.start}: a binary "
                      "file?); give a Mooncake .jsonl or Azure .csv trace")


def load_mooncake(
    path: Path, tenant: str, tenant_index: int = 0, spread: bool = True
) -> Workload:
    """Requests of a Mooncake JSONL trace as one tenant, in its own hash-id space."""
    rows: list[tuple[float, int, int, list[int]]] = []
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open trace ({exc.strerror})") from None
    with handle:
        try:
            _read_mooncake(path, handle, rows)
        except UnicodeDecodeError as exc:
            raise _undecodable(path, exc) from None
    if not rows:
        raise TraceError(f"{path}: the trace holds no requests")
    rows.sort(key=lambda r: r[0])
    _check_span(path, rows[0][0], rows[-1][0], "timestamp")
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


def _read_mooncake(path: Path, handle: TextIO, rows: list[tuple[float, int, int, list[int]]]
                   ) -> None:
    """Append each line's (arrival s, input, output, hash ids) to ``rows``."""
    for lineno, line in enumerate(handle, start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
        except ValueError as exc:  # an integer of more than 4,300 digits
            raise TraceError(f"{where}: not usable JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object per line")
        ts = obj.get("timestamp")
        if (isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0
                or isinstance(ts, float) and not math.isfinite(ts)):
            # json reads NaN, Infinity and 1e400 (= inf) as floats: refuse them here, or
            # the twin's clock would never reach the request
            raise TraceError(f"{where}: field 'timestamp' must be a finite number >= 0 (ms), "
                             f"got {ts!r}")
        _check_bound(ts, bounds.MAX_TIMESTAMP_MS, "timestamp", where)
        n_in = _int_field(obj, "input_length", where, bounds.MAX_PROMPT_TOKENS)
        n_out = _int_field(obj, "output_length", where, bounds.MAX_OUTPUT_TOKENS)
        if n_in == 0:
            raise TraceError(f"{where}: field 'input_length' must be > 0")
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
        ):
            raise TraceError(f"{where}: field 'hash_ids' must be a list of integers >= 0")
        if ids and max(ids) > bounds.MAX_HASH_ID:
            raise TraceError(f"{where}: field 'hash_ids' holds {max(ids)}, more than the "
                             f"bound of 2^34 - 1 (slipstream.sim.bounds)")
        if len(ids) != math.ceil(n_in / MOONCAKE_BLOCK_TOKENS):
            raise TraceError(
                f"{where}: field 'hash_ids' has {len(ids)} blocks, but input_length {n_in} "
                f"needs {math.ceil(n_in / MOONCAKE_BLOCK_TOKENS)} of {MOONCAKE_BLOCK_TOKENS}"
            )
        rows.append((float(ts) / 1000.0, n_in, n_out, ids))
        _check_rows(len(rows), where)


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
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open trace ({exc.strerror})") from None
    rows: list[tuple[float, int, int]] = []
    with handle:
        try:
            _read_azure(path, handle, rows)
        except UnicodeDecodeError as exc:
            raise _undecodable(path, exc) from None
    if not rows:
        raise TraceError(f"{path}: the trace holds no requests")
    rows.sort(key=lambda r: r[0])
    _check_span(path, rows[0][0], rows[-1][0], "TIMESTAMP")
    t0 = rows[0][0]
    base = tenant_index * BLOCK_SPACE
    reqs = [
        Request(f"{tenant}-{i}", tenant, at - t0, n_in, n_out, (base + i,), (n_in,))
        for i, (at, n_in, n_out) in enumerate(rows)
    ]
    return build(tenant, reqs, description=f"azure:{path.name}")


AZURE_BOUNDS = {"ContextTokens": bounds.MAX_PROMPT_TOKENS,
                "GeneratedTokens": bounds.MAX_OUTPUT_TOKENS}


def _read_azure(path: Path, handle: TextIO, rows: list[tuple[float, int, int]]) -> None:
    """Append each row's (arrival s, context tokens, generated tokens) to ``rows``."""
    reader = csv.reader(handle)
    try:
        _read_azure_rows(path, reader, rows)
    except csv.Error as exc:  # a NUL byte, an unterminated quote at the end
        raise TraceError(f"{path}:{reader.line_num}: not a CSV row ({exc})") from None


def _read_azure_rows(path: Path, reader: Iterator[list[str]],
                     rows: list[tuple[float, int, int]]) -> None:
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
            _check_bound(value, AZURE_BOUNDS[name], name, where)
            values.append(value)
        if values[0] == 0:
            raise TraceError(f"{where}: field 'ContextTokens' must be > 0")
        rows.append((at, values[0], values[1]))
        _check_rows(len(rows), where)


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
