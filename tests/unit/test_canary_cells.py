"""The sequential canary rule's input from Prometheus: one query for every sub-window and
side (`queries.size_class_windows`), and its answer as sub-windows (`stages.size_class_cells`)."""

import math

import pytest

from slipstream.controller import stages
from slipstream.observe import parse, queries
from slipstream.rollout import sequential


def test_one_query_tags_each_side_sub_window_and_part():
    promql = queries.size_class_windows("team-a", "chat", {"canary": ["chat-0"], "baseline": ["chat-1", "chat-2"]},
                                        [20.0, 10.0, 0.0], 10.0)  # fmt: skip
    for side in ("canary", "baseline"):
        for k in range(3):
            for part in ("count", "sum"):
                assert f'"part", "{side}/{k}/{part}"' in promql
    assert promql.count("offset 20000ms") == 4 and promql.count("offset 10000ms") == 4
    assert "offset 0ms" not in promql, "the newest sub-window ends at the evaluation time"
    assert "sum by (tenant, size_class)" in promql and "[10000ms]" in promql
    assert 'pod=~"chat\\\\-1|chat\\\\-2"' in promql
    assert queries.name_matcher("sglang:ttft_by_size_class_seconds_count") in promql
    with pytest.raises(ValueError, match="pods must name at least one pod"):
        queries.size_class_windows("team-a", "chat", {"canary": [], "baseline": ["chat-1"]}, [0.0], 10.0)


def sample(part: str, value: float, tenant: str = "acme", cls: str = "le1k") -> parse.Sample:
    return parse.Sample({"part": part, "tenant": tenant, "size_class": cls}, value, 0.0)


def test_the_answer_becomes_sub_windows_and_garbage_is_left_out():
    samples = [
        sample("canary/0/count", 10), sample("canary/0/sum", 5.0),
        sample("baseline/0/count", 20), sample("baseline/0/sum", 8.0),
        sample("baseline/1/count", 7), sample("baseline/1/sum", 3.5),
        sample("canary/1/count", math.nan), sample("canary/1/sum", 1.0),  # not finite: no cell
        sample("canary/1/count", 3, cls="le9k"), sample("canary/1/sum", 3, cls="le9k"),  # unknown class
        sample("canary/1/count", 3, tenant=""), sample("canary/1/sum", 3, tenant=""),  # no tenant
        sample("canary/1/sum", 2.0, cls="le8k"),  # a _sum without its _count
    ]
    windows = stages.size_class_cells(samples, [110.0, 120.0], 10.0)
    assert [(w.start_s, w.end_s) for w in windows] == [(100.0, 110.0), (110.0, 120.0)]
    assert windows[0].canary == {("acme", "le1k"): sequential.CellHistogram(10, 5.0)}
    assert windows[0].baseline == {("acme", "le1k"): sequential.CellHistogram(20, 8.0)}
    assert windows[1].canary == {}
    assert windows[1].baseline == {("acme", "le1k"): sequential.CellHistogram(7, 3.5)}
    # a sub-window with no cell on one side is no observation: Continue
    assert sequential.evaluate(windows[1:], sequential.SequentialRule()).outcome == "Continue"


def test_a_sub_window_prometheus_answered_nothing_for_is_blind_and_an_idle_one_is_not():
    """A scrape gap (no two samples in a sub-window's range: no series at all) is no
    evidence and moves the analysis limit out; an idle series answers a zero increase and
    is a quiet sub-window, scraped."""
    samples = [
        sample("canary/0/count", 10), sample("canary/0/sum", 5.0),
        sample("baseline/0/count", 20), sample("baseline/0/sum", 8.0),
        sample("canary/2/count", 0), sample("canary/2/sum", 0.0),  # idle: a zero increase
        sample("canary/3/count", 3, tenant=""), sample("canary/3/sum", 3, tenant=""),  # garbage only
    ]
    windows = stages.size_class_cells(samples, [110.0, 120.0, 130.0, 140.0], 10.0)
    assert [w.scraped for w in windows] == [True, False, True, False]
    assert windows[2].canary == {} and windows[2].baseline == {}
    assert sequential.blind_s(windows) == 20.0
