"""Calibration probe: measure one model shape on this device and write the twin's profile.

    python3 engine_image/calibrate/probe.py --name llama3-8b-h200 --hidden 4096 --layers 32 \
        --heads 32 --kv-heads 8 --head-dim 128 --intermediate 14336 --dtype bfloat16 \
        --out llama3-8b-h200.json

It runs transformer layers of the given shape with random weights (torch only; no model
download, no sglang) and measures
- prefill: seconds per forward pass against the chunk size (tokens per pass), fitted as
  ``t = overhead + L * linear_s + pairs(L) * attn_s`` with ``pairs(L) = L (L + 1) / 2``;
- decode: seconds per step against the batch size at a fixed context, fitted as
  ``t = t0 + B * kv_s``;
- memory bandwidth (a large device-to-device copy) and, on CUDA, host-to-device bandwidth.
From the fit and the shape it derives the profile fields of
``slipstream.sim.profiles.Profile`` (name, description, source, flops_per_token,
attn_flops_per_pair, peak_flops, attn_flops_per_s, weight_bytes, kv_bytes_per_token,
mem_bandwidth, overhead_s, host_bandwidth) and finds the ridge point: the chunk size at
which a prefill pass stops being memory-bound (``weight_bytes / mem_bandwidth /
linear_s``), next to the measured knee of the prefill curve. The profile goes to --out;
the raw points, the fits and the ridge to ``<out without .json>.measurements.json``.

Only ``--measure-layers`` layers run (default 2) and the times are scaled to ``--layers``:
layers are identical, so this keeps the probe short and small in memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}")
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.heads % self.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")

    @property
    def dtype_bytes(self) -> int:
        return torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    @property
    def params_per_layer(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        return qkv + out + mlp

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.params_per_layer * self.layers

    @property
    def attn_flops_per_pair(self) -> float:
        # q.k and p.v: 2 x 2 FLOPs per head dimension, per layer and query head
        return 4.0 * self.layers * self.heads * self.head_dim

    @property
    def weight_bytes(self) -> float:
        return float(self.params_per_layer * self.layers * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> float:
        return float(self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes)


class Layer(torch.nn.Module):
    """One pre-norm decoder layer (GQA attention + gated MLP) with random weights."""

    def __init__(self, s: Shape, device: str) -> None:
        super().__init__()
        dt = DTYPES[s.dtype]
        self.s = s
        std = s.hidden**-0.5

        def w(o: int, i: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(
                torch.randn(o, i, dtype=dt, device=device) * std, requires_grad=False
            )

        self.qkv = w((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden)
        self.o = w(s.hidden, s.heads * s.head_dim)
        self.gate_up = w(2 * s.intermediate, s.hidden)
        self.down = w(s.hidden, s.intermediate)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.s
        qkv = F.linear(x, self.qkv)
        q, k, v = qkv.split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
        )
        return q, k, v

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down)

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """x: (L, hidden), one request's chunk attending causally to itself."""
        s = self.s
        n = x.shape[0]
        q, k, v = self._split(F.rms_norm(x, (s.hidden,)))
        q = q.view(n, s.heads, s.head_dim).transpose(0, 1)
        k = k.view(n, s.kv_heads, s.head_dim).transpose(0, 1)
        v = v.view(n, s.kv_heads, s.head_dim).transpose(0, 1)
        rep = s.heads // s.kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(a.transpose(0, 1).reshape(n, -1), self.o)
        return x + self._mlp(F.rms_norm(x, (s.hidden,)))

    def decode(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """x: (B, hidden), one new token per request against (B, kv_heads, ctx, d) caches."""
        s = self.s
        b = x.shape[0]
        q, _, _ = self._split(F.rms_norm(x, (s.hidden,)))
        q = q.view(b, s.kv_heads, s.heads // s.kv_heads, s.head_dim)
        scores = torch.einsum("bgqd,bgcd->bgqc", q, k_cache) * s.head_dim**-0.5
        a = torch.einsum("bgqc,bgcd->bgqd", scores.softmax(-1), v_cache)
        x = x + F.linear(a.reshape(b, -1), self.o)
        return x + self._mlp(F.rms_norm(x, (s.hidden,)))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def lstsq_nonneg(columns: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Least squares ``y ~ sum(c_i * columns_i)`` with every coefficient >= 0 (active set:
    a negative coefficient is dropped to 0 and the rest refitted)."""
    active = list(range(len(columns)))
    coef = [0.0] * len(columns)
    while active:
        a = torch.tensor(
            [[columns[j][i] for j in active] for i in range(len(y))], dtype=torch.float64
        )
        sol = (
            torch.linalg.lstsq(a, torch.tensor(y, dtype=torch.float64).unsqueeze(1), driver="gelsd")
            .solution.squeeze(1)
            .tolist()
        )
        negative = [j for j, c in zip(active, sol, strict=True) if c < 0]
        if not negative:
            for j, c in zip(active, sol, strict=True):
                coef[j] = float(c)
            return coef
        worst = min(zip(sol, active, strict=True))[1]
        active.remove(worst)
    return coef


def pairs(length: int) -> int:
    return length * (length + 1) // 2


def fit_prefill(chunks: Sequence[int], seconds: Sequence[float]) -> dict[str, float]:
    """``t = overhead + L * linear_s + pairs(L) * attn_s``, coefficients >= 0."""
    overhead, linear_s, attn_s = lstsq_nonneg(
        [[1.0] * len(chunks), [float(c) for c in chunks], [float(pairs(c)) for c in chunks]],
        seconds,
    )
    return {"overhead_s": overhead, "linear_s_per_token": linear_s, "attn_s_per_pair": attn_s}


def fit_decode(batches: Sequence[int], seconds: Sequence[float]) -> dict[str, float]:
    """``t = t0 + B * per_request_s``, coefficients >= 0."""
    t0, per_req = lstsq_nonneg([[1.0] * len(batches), [float(b) for b in batches]], seconds)
    return {"step_s_at_zero_batch": t0, "s_per_request": per_req}


def measured_knee(chunks: Sequence[int], seconds: Sequence[float]) -> int | None:
    """Smallest measured chunk whose pass takes 1.5x the smallest chunk's: past it the
    pass time grows with the chunk (compute-bound); below it the pass is a fixed cost."""
    base = seconds[0]
    for c, t in zip(chunks, seconds, strict=True):
        if t >= 1.5 * base:
            return int(c)
    return None


def copy_bandwidth(device: str, nbytes: int, repeats: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device, repeats)
    return 2.0 * src.numel() * 4 / t  # read + write


def host_bandwidth(device: str, nbytes: int, repeats: int) -> float:
    if not device.startswith("cuda"):
        return 0.0
    host = torch.empty(nbytes // 4, dtype=torch.float32).pin_memory()
    dev = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    t = timed(lambda: dev.copy_(host, non_blocking=True), device, repeats)
    return nbytes / t


def probe(
    shape: Shape,
    name: str,
    device: str = "cpu",
    chunks: Sequence[int] = (),
    batches: Sequence[int] = (),
    decode_context: int = 4096,
    measure_layers: int = 2,
    repeats: int = 5,
    copy_bytes: int = 1 << 28,
    description: str = "",
) -> tuple[dict, dict]:
    """Measure and fit; returns (profile dict, measurements dict)."""
    torch.manual_seed(0)
    chunks = sorted(chunks) or [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    batches = sorted(batches) or [1, 2, 4, 8, 16, 32, 64]
    n = max(1, min(measure_layers, shape.layers))
    scale = shape.layers / n
    layers = [Layer(shape, device) for _ in range(n)]
    dt = DTYPES[shape.dtype]

    prefill_s = []
    with torch.inference_mode():
        for c in chunks:
            x = torch.randn(c, shape.hidden, dtype=dt, device=device)

            def run_prefill(x: torch.Tensor = x) -> None:
                h = x
                for layer in layers:
                    h = layer.prefill(h)

            prefill_s.append(timed(run_prefill, device, repeats) * scale)

        decode_s = []
        for b in batches:
            x = torch.randn(b, shape.hidden, dtype=dt, device=device)
            kc = torch.randn(
                b, shape.kv_heads, decode_context, shape.head_dim, dtype=dt, device=device
            )
            vc = torch.randn_like(kc)

            def run_decode(
                x: torch.Tensor = x, kc: torch.Tensor = kc, vc: torch.Tensor = vc
            ) -> None:
                h = x
                for layer in layers:
                    h = layer.decode(h, kc, vc)

            decode_s.append(timed(run_decode, device, repeats) * scale)

    pf = fit_prefill(chunks, prefill_s)
    dc = fit_decode(batches, decode_s)
    bw = copy_bandwidth(device, copy_bytes, repeats)
    hbw = host_bandwidth(device, copy_bytes, repeats)

    linear_s = pf["linear_s_per_token"]
    if linear_s <= 0:  # the chunk range never left the fixed-cost regime
        linear_s = max(prefill_s[-1] - pf["overhead_s"], 1e-12) / chunks[-1]
    peak = shape.flops_per_token / linear_s
    attn_rate = (
        shape.attn_flops_per_pair / pf["attn_s_per_pair"] if pf["attn_s_per_pair"] > 0 else peak
    )
    weights_s = shape.weight_bytes / bw
    ridge_model = int(weights_s / linear_s)

    torch_version = torch.__version__
    dev_name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    profile = {
        "name": name,
        "description": description
        or (
            f"Measured by engine_image/calibrate/probe.py on {dev_name}: hidden {shape.hidden}, "
            f"{shape.layers} layers, {shape.heads} heads ({shape.kv_heads} KV), head_dim "
            f"{shape.head_dim}, intermediate {shape.intermediate}, {shape.dtype}."
        ),
        "source": (
            f"torch {torch_version}; prefill chunks {list(chunks)} fitted t = overhead + L*linear "
            f"+ L(L+1)/2*attn; decode batches {list(batches)} at context {decode_context}; "
            f"{n} of {shape.layers} layers run, times scaled; bandwidth from a "
            f"{copy_bytes >> 20} MiB device copy; FLOPs, weight and KV bytes from the shape."
        ),
        "flops_per_token": float(shape.flops_per_token),
        "attn_flops_per_pair": float(shape.attn_flops_per_pair),
        "peak_flops": float(peak),
        "attn_flops_per_s": float(attn_rate),
        "weight_bytes": float(shape.weight_bytes),
        "kv_bytes_per_token": float(shape.kv_bytes_per_token),
        "mem_bandwidth": float(bw),
        "overhead_s": float(pf["overhead_s"]),
        "host_bandwidth": float(hbw),
    }
    measurements = {
        "shape": asdict(shape),
        "device": dev_name,
        "prefill": {
            "chunks": list(chunks),
            "seconds": prefill_s,
            "tokens_per_s": [c / t for c, t in zip(chunks, prefill_s, strict=True)],
            "fit": pf,
        },
        "decode": {
            "batches": list(batches),
            "context": decode_context,
            "seconds": decode_s,
            "fit": dc,
        },
        "ridge_tokens_model": ridge_model,
        "ridge_tokens_measured_knee": measured_knee(chunks, prefill_s),
        "mem_bandwidth": bw,
        "host_bandwidth": hbw,
    }
    return profile, measurements


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True)
    p.add_argument("--description", default="")
    for dim in ("hidden", "layers", "heads", "kv-heads", "head-dim", "intermediate"):
        p.add_argument(f"--{dim}", type=int, required=True)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[])
    p.add_argument("--decode-context", type=int, default=4096)
    p.add_argument("--measure-layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--copy-mib", type=int, default=256)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    shape = Shape(a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.dtype)
    profile, meas = probe(
        shape,
        a.name,
        a.device,
        a.chunks,
        a.batches,
        a.decode_context,
        a.measure_layers,
        a.repeats,
        a.copy_mib << 20,
        a.description,
    )
    out = Path(a.out)
    out.write_text(json.dumps(profile, indent=2) + "\n")
    side = out.with_name(out.name.removesuffix(".json") + ".measurements.json")
    side.write_text(json.dumps(meas, indent=2) + "\n")
    print(f"profile -> {out}; measurements -> {side}")
    print(
        f"ridge: {meas['ridge_tokens_model']} tokens (model), measured knee "
        f"{meas['ridge_tokens_measured_knee']}"
    )
    for c, tps in zip(meas["prefill"]["chunks"], meas["prefill"]["tokens_per_s"], strict=True):
        print(f"  prefill chunk {c:>6}: {tps:,.0f} tokens/s")
    for b, t in zip(meas["decode"]["batches"], meas["decode"]["seconds"], strict=True):
        print(f"  decode batch {b:>4}: {t * 1e3:.2f} ms/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
