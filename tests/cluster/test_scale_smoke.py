"""The scale benchmark's harness at 20 ServingDeployments (scripts/bench-scale.py runs it at
500): its structural claims, which can fail, and no timings.

- every ServingDeployment is reconciled (observedGeneration == generation) and every tuning
  loop gets valid metrics from the real Prometheus (the run raises otherwise);
- the Prometheus queries in the measured window are those of the fleet's reads (one query
  per metric family for all deployments; reads at least ``FleetObserver.reuse_s`` apart, so
  a window of W seconds holds at most ``W // reuse_s + 1`` of them, wherever the loops'
  phases fall), not one per deployment: at 20 deployments a per-deployment query would
  be at least 20 per read;
- the tuner answers (a twin run or a reuse) at most once per step;
- no loop goes two intervals without a step while the fleet's first twin runs queue;
- every process the harness started is gone afterwards.
"""

from __future__ import annotations

import math
from pathlib import Path

from conftest import processes_mentioning
from slipstream import scalebench as scale
from slipstream.observe import fleet, queries

N = 20


def test_scale_harness_at_20_deployments(tmp_path: Path) -> None:
    lines: list[str] = []
    figures = scale.run(tmp_path, scale.Options(
        deployments=N, interval_s=10, intervals=1, scrape_s=2.0, background=False, warmup_intervals=0,
        reconcile_deadline_s=120, progress=lines.append,
    ))  # fmt: skip
    progress = "\n".join(lines)
    assert figures.metrics_available == N and figures.recommended == N, progress
    fleet_queries = len(queries.fleet_reads(10))
    # Back from the per-interval figure to the window's count (the figure is rounded to 0.1).
    made = figures.prometheus_queries_per_interval * figures.measured_s / figures.interval_s
    reads = math.floor(figures.measured_s / fleet.FleetObserver().reuse_s) + 1
    assert 0 < made <= reads * fleet_queries + 1, figures
    # At most one tuner call (a twin run or a reuse) per loop step: counted since the
    # operator started, since a run a step queued (TwinQueued) may finish in a later window;
    # in the window itself, at most its steps' calls and one run per deployment queued before
    # it (a deployment has one run on the pool at most). A loop steps at most once per
    # interval, so in a window of measured_s each deployment may step
    # floor(measured_s / interval_s) + 1 times (the window may hold both ends). The
    # per-interval figures are rounded to 0.1.
    # (A step is counted as it ends, so a step still writing its status when the totals are
    # read may have made its call already: at most one such step per deployment.)
    assert figures.steps_total > N and 0 < figures.tuner_calls_total <= figures.steps_total + N, figures
    calls = figures.tuner_runs_per_interval + figures.tuner_reuses_per_interval
    queued_before = N * figures.interval_s / figures.measured_s
    assert 0 < calls <= figures.tuning_steps_per_interval + queued_before + 0.2, figures
    most = N * (math.floor(figures.measured_s / figures.interval_s) + 1) * figures.interval_s / figures.measured_s
    assert figures.tuning_steps_per_interval <= most + 0.1, figures
    assert figures.apiserver_requests_per_interval.get("PATCH", 0) > 0, figures  # the loops write status
    # Every loop kept stepping while the first round of twin runs queued on the pool: a step
    # that finds every tuner thread busy holds (TwinQueued) instead of waiting its turn.
    assert figures.longest_without_step_s <= 2 * figures.interval_s, figures
    assert figures.operator_peak_rss_mb > 0
    # The engine Deployments' status events (their pods becoming Ready) cost no reads: the
    # drift watch judges an object's first event and its owned parts' changes only.
    assert figures.apply_drift_events["skipped"] > 0, figures
    assert figures.apply_drift_events["judged"] > 0, figures
    assert processes_mentioning(str(tmp_path)) == []
