"""Figures: TTFT CDFs per policy (bench) and before/after budget timelines (scenarios).

Imported only when a plot is asked for: matplotlib is slow to import and the twin's hot
paths never need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from slipstream.sim.engine import SimResult  # noqa: E402


def ttft_cdfs(results: Mapping[str, SimResult], path: Path, title: str) -> None:
    """One panel for all requests and one per tenant: TTFT CDF of every policy."""
    any_result = next(iter(results.values()))
    tenants = list(any_result.workload.tenants)
    panels = ["(all)", *tenants] if len(tenants) > 1 else ["(all)"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for name, result in results.items():
            ttft = sorted(j.first_token_s - j.arrival_s for j in result.jobs
                          if panel == "(all)" or j.req.tenant == panel)
            if not ttft:
                continue
            ys = [(k + 1) / len(ttft) for k in range(len(ttft))]
            ax.plot(ttft, ys, label=name, drawstyle="steps-post")
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(panel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timelines(results: Sequence[SimResult], path: Path, title: str) -> None:
    """Who holds the prefill budget, pass by pass: one panel per policy (before/after)."""
    ids = [j.rid for j in results[0].jobs]
    colors = {rid: plt.get_cmap("tab10")(k % 10) for k, rid in enumerate(ids)}
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.6 * len(results)), squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        for rnd in result.rounds:
            bottom = 0
            for rid, take in rnd.prefill:
                ax.bar(rnd.start_s, take, width=rnd.end_s - rnd.start_s, bottom=bottom,
                       align="edge", color=colors.get(rid, "grey"), linewidth=0)
                bottom += take
        for job in result.jobs:
            ax.axvline(job.first_token_s, color=colors[job.rid], linestyle=":", linewidth=0.8)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_ylabel("prefill tokens / pass")
        ax.set_title(f"{result.policy}: first tokens " + ", ".join(
            f"{j.rid} {j.first_token_s:.2f}s" for j in result.jobs), fontsize=8)
    axes[-1][0].set_xlabel("time on the scenario's clock (s, log past 1 s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[r]) for r in ids]
    fig.legend(handles, ids, loc="upper right", fontsize=7, ncol=min(len(ids), 8))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
