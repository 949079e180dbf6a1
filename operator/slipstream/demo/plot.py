"""The demo's picture: the setting the engines ran, and per-tenant p99 TTFT by size class.

A window's p99 over all requests is a giant prompt's own prefill (13-17 s on these
engines) whenever one arrived in it, capped or not, so the capped phase would look like
failure. The short requests (under ``SHORT_TOKENS``: what the users feel) are plotted as
each tenant's sliding p99, and the giants apart, one point each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from slipstream.demo import loop, phases

WINDOW_S = 60.0
"""Twin seconds of arrivals per TTFT point (a sliding p99 needs enough requests)."""

SHORT_TOKENS = 32_000
"""Prompts under this are the short size class; the giants start at 150K (phases.GIANT_TOKENS)."""


def timeline(
    samples: Sequence[loop.StatusSample],
    results: Sequence[loop.Result],
    spans: Sequence[phases.Phase],
    out: Path,
    prompt_tokens: Mapping[str, int] | None = None,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    known = [s for s in samples if s.concurrency is not None or s.threshold is not None]
    top.step([s.twin_s for s in known], [s.concurrency or 1 for s in known], where="post",
             label="prefill concurrency C // T (1 = off)")  # fmt: skip
    top.set_ylabel("concurrency")
    top.set_ylim(0.5, max([s.concurrency or 1 for s in known] + [1]) + 0.5)
    top.yaxis.get_major_locator().set_params(integer=True)
    het = [(s.twin_s, s.heterogeneity) for s in samples if s.heterogeneity is not None]
    if het:
        twin = top.twinx()
        twin.plot([t for t, _ in het], [h for _, h in het], color="tab:gray", alpha=0.6, label="heterogeneity")
        twin.set_ylabel("heterogeneity")
    top.legend(loc="lower right")
    end = spans[-1].end_s if spans else 0.0
    sizes = prompt_tokens or {}
    short = [r for r in results if sizes.get(r.rid, 0) < SHORT_TOKENS]
    tenants = sorted({r.tenant for r in results})
    for tenant in tenants:
        xs, ys = [], []
        mine = [r for r in short if r.tenant == tenant]
        t = 0.0
        while t < end:
            p99 = loop.tenant_p99(mine, t, t + WINDOW_S).get(tenant)
            if p99 is not None:
                xs.append(t + WINDOW_S / 2)
                ys.append(p99)
            t += WINDOW_S / 2
        bottom.plot(xs, ys, marker=".", label=f"{tenant} (< {SHORT_TOKENS // 1000}K tokens)")
    giants = [r for r in results if r.ok and sizes.get(r.rid, 0) >= SHORT_TOKENS]
    if giants:
        bottom.scatter([r.arrival_s for r in giants], [r.ttft_s for r in giants], marker="x", color="k",
                       label="giant prompts (each its own TTFT)")  # fmt: skip
    bottom.set_yscale("log")
    bottom.set_ylabel(f"p99 TTFT, s ({WINDOW_S:.0f} s windows)")
    bottom.set_xlabel("twin time, s")
    bottom.legend(loc="upper left")
    for ax in (top, bottom):
        for span in spans:
            ax.axvline(span.start_s, color="k", lw=0.5, ls=":")
    for span in spans:
        top.annotate(span.kind, (span.start_s + 5, 0.9), xycoords=("data", "axes fraction"), va="top", fontsize=8)
    fig.suptitle("Slipstream demo: the threshold follows the traffic")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
