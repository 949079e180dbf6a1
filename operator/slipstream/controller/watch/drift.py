"""Hand edits of owned objects, found by comparing the live object with what the spec renders.

The operator owns the fields it applies (server-side apply, one field manager); fields it
does not set (defaults, status, other managers' additions to maps) are not its business. So
drift is: a field of the desired object whose live value differs — `kubectl scale` to 5
(spec.replicas), an extra `--tp-size=4` in the container's args, a changed image. Lists of
objects (containers, ports, env) are compared element by element; lists of scalars (args)
must be equal. Pure: the handler applies the desired object again and records an Event with
these paths.
"""

from __future__ import annotations

from typing import Any


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _list_change(want: list[Any], have: list[Any]) -> str:
    added = [v for v in have if v not in want]
    removed = [v for v in want if v not in have]
    parts = []
    if added:
        parts.append("added " + " ".join(_short(v) for v in added))
    if removed:
        parts.append("removed " + " ".join(_short(v) for v in removed))
    return ", ".join(parts) or "reordered"


def drift(desired: Any, live: Any, path: str = "") -> list[str]:
    """Where `live` departs from `desired` (each as `path: what`), desired's fields only."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [f"{path or '.'}: {_short(live)} (want an object)"]
        out: list[str] = []
        for key, want in desired.items():
            sub = f"{path}.{key}" if path else key
            if key not in live:
                out.append(f"{sub}: removed")
            else:
                out += drift(want, live[key], sub)
        return out
    if isinstance(desired, list):
        if not isinstance(live, list):
            return [f"{path}: {_short(live)} (want a list)"]
        if all(isinstance(v, dict) for v in desired) and desired and len(desired) == len(live):
            return [d for i, (w, h) in enumerate(zip(desired, live, strict=True)) for d in drift(w, h, f"{path}[{i}]")]
        if desired != live:
            return [f"{path}: {_list_change(desired, live)}"]
        return []
    if desired != live and str(desired) != str(live):
        return [f"{path}: {_short(live)} -> {_short(desired)}"]
    return []


WATCHED = ("metadata.labels", "metadata.ownerReferences", "spec")
"""The parts of an owned object compared (metadata.name and namespace identify it)."""


def of_object(desired: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """The drift of one owned object, over the parts the operator sets."""
    out: list[str] = []
    for part in WATCHED:
        head, _, tail = part.partition(".")
        want = desired.get(head, {})
        have = live.get(head, {})
        if tail:
            want, have = want.get(tail), have.get(tail)
        if want is not None:
            out += drift(want, have, part)
    return out


def managers_of(live: dict[str, Any], ours: str, *path: str) -> list[str]:
    """Field managers other than `ours` that own the field at `path` of `live` (e.g.
    `"f:spec", "f:replicas"`), from its managedFields, each with its subresource if any
    (`kubectl (scale)`): who else wrote it since the operator last applied it."""
    out = set()
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        fields: Any = entry.get("fieldsV1") or {}
        for key in path:
            fields = fields.get(key) if isinstance(fields, dict) else None
        if entry.get("manager") != ours and fields is not None:
            sub = entry.get("subresource")
            out.add(f"{entry.get('manager')}" + (f" ({sub})" if sub else ""))
    return sorted(out)
