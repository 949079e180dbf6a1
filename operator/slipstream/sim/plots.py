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
from matplotlib.patches import Rectangle  # noqa: E402

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
                          if not j.rejected and (panel == "(all)" or j.req.tenant == panel))
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
    """Who holds the budget, pass by pass (decode tokens grey): one panel per policy."""
    ids = [j.rid for j in results[0].jobs]
    colors = {rid: plt.get_cmap("tab10")(k % 10) for k, rid in enumerate(ids)}
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.6 * len(results)), squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        for rnd in result.rounds:
            width = rnd.end_s - rnd.start_s
            if rnd.decodes:
                ax.bar(rnd.start_s, rnd.decodes, width=width, align="edge", color="0.6",
                       linewidth=0)
            bottom = rnd.decodes
            for rid, take in rnd.prefill:
                ax.bar(rnd.start_s, take, width=width, bottom=bottom, align="edge",
                       color=colors.get(rid, "grey"), linewidth=0)
                bottom += take
        for job in result.jobs:
            ax.axvline(job.first_token_s, color=colors[job.rid], linestyle=":", linewidth=0.8)
        end = max(j.first_token_s for j in result.jobs)
        if end > 30:
            ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(left=min(0.0, *(j.arrival_s for j in result.jobs)))
        ax.set_ylabel("tokens / pass")
        firsts = ", ".join(f"{j.rid} {j.first_token_s:.2f}s" for j in result.jobs[:8])
        more = f" (+{len(result.jobs) - 8} more)" if len(result.jobs) > 8 else ""
        ax.set_title(f"{result.policy}: first tokens {firsts}{more}", fontsize=8)
    axes[-1][0].set_xlabel("time on the scenario's clock (s; log past 1 s on long runs)")
    handles = [Rectangle((0, 0), 1, 1, color=colors[r]) for r in ids]
    handles.append(Rectangle((0, 0), 1, 1, color="0.6"))
    fig.legend(handles, [*ids, "decode tokens"], loc="lower center", fontsize=7,
               ncol=min(len(ids) + 1, 9))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
