"""The scale benchmark's harness at 20 ServingDeployments (scripts/bench-scale.py runs it at
500): its structural claims, which can fail, and no timings.

- every ServingDeployment is reconciled (observedGeneration == generation) and every tuning
  loop gets valid metrics from the real Prometheus (the run raises otherwise);
- the Prometheus queries per tuning interval are those of the fleet's reads (one query per
  metric family for all deployments, at most two reads per interval), not one per
  deployment: at 20 deployments a per-deployment query would be at least 20;
- the tuner answers (a twin run or a reuse) at most once per deployment per interval, and
  every process the harness started is gone afterwards.
"""

from __future__ import annotations

from pathlib import Path

from conftest import processes_mentioning
from slipstream import scalebench as scale
from slipstream.observe import queries

N = 20


def test_scale_harness_at_20_deployments(tmp_path: Path) -> None:
    lines: list[str] = []
    figures = scale.run(tmp_path, scale.Options(
        deployments=N, interval_s=10, intervals=1, scrape_s=2.0, background=False, warmup_intervals=0,
        reconcile_deadline_s=120, progress=lines.append,
    ))  # fmt: skip
    progress = "\n".join(lines)
    assert figures.metrics_available == N and figures.recommended == N, progress
    fleet_queries = len(queries.fleet(10).items())
    assert 0 < figures.prometheus_queries_per_interval <= 2 * fleet_queries + 1, figures
    assert 0 < figures.tuner_runs_per_interval + figures.tuner_reuses_per_interval <= N + 1, figures
    assert figures.apiserver_requests_per_interval.get("PATCH", 0) > 0, figures  # the loops write status
    assert figures.operator_peak_rss_mb > 0
    # The engine Deployments' status events (their pods becoming Ready) cost no reads: the
    # drift watch judges an object's first event and its owned parts' changes only.
    assert figures.apply_drift_events["skipped"] > 0, figures
    assert figures.apply_drift_events["judged"] > 0, figures
    assert processes_mentioning(str(tmp_path)) == []
