"""Calibration probe: measure what the twin charges for a model shape on this device.

    python3 engine_image/calibrate/probe.py --model llama3-8b --out llama3-8b-h200.json
    python3 engine_image/calibrate/probe.py --model qwen3-30b-a3b --out qwen3-30b-a3b-h200.json
    python3 engine_image/calibrate/probe.py --refit qwen3-30b-a3b-h200.measurements.json

It runs decoder layers of the shape with dummy (random) weights, torch only (no model
download, no sglang), and measures the three kinds of pass the twin
(``slipstream.sim.cost.CostModel.pass_time``) charges:

- prefill: one request's chunk of L tokens after s cached tokens, attention over the
  cached prefix and causally within the chunk (SDPA with a lower-right causal bias), over
  the grid (L in ``--chunks``) x (s in ``--cached``); one logits row (lm_head);
- decode: B requests at context c each, one token each, over (B in ``--batches``) x
  (c in ``--contexts``); captured in a CUDA graph and replayed on CUDA (SGLang's decode
  path), eager elsewhere; B logits rows;
- mixed: a chunk of L tokens (no cache) and B decodes at context c in one eager forward
  (SGLang runs mixed batches as extend batches, without a graph), for ``--mixed L:B:c``;
- memory bandwidth (a large device copy) and, on CUDA, host-to-device bandwidth.

MoE shapes (``--experts E --active-experts K``, intermediate = the per-expert size) run a
router and K of E experts per token as one batched matmul over the experts a pass
touches (min(E, tokens x K), tokens spread evenly: a balanced router), so a small decode
batch reads only the experts it uses, as fused MoE kernels do. The profile then carries
the twin's touched-experts fields (``routed_expert_bytes``: gate, up and down of every
expert of every layer, from the shape; ``routed_experts`` E; ``experts_per_token`` K), so
the twin charges a pass of B tokens ``1 - (1 - K/E)**B`` of the experts' bytes (uniform
routing: slightly fewer experts than the probe's balanced router runs at B*K < E).

From the points it fits the profile fields: ``peak_flops`` and ``attn_flops_per_s`` (and
``overhead_s``) by least squares over the compute-bound prefill points (t = overhead +
L * linear_s + pairs(L, s) * attn_s, pairs = L*s + L(L+1)/2), ``mem_bandwidth`` from the
copy, and the decode and mixed overheads as the median of each point's time less the
twin's own charge for it without overhead (touched experts included). FLOPs per token,
attention FLOPs per pair, weight, routed-expert and KV bytes come from the shape. Then it
predicts every measured point with the twin's own cost model and writes measured
against predicted. Outputs: the profile (``--out``), the raw points and fits
(``<out>.measurements.json``), the comparison (``<out>.comparison.json``, also printed). The measurements file also says how it was
run (``run``: grid, layers, copy size, torch, HBM), so ``--refit MEASUREMENTS.json`` redoes
the fits and the comparison from the file alone, on any machine with torch and no GPU
(a change of the fits or of the twin's format needs no new measurement).

Only ``--measure-layers`` layers run (default 2) and their time is scaled to ``--layers``
(layers are identical); the lm_head is timed once, unscaled. What the probe cannot see:
SGLang's scheduler and sampling time between passes, and its attention kernels
(FlashInfer/FA3, faster than SDPA's at long context): the fitted overheads are those of
the forward alone, and the comparison measures the twin against this probe, not against
a serving engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

REPO = Path(__file__).resolve().parents[2]
try:  # the twin's own cost model and profile format (operator/ beside this folder)
    from slipstream.sim import cost as twin_cost
    from slipstream.sim import profiles as twin_profiles
except ImportError:  # pragma: no cover - run from a checkout without the package installed
    sys.path.insert(0, str(REPO / "operator"))
    from slipstream.sim import cost as twin_cost
    from slipstream.sim import profiles as twin_profiles

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Shape:
    """A decoder-only model's shape; ``experts`` > 0 makes every layer's MLP a MoE."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    """Dense MLP width, or each expert's width (``moe_intermediate_size``) for MoE."""
    dtype: str = "bfloat16"
    experts: int = 0
    active_experts: int = 0
    vocab: int = 0
    """lm_head rows; 0 = no lm_head."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}")
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.heads % self.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        if self.experts < 0 or self.vocab < 0:
            raise ValueError("experts and vocab must be >= 0")
        if self.experts and not 0 < self.active_experts <= self.experts:
            raise ValueError("active_experts must be in 1..experts for a MoE shape")
        if not self.experts and self.active_experts:
            raise ValueError("active_experts needs experts")

    @property
    def dtype_bytes(self) -> int:
        return torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    @property
    def attn_params_per_layer(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        return qkv + self.heads * self.head_dim * self.hidden

    @property
    def params_per_layer(self) -> int:
        """Weights stored per layer (every expert)."""
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        if self.experts:
            return self.attn_params_per_layer + self.experts * mlp + self.experts * self.hidden
        return self.attn_params_per_layer + mlp

    @property
    def active_params_per_layer(self) -> int:
        """Weights one token multiplies through per layer (its K experts and the router)."""
        mlp = 3 * self.hidden * self.intermediate
        if self.experts:
            return (
                self.attn_params_per_layer + self.active_experts * mlp + self.experts * self.hidden
            )
        return self.attn_params_per_layer + mlp

    @property
    def flops_per_token(self) -> float:
        """2 x active parameters of the layers (the lm_head runs on a few rows only)."""
        return 2.0 * self.active_params_per_layer * self.layers

    @property
    def attn_flops_per_pair(self) -> float:
        # q.k and p.v: 2 x 2 FLOPs per head dimension, per layer and query head
        return 4.0 * self.layers * self.heads * self.head_dim

    @property
    def weight_bytes(self) -> float:
        """Layers and lm_head: what a pass that touches every expert reads."""
        return float(
            (self.params_per_layer * self.layers + self.vocab * self.hidden) * self.dtype_bytes
        )

    @property
    def kv_bytes_per_token(self) -> float:
        return float(self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes)

    @property
    def routed_expert_bytes(self) -> float:
        """Bytes of the routed experts (gate, up and down of each, every layer): the part of
        ``weight_bytes`` a pass reads only as far as its tokens route to it (the twin's
        touched-experts term). The router, attention and lm_head are read by every pass."""
        return float(
            self.experts * 3 * self.hidden * self.intermediate * self.layers * self.dtype_bytes
        )


MODELS: dict[str, tuple[Shape, str]] = {
    "llama3-8b": (
        Shape(
            hidden=4096,
            layers=32,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate=14336,
            vocab=128256,
        ),
        "meta-llama/Meta-Llama-3-8B config.json: hidden_size 4096, num_hidden_layers 32, "
        "num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, vocab_size 128256",
    ),
    "qwen3-30b-a3b": (
        Shape(
            hidden=2048,
            layers=48,
            heads=32,
            kv_heads=4,
            head_dim=128,
            intermediate=768,
            experts=128,
            active_experts=8,
            vocab=151936,
        ),
        "Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, num_hidden_layers 48, "
        "num_attention_heads 32, num_key_value_heads 4, head_dim 128, moe_intermediate_size 768, "
        "num_experts 128, num_experts_per_tok 8, vocab_size 151936",
    ),
}


class Layer(torch.nn.Module):
    """One pre-norm decoder layer (GQA attention, gated MLP or MoE) with random weights."""

    def __init__(self, s: Shape, device: str) -> None:
        super().__init__()
        dt = DTYPES[s.dtype]
        self.s = s
        std = s.hidden**-0.5

        def w(*dims: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(
                torch.randn(*dims, dtype=dt, device=device) * std, requires_grad=False
            )

        self.qkv = w((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden)
        self.o = w(s.hidden, s.heads * s.head_dim)
        if s.experts:
            self.router = w(s.experts, s.hidden)
            self.gate_up = w(s.experts, s.hidden, 2 * s.intermediate)
            self.down = w(s.experts, s.intermediate, s.hidden)
        else:
            self.gate_up = w(2 * s.intermediate, s.hidden)
            self.down = w(s.hidden, s.intermediate)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        s = self.s
        if not s.experts:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
            return F.linear(F.silu(gate) * up, self.down)
        n = x.shape[0]
        F.linear(x, self.router).softmax(-1)  # the router's cost; routing is balanced below
        routed = n * s.active_experts
        touched = min(s.experts, routed)
        cap = -(-routed // touched)
        rows = torch.arange(touched * cap, device=x.device) % n
        h = torch.bmm(x[rows].view(touched, cap, s.hidden), self.gate_up[:touched])
        gate, up = h.chunk(2, dim=-1)
        h = torch.bmm(F.silu(gate) * up, self.down[:touched])
        return torch.zeros_like(x).index_add_(0, rows, h.reshape(-1, s.hidden))

    def forward(
        self,
        x: torch.Tensor,
        prefill_len: int,
        kv_buf: tuple[torch.Tensor, torch.Tensor] | None,
        dec_cache: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """x: (prefill_len + B, hidden): one request's chunk first, then B decode tokens.

        ``kv_buf``: the chunk's K, V buffers (kv_heads, s + prefill_len, head_dim) holding its
        s cached tokens; the chunk writes its own K, V after them (as into a KV pool, no
        copy of the prefix) and attends to the whole buffer. ``dec_cache``: the decodes'
        K, V (B, kv_heads, c, head_dim).
        """
        s = self.s
        q, k, v = F.linear(F.rms_norm(x, (s.hidden,)), self.qkv).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
        )
        outs = []
        n = prefill_len
        if n:
            qp = q[:n].view(n, s.heads, s.head_dim).transpose(0, 1)
            kp = k[:n].view(n, s.kv_heads, s.head_dim).transpose(0, 1)
            vp = v[:n].view(n, s.kv_heads, s.head_dim).transpose(0, 1)
            if kv_buf is not None:
                kv_buf[0][:, -n:] = kp
                kv_buf[1][:, -n:] = vp
                kp, vp = kv_buf
            mask = causal_lower_right(n, kp.shape[1])
            a = F.scaled_dot_product_attention(
                qp.unsqueeze(0), kp.unsqueeze(0), vp.unsqueeze(0), attn_mask=mask, enable_gqa=True
            )
            outs.append(a.squeeze(0).transpose(0, 1).reshape(n, -1))
        b = x.shape[0] - n
        if b:
            assert dec_cache is not None
            qd = q[n:].view(b, s.heads, 1, s.head_dim)
            a = F.scaled_dot_product_attention(qd, dec_cache[0], dec_cache[1], enable_gqa=True)
            outs.append(a.reshape(b, -1))
        x = x + F.linear(torch.cat(outs) if len(outs) > 1 else outs[0], self.o)
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


def graphed(fn: Callable[[], Any], device: str) -> Callable[[], Any]:
    """``fn`` captured in a CUDA graph (replay), as SGLang runs decode; as is elsewhere."""
    if not device.startswith("cuda"):
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


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


def pairs(length: int, cached: int = 0) -> int:
    """Attention pairs of a chunk after ``cached`` tokens (the twin's ``chunk_pairs``)."""
    return twin_cost.chunk_pairs(cached, length)


def fit_prefill(
    points: Sequence[tuple[int, int, float]], weights_s: float = 0.0, kv_s: float = 0.0
) -> dict[str, Any]:
    """``t = overhead + L * linear_s + pairs(L, s) * attn_s`` over (L, s, t), coefficients
    >= 0, on the compute-bound points: a point whose fitted compute is under its memory
    floor (weights + s tokens of KV read) is dropped and the rest refitted (at most 3
    rounds; never under 3 points)."""
    use = list(points)
    coef = [0.0, 0.0, 0.0]
    for _ in range(3):
        coef = lstsq_nonneg(
            [[1.0] * len(use), [float(p[0]) for p in use], [float(pairs(p[0], p[1])) for p in use]],
            [p[2] for p in use],
        )
        keep = [
            p
            for p in points
            if p[0] * coef[1] + pairs(p[0], p[1]) * coef[2] >= weights_s + p[1] * kv_s
        ]
        if len(keep) < 3 or keep == use:
            break
        use = keep
    return {
        "overhead_s": coef[0],
        "linear_s_per_token": coef[1],
        "attn_s_per_pair": coef[2],
        "points_used": len(use),
    }


def fit_decode(batches: Sequence[int], seconds: Sequence[float]) -> dict[str, float]:
    """``t = t0 + B * per_request_s``, coefficients >= 0 (a summary of the decode curve)."""
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


@dataclass(frozen=True)
class Grid:
    """The points to measure."""

    chunks: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    cached: tuple[int, ...] = (0, 4096, 16384, 65536)
    batches: tuple[int, ...] = (1, 8, 32, 128)
    contexts: tuple[int, ...] = (1024, 8192, 32768)
    mixed: tuple[tuple[int, int, int], ...] = ((2048, 32, 4096), (4096, 64, 8192))
    """(chunk L, decodes B, their context c)."""
    max_cache_bytes: float = 16 * 2**30
    """Decode points whose KV cache (one layer's, shared by the measured layers) would
    exceed this are skipped."""


class Runner:
    """The measured layers and the lm_head on one device."""

    def __init__(self, shape: Shape, device: str, measure_layers: int) -> None:
        self.shape = shape
        self.device = device
        self.dt = DTYPES[shape.dtype]
        n = max(1, min(measure_layers, shape.layers))
        self.scale = shape.layers / n
        self.layers = [Layer(shape, device) for _ in range(n)]
        self.lm_head = (
            torch.randn(shape.vocab, shape.hidden, dtype=self.dt, device=device)
            * shape.hidden**-0.5
            if shape.vocab
            else None
        )

    def _kv(self, *dims: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.randn(*dims, dtype=self.dt, device=self.device)
        return k, torch.randn_like(k)

    def _logits_s(self, rows: int, repeats: int) -> float:
        if self.lm_head is None or not rows:
            return 0.0
        x = torch.randn(rows, self.shape.hidden, dtype=self.dt, device=self.device)
        head = self.lm_head
        return timed(lambda: F.linear(x, head), self.device, repeats)

    def pass_s(
        self, chunk: int, cached: int, batch: int, context: int, repeats: int, graph: bool = False
    ) -> float:
        """Seconds of one pass: a chunk after ``cached`` tokens and ``batch`` decodes at
        ``context``, the measured layers scaled to all of them, plus the logits rows."""
        s = self.shape
        x = torch.randn(chunk + batch, s.hidden, dtype=self.dt, device=self.device)
        prefix = self._kv(s.kv_heads, cached + chunk, s.head_dim) if chunk else None
        dec = self._kv(batch, s.kv_heads, context, s.head_dim) if batch else None
        layers = self.layers

        def run() -> None:
            h = x
            for layer in layers:
                h = layer(h, chunk, prefix, dec)

        fn = graphed(run, self.device) if graph else run
        body = timed(fn, self.device, repeats) * self.scale
        return body + self._logits_s((1 if chunk else 0) + batch, repeats)


def _twin_profile(data: dict[str, Any]) -> twin_profiles.Profile:
    """The profile as the twin loads it: only the fields this twin's format knows."""
    known = {f.name for f in fields(twin_profiles.Profile)}
    return twin_profiles.from_dict({k: v for k, v in data.items() if k in known}, "probe")


def moe_fields(shape: Shape) -> dict[str, float]:
    """The routed-expert fields of the twin's touched-experts term (none for a dense shape).

    Without them the twin charges every expert's bytes on every pass: the H200 run of
    2026-12-04 wrote none (the writer predates the fields), so its MoE profile charged a
    batch-1 decode 3.7x what the probe measured."""
    if not shape.experts:
        return {}
    return {
        "routed_expert_bytes": shape.routed_expert_bytes,
        "routed_experts": float(shape.experts),
        "experts_per_token": float(shape.active_experts),
    }


def predict(
    model: twin_cost.CostModel, kind: str, tokens: int, n_pairs: int, kv_read: int
) -> float:
    """The twin's charge for a pass (with the kind's overhead where the twin has kinds)."""
    kinds = {"prefill": "PREFILL", "decode": "DECODE", "mixed": "MIXED"}
    kind_id = getattr(twin_cost, kinds[kind], None)
    if kind_id is None:  # a twin with one overhead for every pass
        return model.pass_time(tokens, n_pairs, kv_read)
    return model.pass_time(tokens, n_pairs, kv_read, 0, kind_id)


def _median_residual(rows: Sequence[dict[str, Any]], profile: twin_profiles.Profile) -> float:
    """Median of measured time less the twin's charge without overhead (>= 0).

    The charge is the twin's own ``pass_time`` with every overhead 0, so the residual is
    what the roofline leaves unexplained, touched experts included: a hand-written roofline
    that read every expert made the decode overhead of the MoE run come out 0."""
    zero = {
        k: 0.0
        for k in ("overhead_s", "decode_overhead_s", "mixed_overhead_s")
        if hasattr(profile, k)
    }
    bare = twin_cost.CostModel(replace(profile, **zero))
    residuals = [
        r["measured_s"] - predict(bare, r["kind"], r["tokens"], r["pairs"], r["kv_read"])
        for r in rows
    ]
    return max(0.0, statistics.median(residuals)) if residuals else 0.0


def measure(
    shape: Shape,
    device: str = "cpu",
    grid: Grid | None = None,
    measure_layers: int = 2,
    repeats: int = 5,
    copy_bytes: int = 1 << 28,
) -> dict[str, Any]:
    """Time every point of the grid and the bandwidths: the raw measurements, in the
    format of ``<out>.measurements.json`` (before the fits), with what ``fit`` needs to
    redo the fits from the file alone (``run``)."""
    torch.manual_seed(0)
    g = grid or Grid()
    runner = Runner(shape, device, measure_layers)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    layer_kv = 2 * shape.kv_heads * shape.head_dim * shape.dtype_bytes
    with torch.inference_mode():
        for chunk in sorted(g.chunks):
            for cached in sorted(g.cached):
                t = runner.pass_s(chunk, cached, 0, 0, repeats)
                rows.append(
                    {
                        "kind": "prefill",
                        "chunk": chunk,
                        "cached": cached,
                        "tokens": chunk,
                        "pairs": pairs(chunk, cached),
                        "kv_read": cached,
                        "measured_s": t,
                    }
                )
        for batch in sorted(g.batches):
            for context in sorted(g.contexts):
                if batch * context * layer_kv > g.max_cache_bytes:
                    skipped.append(
                        f"decode B={batch} c={context}: KV over {g.max_cache_bytes / 2**30:.0f} GiB"
                    )
                    continue
                t = runner.pass_s(0, 0, batch, context, repeats, graph=True)
                rows.append(
                    {
                        "kind": "decode",
                        "batch": batch,
                        "context": context,
                        "tokens": batch,
                        "pairs": batch * context,
                        "kv_read": batch * context,
                        "measured_s": t,
                    }
                )
        for chunk, batch, context in g.mixed:
            t = runner.pass_s(chunk, 0, batch, context, repeats)
            rows.append(
                {
                    "kind": "mixed",
                    "chunk": chunk,
                    "batch": batch,
                    "context": context,
                    "tokens": chunk + batch,
                    "pairs": pairs(chunk) + batch * context,
                    "kv_read": batch * context,
                    "measured_s": t,
                }
            )
    cuda = device.startswith("cuda")
    run = {
        "device_kind": "cuda" if cuda else device,
        "torch": torch.__version__,
        "measure_layers": len(runner.layers),
        "repeats": repeats,
        "copy_bytes": copy_bytes,
        "grid": asdict(g),
        "hbm_bytes": float(torch.cuda.get_device_properties(device).total_memory) if cuda else 0.0,
    }
    return {
        "shape": asdict(shape),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "date": time.strftime("%Y-%m-%d"),
        "skipped": skipped,
        "points": rows,
        "mem_bandwidth": copy_bandwidth(device, copy_bytes, repeats),
        "host_bandwidth": host_bandwidth(device, copy_bytes, repeats),
        "run": run,
    }


def _prefill_rates(
    shape: Shape, prefill: Sequence[dict[str, Any]], bw: float
) -> tuple[dict, float, float]:
    """The prefill fit, and the linear and attention rates (FLOP/s) it gives."""
    pf = fit_prefill(
        [(r["chunk"], r["cached"], r["measured_s"]) for r in prefill],
        shape.weight_bytes / bw,
        shape.kv_bytes_per_token / bw,
    )
    linear_s = pf["linear_s_per_token"]
    if linear_s <= 0:  # the chunk range never left the fixed-cost regime
        top = max(prefill, key=lambda r: r["chunk"])
        linear_s = max(top["measured_s"] - pf["overhead_s"], 1e-12) / top["chunk"]
    peak = shape.flops_per_token / linear_s
    attn_rate = (
        shape.attn_flops_per_pair / pf["attn_s_per_pair"] if pf["attn_s_per_pair"] > 0 else peak
    )
    return pf, peak, attn_rate


def _where(raw: dict[str, Any]) -> str:
    """Where and when the points were measured (the profile's sources start with it)."""
    return (
        f"engine_image/calibrate/probe.py on {raw['device']}, {raw['date']}, "
        f"torch {raw['run']['torch']}"
    )


def _source(shape: Shape, raw: dict[str, Any], refitted: str) -> str:
    """The profile's ``source``: the run, its grid, and the refit when there was one."""
    run, g = raw["run"], raw["run"]["grid"]
    graphs = " (CUDA graphs)" if run["device_kind"].startswith("cuda") else " (eager)"
    grid_words = (
        f"prefill chunks {sorted(g['chunks'])} x cached {sorted(g['cached'])}; decode "
        f"batches {sorted(g['batches'])} x contexts {sorted(g['contexts'])}{graphs}; "
        f"mixed {[list(m) for m in g['mixed']]}"
    )
    text = (
        f"{_where(raw)}; {grid_words}; {run['measure_layers']} of {shape.layers} layers run, "
        f"times scaled; lm_head timed once; bandwidth from a {run['copy_bytes'] >> 20} MiB "
        f"device copy; FLOPs, weight{', routed-expert' if shape.experts else ''} and KV bytes "
        f"from the shape "
        f"({run.get('shape_source') or 'given on the command line'})."
    )
    if refitted:
        text += (
            f" Fitted again on {refitted} from the stored measurements "
            f"(probe.py --refit, torch {torch.__version__}, no GPU)."
        )
    return text


def _profile_data(
    shape: Shape, raw: dict[str, Any], rates: tuple[dict, float, float], refitted: str
) -> dict[str, Any]:
    """Every profile field the probe fits (``rates``: ``_prefill_rates``) or takes from the
    shape, with its source."""
    rows, bw, run = raw["points"], raw["mem_bandwidth"], raw["run"]
    pf, peak, attn_rate = rates
    where = _where(raw)
    data: dict[str, Any] = {
        "name": run["name"],
        "description": run.get("description")
        or (
            f"Measured by {where}: hidden {shape.hidden}, {shape.layers} layers, {shape.heads} heads "
            f"({shape.kv_heads} KV), head_dim {shape.head_dim}, intermediate {shape.intermediate}"
            + (
                f", {shape.experts} experts ({shape.active_experts} active)"
                if shape.experts
                else ""
            )
            + f", vocab {shape.vocab}, {shape.dtype}; dummy weights."
        ),
        "source": _source(shape, raw, refitted),
        "flops_per_token": float(shape.flops_per_token),
        "attn_flops_per_pair": float(shape.attn_flops_per_pair),
        "peak_flops": float(peak),
        "attn_flops_per_s": float(attn_rate),
        "weight_bytes": float(shape.weight_bytes),
        **moe_fields(shape),
        "kv_bytes_per_token": float(shape.kv_bytes_per_token),
        "mem_bandwidth": float(bw),
        "overhead_s": float(pf["overhead_s"]),
        "host_bandwidth": float(raw["host_bandwidth"]),
        "overhead_source": (
            f"{where}: intercept of the least-squares fit over "
            f"{pf['points_used']} compute-bound prefill points"
        ),
    }
    base = _twin_profile(data)
    for kind in ("decode", "mixed"):
        kind_rows = [r for r in rows if r["kind"] == kind]
        data[f"{kind}_overhead_s"] = float(_median_residual(kind_rows, base))
        notes = ["touched experts only" if shape.experts else ""]
        if kind == "decode" and run["device_kind"].startswith("cuda"):
            notes.append("CUDA-graph replay")
        said = "; ".join(n for n in notes if n)
        data[f"{kind}_overhead_source"] = (
            f"{where}: median over {len(kind_rows)} {kind} points of the measured time less the "
            f"twin's roofline" + (f" ({said})" if said else "")
        )
    if run.get("hbm_bytes"):
        data["hbm_bytes"] = float(run["hbm_bytes"])
        data["memory_source"] = f"{where}: torch.cuda.get_device_properties().total_memory"
    return data


def fit(shape: Shape, raw: dict[str, Any], refitted: str = "") -> tuple[dict, dict, dict]:
    """Fit the profile to raw measurements (``measure``'s, or a stored measurements file's)
    and predict every point with the twin; returns (profile dict, measurements, comparison).
    ``refitted``: the date of a refit, said in the profile's source and the comparison."""
    rows = [
        {k: v for k, v in r.items() if k not in ("predicted_s", "error_pct")} for r in raw["points"]
    ]
    raw = {**raw, "points": rows}
    rates = _prefill_rates(shape, [r for r in rows if r["kind"] == "prefill"], raw["mem_bandwidth"])
    data = _profile_data(shape, raw, rates, refitted)
    profile = _twin_profile(data)
    written = {k: v for k, v in data.items() if k in {f.name for f in fields(profile)}}
    model = twin_cost.CostModel(profile)
    for r in rows:
        r["predicted_s"] = predict(model, r["kind"], r["tokens"], r["pairs"], r["kv_read"])
        r["error_pct"] = 100.0 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
    comparison = {
        "profile": data["name"],
        "device": raw["device"],
        "date": raw["date"],
        **({"refitted": refitted} if refitted else {}),
        "twin_fields_not_known": sorted(set(data) - set(written)),
        "max_abs_error_pct": {
            kind: max((abs(r["error_pct"]) for r in rows if r["kind"] == kind), default=None)
            for kind in ("prefill", "decode", "mixed")
        },
        "within_10pct": all(abs(r["error_pct"]) <= 10.0 for r in rows),
        "points": rows,
    }
    return written, _measurements(shape, raw, rates[0], model), comparison


def _measurements(
    shape: Shape, raw: dict[str, Any], prefill_fit: dict[str, Any], model: twin_cost.CostModel
) -> dict[str, Any]:
    """The raw measurements with the fits' summaries (the ``.measurements.json`` file)."""
    rows, g = raw["points"], raw["run"]["grid"]
    prefill = [r for r in rows if r["kind"] == "prefill"]
    chunks = sorted(g["chunks"])
    first_cached = [
        next(
            r["measured_s"] for r in prefill if r["chunk"] == c and r["cached"] == min(g["cached"])
        )
        for c in chunks
    ]
    decode_rows = [r for r in rows if r["kind"] == "decode"]
    return {
        "shape": asdict(shape),
        "device": raw["device"],
        "date": raw["date"],
        "skipped": raw["skipped"],
        "points": rows,
        "prefill_fit": prefill_fit,
        "decode_fit": fit_decode(
            [r["batch"] for r in decode_rows], [r["measured_s"] for r in decode_rows]
        )
        if decode_rows
        else None,
        "ridge_tokens_model": model.ridge_tokens(),
        "ridge_tokens_measured_knee": measured_knee(chunks, first_cached),
        "mem_bandwidth": raw["mem_bandwidth"],
        "host_bandwidth": raw["host_bandwidth"],
        "run": raw["run"],
    }


def probe(
    shape: Shape,
    name: str,
    device: str = "cpu",
    grid: Grid | None = None,
    measure_layers: int = 2,
    repeats: int = 5,
    copy_bytes: int = 1 << 28,
    description: str = "",
    shape_source: str = "",
) -> tuple[dict, dict, dict]:
    """Measure, fit and compare; returns (profile dict, measurements, comparison)."""
    raw = measure(shape, device, grid, measure_layers, repeats, copy_bytes)
    raw["run"].update(name=name, description=description, shape_source=shape_source)
    return fit(shape, raw)


RUN_KEYS = ("name", "device_kind", "torch", "measure_layers", "copy_bytes", "grid")
"""What a measurements file's ``run`` must say for a refit (``description``,
``shape_source``, ``repeats`` and ``hbm_bytes`` may be absent)."""


def refit(meas: dict[str, Any], origin: str = "<measurements>") -> tuple[dict, dict, dict]:
    """Fit the profile again from a stored measurements file, no device needed: the
    points, bandwidths and the run's settings (``run``) are all in the file. For a change
    of the fits or the twin's format (the routed-expert fields, 2026-12-07) without
    measuring again."""
    missing = [k for k in RUN_KEYS if k not in meas.get("run", {})]
    if missing:
        raise ValueError(
            f"{origin}: its 'run' lacks {missing} (measurements written before "
            f"2026-12-07 do not say how they were run; add them from the profile "
            f"of the same run)"
        )
    return fit(Shape(**meas["shape"]), meas, refitted=time.strftime("%Y-%m-%d"))


def comparison_table(comparison: dict[str, Any]) -> str:
    """Measured against predicted, one line per point."""
    lines = [f"{'pass':8s} {'point':28s} {'measured ms':>12s} {'twin ms':>10s} {'error':>8s}"]
    for r in comparison["points"]:
        if r["kind"] == "prefill":
            point = f"L={r['chunk']} cached={r['cached']}"
        elif r["kind"] == "decode":
            point = f"B={r['batch']} ctx={r['context']}"
        else:
            point = f"L={r['chunk']} + B={r['batch']} ctx={r['context']}"
        lines.append(
            f"{r['kind']:8s} {point:28s} {r['measured_s'] * 1e3:12.3f} "
            f"{r['predicted_s'] * 1e3:10.3f} {r['error_pct']:+7.1f}%"
        )
    worst = ", ".join(
        f"{k} {v:.1f}%" for k, v in comparison["max_abs_error_pct"].items() if v is not None
    )
    lines.append(f"max |error|: {worst}; within 10% everywhere: {comparison['within_10pct']}")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _triples(text: str) -> tuple[tuple[int, int, int], ...]:
    out = []
    for item in text.split(","):
        if item:
            parts = tuple(int(x) for x in item.split(":"))
            if len(parts) != 3:
                raise argparse.ArgumentTypeError(f"--mixed takes L:B:c items, got {item!r}")
            out.append(parts)
    return tuple(out)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", help="profile name (default: the model, or 'probe')")
    p.add_argument("--description", default="")
    p.add_argument("--model", choices=sorted(MODELS), help="a real model's shape (dummy weights)")
    for dim in (
        "hidden",
        "layers",
        "heads",
        "kv-heads",
        "head-dim",
        "intermediate",
        "experts",
        "active-experts",
        "vocab",
    ):
        p.add_argument(f"--{dim}", type=int, help="override or give the shape's " + dim)
    p.add_argument("--dtype", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    d = Grid()
    p.add_argument("--chunks", type=_ints, default=d.chunks, help="prefill chunk sizes L")
    p.add_argument(
        "--cached", type=_ints, default=d.cached, help="cached context s before the chunk"
    )
    p.add_argument("--batches", type=_ints, default=d.batches, help="decode batch sizes B")
    p.add_argument("--contexts", type=_ints, default=d.contexts, help="decode contexts c")
    p.add_argument("--mixed", type=_triples, default=d.mixed, help="mixed passes L:B:c,...")
    p.add_argument("--max-cache-gib", type=float, default=d.max_cache_bytes / 2**30)
    p.add_argument("--measure-layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--copy-mib", type=int, default=256)
    p.add_argument(
        "--out",
        help="the profile to write (its measurements and comparison beside "
        "it); with --refit, default: beside the measurements",
    )
    p.add_argument(
        "--refit",
        metavar="MEASUREMENTS.json",
        help="fit again from a stored measurements file (no device; the shape and "
        "grid are the file's)",
    )
    a = p.parse_args(argv)
    if a.refit:
        meas_path = Path(a.refit)
        profile, meas, comp = refit(json.loads(meas_path.read_text()), str(meas_path))
        stem = meas_path.name.removesuffix(".json").removesuffix(".measurements")
        return write_outputs(
            Path(a.out) if a.out else meas_path.with_name(stem + ".json"), profile, meas, comp
        )
    if not a.out:
        p.error("--out is required (except with --refit)")
    dims = {
        f.name: getattr(a, f.name) for f in fields(Shape) if getattr(a, f.name, None) is not None
    }
    if a.model:
        base, shape_source = MODELS[a.model]
        shape = replace(base, **dims)
    else:
        missing = [
            k
            for k in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate")
            if k not in dims
        ]
        if missing:
            p.error(f"give --model or every shape dimension (missing: {', '.join(missing)})")
        shape, shape_source = Shape(**dims), ""
    grid = Grid(a.chunks, a.cached, a.batches, a.contexts, a.mixed, a.max_cache_gib * 2**30)
    name = a.name or a.model or "probe"
    profile, meas, comp = probe(
        shape,
        name,
        a.device,
        grid,
        a.measure_layers,
        a.repeats,
        a.copy_mib << 20,
        a.description,
        shape_source,
    )
    return write_outputs(Path(a.out), profile, meas, comp)


def write_outputs(out: Path, profile: dict, meas: dict, comp: dict) -> int:
    """Write the profile, its measurements and comparison beside it; print the table."""
    stem = out.name.removesuffix(".json")
    out.write_text(json.dumps(profile, indent=2) + "\n")
    side = out.with_name(stem + ".measurements.json")
    side.write_text(json.dumps(meas, indent=2) + "\n")
    comp_path = out.with_name(stem + ".comparison.json")
    comp_path.write_text(json.dumps(comp, indent=2) + "\n")
    print(f"profile -> {out}; measurements -> {side}; comparison -> {comp_path}")
    for line in meas["skipped"]:
        print(f"skipped: {line}")
    print(
        f"ridge: {meas['ridge_tokens_model']} tokens (model), measured knee "
        f"{meas['ridge_tokens_measured_knee']}"
    )
    print(comparison_table(comp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
