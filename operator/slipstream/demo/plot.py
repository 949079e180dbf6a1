"""The demo's picture: the setting the tuner chose and the share of prefill passes the
engines capped (top), and per-tenant p99 TTFT by size class (bottom).

The setting alone can look still: in reflex mode (the demo's default) the tuned
concurrency C // T stays at 2 while each engine caps only the passes in which a short
request waits (or did within the hold). The share of passes capped, per ``ROLLING_S``
window, is what moves: high among giants, low in the documents phases.

A window's p99 over all requests is a giant prompt's own prefill (13-17 s on these
engines) whenever one arrived in it, capped or not, so the capped phase would look like
failure. The short requests (under ``SHORT_TOKENS``: what the users feel) are plotted as
each tenant's sliding p99, and the giants apart, one point each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slipstream.demo import loop, phases

ROLLING_S = 60.0
"""Twin seconds of arrivals per TTFT point (a sliding p99 needs enough requests)."""

SHORT_TOKENS = 32_000
"""Prompts under this are the short size class; the giants start at 150K (phases.GIANT_TOKENS)."""


CAPPED_LEGEND = "share of prefill passes capped"
TITLE = ("Slipstream demo: the tuned setting and the share of prefill passes the engines capped (top), "
         "p99 TTFT per tenant (bottom)")  # fmt: skip


def capped_windows(passes: Sequence[loop.PassCount], end_s: float,
                   window_s: float = ROLLING_S) -> list[tuple[float, float | None]]:
    """(window start, share of passes capped in it, None when none ran) for the windows
    (0, w], (w, 2w], ... of sample times up to ``end_s`` (``loop.capped_share``)."""
    out = []
    t = 0.0
    while t < end_s:
        out.append((t, loop.capped_share(passes, t, t + window_s)))
        t += window_s
    return out


def timeline(
    samples: Sequence[loop.StatusSample],
    results: Sequence[loop.Result],
    spans: Sequence[phases.Phase],
    out: Path,
    prompt_tokens: Mapping[str, int] | None = None,
    passes: Sequence[loop.PassCount] = (),
) -> Path:
    """Write the picture to ``out`` (PNG); ``passes`` are the engines' pass counters."""
    import matplotlib.pyplot as plt

    fig = figure(samples, results, spans, prompt_tokens, passes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def figure(
    samples: Sequence[loop.StatusSample],
    results: Sequence[loop.Result],
    spans: Sequence[phases.Phase],
    prompt_tokens: Mapping[str, int] | None = None,
    passes: Sequence[loop.PassCount] = (),
) -> Any:
    """The picture as a matplotlib Figure (Agg): ``timeline`` without the file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    end = spans[-1].end_s if spans else 0.0
    _top(top, samples, capped_windows(passes, end) if passes else [])
    _bottom(bottom, results, end, prompt_tokens or {})
    for ax in (top, bottom):
        for span in spans:
            ax.axvline(span.start_s, color="k", lw=0.5, ls=":")
    for span in spans:
        top.annotate(span.kind, (span.start_s + 5, 0.9), xycoords=("data", "axes fraction"), va="top", fontsize=8)
    fig.suptitle(TITLE, fontsize=10)
    fig.tight_layout()
    return fig


def _top(top: Any, samples: Sequence[loop.StatusSample], capped: Sequence[tuple[float, float | None]]) -> None:
    """Tuned concurrency (left axis); heterogeneity and the share of passes capped (right)."""
    known = [s for s in samples if s.concurrency is not None or s.threshold is not None]
    top.step([s.twin_s for s in known], [s.concurrency or 1 for s in known], where="post",
             label="tuned concurrency C // T (1 = off)")  # fmt: skip
    top.set_ylabel("concurrency")
    top.set_ylim(0.5, max([s.concurrency or 1 for s in known] + [1]) + 0.5)
    top.yaxis.get_major_locator().set_params(integer=True)
    het = [(s.twin_s, s.heterogeneity) for s in samples if s.heterogeneity is not None]
    lines, labels = top.get_legend_handles_labels()
    if het or capped:
        right = top.twinx()
        if het:
            right.plot([t for t, _ in het], [h for _, h in het], color="tab:gray", alpha=0.6, label="heterogeneity")
        if capped:
            # One step per window, NaN (a gap) where no pass ran; the last window drawn to its end.
            xs = [t for t, _ in capped] + [capped[-1][0] + ROLLING_S]
            ys = [math.nan if v is None else v for _, v in capped]
            right.step(xs, [*ys, ys[-1]], where="post", color="tab:red",
                       label=f"{CAPPED_LEGEND} ({ROLLING_S:.0f} s windows)")  # fmt: skip
        right.set_ylim(0, 1.05)
        right.set_ylabel("share (0-1)")
        more, names = right.get_legend_handles_labels()
        lines, labels = lines + more, labels + names
    # Above the panel, so it covers none of the lines (the share runs along 0 and 1).
    top.legend(lines, labels, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, fontsize=8, frameon=False)


def _bottom(bottom: Any, results: Sequence[loop.Result], end: float, sizes: Mapping[str, int]) -> None:
    """Each tenant's sliding p99 TTFT of its short requests, and the giants one by one."""
    short = [r for r in results if sizes.get(r.rid, 0) < SHORT_TOKENS]
    tenants = sorted({r.tenant for r in results})
    for tenant in tenants:
        xs, ys = [], []
        mine = [r for r in short if r.tenant == tenant]
        t = 0.0
        while t < end:
            p99 = loop.tenant_p99(mine, t, t + ROLLING_S).get(tenant)
            if p99 is not None:
                xs.append(t + ROLLING_S / 2)
                ys.append(p99)
            t += ROLLING_S / 2
        bottom.plot(xs, ys, marker=".", label=f"{tenant} (< {SHORT_TOKENS // 1000}K tokens)")
    giants = [r for r in results if r.ok and sizes.get(r.rid, 0) >= SHORT_TOKENS]
    if giants:
        bottom.scatter([r.arrival_s for r in giants], [r.ttft_s for r in giants], marker="x", color="k",
                       label="giant prompts (each its own TTFT)")  # fmt: skip
    bottom.set_yscale("log")
    bottom.set_ylabel(f"p99 TTFT, s ({ROLLING_S:.0f} s windows)")
    bottom.set_xlabel("twin time, s")
    bottom.legend(loc="upper left")
