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
    """Fixed cost of one prefill (extend) pass: launches, scheduling, collectives, seconds."""
    host_bandwidth: float = 0.0
    """Host-to-device bytes/s for HiCache load-back; 0 = no host tier."""
    overhead_source: str = ""
    """Where ``overhead_s`` comes from."""
    decode_overhead_s: float = -1.0
    """Fixed cost of one decode-only pass (CUDA graphs in SGLang); absent = ``overhead_s``."""
    decode_overhead_source: str = ""
    mixed_overhead_s: float = -1.0
    """Fixed cost of a pass carrying prefill chunks and decodes together (an extend batch,
    no CUDA graph); absent = ``overhead_s``."""
    mixed_overhead_source: str = ""
    hbm_bytes: float = 0.0
    """Device memory of the tensor-parallel group, bytes; 0 = no KV pool limit."""
    activation_bytes: float = 0.0
    """Memory SGLang keeps out of the KV pool for activations and CUDA graphs, bytes."""
    kv_pool_bytes_per_token: float = 0.0
    """Pool bytes one token of context takes over the whole group (MLA under tensor
    parallelism keeps a full copy on every device); absent = ``kv_bytes_per_token``."""
    memory_source: str = ""
    """Where the KV pool's numbers come from."""
    routed_expert_bytes: float = 0.0
    """Bytes of ``weight_bytes`` held by routed (mixture-of-experts) experts: a pass reads
    only the experts its tokens route to, which is why a small decode batch is cheap."""
    routed_experts: float = 0.0
    """Routed experts per MoE layer (0 = a dense model)."""
    experts_per_token: float = 0.0
    """Routed experts each token is sent to, per MoE layer."""
    mem_efficiency: float = 1.0
    """Share of ``mem_bandwidth`` a pass's weight and KV reads reach (fitted to published
    decode step times; 1.0 = the roofline)."""
    decode_source: str = ""
    """The published decode figures the decode terms are fitted to, and the fit."""

    def __post_init__(self) -> None:
        for name in ("decode_overhead_s", "mixed_overhead_s"):
            if getattr(self, name) == -1.0:  # absent: the prefill pass's overhead
                object.__setattr__(self, name, self.overhead_s)
        if not self.kv_pool_bytes_per_token:
            object.__setattr__(self, "kv_pool_bytes_per_token", self.kv_bytes_per_token)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float | int) and value < 0:
                raise ValueError(f"profile {self.name!r}: {f.name} must be >= 0, got {value}")
        for name in ("flops_per_token", "peak_flops", "mem_bandwidth", "mem_efficiency"):
            if getattr(self, name) <= 0:
                raise ValueError(f"profile {self.name!r}: {name} must be > 0")
        if self.mem_efficiency > 1:
            raise ValueError(f"profile {self.name!r}: mem_efficiency must be <= 1 (a share of "
                             f"mem_bandwidth), got {self.mem_efficiency}")
        if self.routed_expert_bytes > self.weight_bytes:
            raise ValueError(f"profile {self.name!r}: routed_expert_bytes must be <= weight_bytes")
        if self.routed_expert_bytes and not 0 < self.experts_per_token <= self.routed_experts:
            raise ValueError(f"profile {self.name!r}: experts_per_token must be in "
                             f"(0, routed_experts] when routed_expert_bytes is set")
        if self.attn_flops_per_pair > 0 and self.attn_flops_per_s <= 0:
            raise ValueError(
                f"profile {self.name!r}: attn_flops_per_s must be > 0 when attn_flops_per_pair is set"
            )
        _ = self.kv_pool_tokens  # refuses a pool that HBM cannot hold

    @property
    def kv_pool_tokens(self) -> int | None:
        """Tokens of KV the pool holds: HBM less weights and activations; None = unlimited."""
        if not self.hbm_bytes:
            return None
        free = self.hbm_bytes - self.weight_bytes - self.activation_bytes
        if free < self.kv_pool_bytes_per_token:
            raise ValueError(
                f"profile {self.name!r}: hbm_bytes {self.hbm_bytes:.4g} leaves no KV pool after "
                f"weight_bytes {self.weight_bytes:.4g} and activation_bytes "
                f"{self.activation_bytes:.4g}"
            )
        return int(free // self.kv_pool_bytes_per_token)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


DEFAULT_PROFILE = "kimi-k3-8xh200"
"""The profile the twin and the engine simulator run when none is named: the one model/GPU
pair calibrated end to end (the operator's ``twin_profile``, the CLI's and the simulator's
``--profile``, the demo's engines)."""

OPTIONAL_FIELDS = frozenset(f.name for f in fields(Profile)) - {
    "name", "description", "source", "flops_per_token", "peak_flops", "attn_flops_per_pair",
    "attn_flops_per_s", "weight_bytes", "kv_bytes_per_token", "mem_bandwidth", "overhead_s",
}
"""Fields a profile file may leave out (older files and the calibration probe's output)."""


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
            if f.name in OPTIONAL_FIELDS:
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
