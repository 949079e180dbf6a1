"""Hardware/model cost profiles: the numbers the roofline cost model runs on.

A profile is plain data loaded from JSON (the calibration probe in
engine_image/calibrate/ writes the same format), so a measured GPU replaces a paper
estimate without code changes. Built-in profiles live in ``sim/profiles/*.json``, each
with a ``source`` field saying where every number comes from.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Profile:
    """Cost parameters of one model on one machine (SI units: FLOP, bytes, seconds)."""

    name: str
    description: str
    source: str
    flops_per_token: float
    """Linear-layer FLOPs per token, 2 x active parameters."""
    peak_flops: float
    """FLOP/s the linear layers reach when compute-bound (measured or peak x MFU)."""
    attn_flops_per_pair: float
    """Attention FLOPs per (query token, context token) pair: 4 x layers x heads x head_dim."""
    attn_flops_per_s: float
    """FLOP/s of the attention kernels; 0 attention FLOPs per pair turns the term off."""
    weight_bytes: float
    """Bytes of weights read by every forward pass."""
    kv_bytes_per_token: float
    """Bytes of KV cache per token of context (all layers)."""
    mem_bandwidth: float
    """Device memory bandwidth, bytes/s, summed over the tensor-parallel group."""
    overhead_s: float
    """Fixed cost of one forward pass (launches, scheduling, collectives), seconds."""
    host_bandwidth: float = 0.0
    """Host-to-device bytes/s for HiCache load-back; 0 = no host tier."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float | int) and value < 0:
                raise ValueError(f"profile {self.name!r}: {f.name} must be >= 0, got {value}")
        for name in ("flops_per_token", "peak_flops", "mem_bandwidth"):
            if getattr(self, name) <= 0:
                raise ValueError(f"profile {self.name!r}: {name} must be > 0")
        if self.attn_flops_per_pair > 0 and self.attn_flops_per_s <= 0:
            raise ValueError(
                f"profile {self.name!r}: attn_flops_per_s must be > 0 when attn_flops_per_pair is set"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def _key_line(text: str | None, key: str) -> str:
    """``:N`` with the line of ``"key":`` in the JSON text, or "" when unknown."""
    if text is None:
        return ""
    match = re.search(r'"' + re.escape(key) + r'"\s*:', text)
    return f":{text.count(chr(10), 0, match.start()) + 1}" if match else ""


def from_dict(data: dict[str, object], origin: str = "<dict>", text: str | None = None) -> Profile:
    """Build a profile from parsed JSON, naming the missing or unknown field on error
    (with its line when the JSON ``text`` is given). Numbers must be finite: Python's json
    reads NaN and Infinity, and a NaN cost would make every comparison false."""
    known = {f.name for f in fields(Profile)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{origin}{_key_line(text, unknown[0])}: unknown profile field(s) "
                         f"{unknown}; known: {sorted(known)}")
    kwargs: dict[str, object] = {}
    for f in fields(Profile):
        if f.name not in data:
            if f.name == "host_bandwidth":
                continue
            raise ValueError(f"{origin}: profile field {f.name!r} is missing")
        value = data[f.name]
        if f.type == "str":
            if not isinstance(value, str):
                raise ValueError(f"{origin}: profile field {f.name!r} must be a string")
        elif not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{origin}{_key_line(text, f.name)}: profile field {f.name!r} must be a "
                             f"finite number, got {value!r}")
        else:
            value = float(value)
        kwargs[f.name] = value
    try:
        return Profile(**kwargs)  # type: ignore[arg-type]
    except ValueError as exc:
        field = next((f.name for f in fields(Profile) if f"{f.name} must" in str(exc)), "")
        raise ValueError(f"{origin}{_key_line(text, field) if field else ''}: {exc}") from None


def builtin_names() -> list[str]:
    folder = resources.files("slipstream.sim") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load(name_or_path: str) -> Profile:
    """A built-in profile by name, or a JSON file by path."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path.exists():
        if not path.is_file():
            raise ValueError(f"profile file {name_or_path} does not exist")
        try:
            text = path.read_text()
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name_or_path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{name_or_path}: a profile is a JSON object")
        return from_dict(data, origin=name_or_path, text=text)
    if name_or_path not in builtin_names():
        raise ValueError(
            f"unknown profile {name_or_path!r}: use one of {builtin_names()} or a JSON file path"
        )
    text = (resources.files("slipstream.sim") / "profiles" / f"{name_or_path}.json").read_text()
    return from_dict(json.loads(text), origin=f"builtin:{name_or_path}", text=text)
