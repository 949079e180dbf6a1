"""Run-time switches of the admission order (`/set_internal_state {"schedule_policy": ...}`).

0.5.23 switches among fcfs, lpm, srpt and its own hrrn and shortest-prefill-first, with
T = 0 or T > 0; 0.5.18 (which has neither upstream order) among fcfs, lpm and srpt, and
refuses the others naming its set. On the real scheduler (`Scheduler.set_internal_state`
through 0.5.23's `SchedulerInternalStateController`), the real `SchedulePolicy` orders
the next passes, and the real `SchedulerMetricsCollector` publishes the order in force.
"""

from __future__ import annotations

import harness as h
import pytest
from prometheus_client import REGISTRY

LABELS = {"model_name": "m", "moe_ep_rank": "0"}


_SERIES = {
    "long_prefill_token_threshold": "sglang:long_prefill_token_threshold",
    "num_partial_prefills": "sglang:num_partial_prefills",
    "max_partial_prefills": "sglang:max_partial_prefills",
    "partial_prefill_kv_reserved_tokens": "sglang:partial_prefill_kv_reserved_tokens",
    "long_prefill_mode": "sglang:long_prefill_mode",
    "schedule_policy_info": "sglang:schedule_policy",
    "long_prefill_rounds_total": "sglang:long_prefill_rounds_total",
}


def _collector():
    """The real scheduler collector. It registers its series in prometheus_client's
    default registry, once per process: when test_server_args_and_metrics.py (which
    runs first: this file sorts after it) has registered them, the real
    ``log_long_prefill`` publishes on those series."""
    from sglang.srt.observability import metrics_collector as mc
    from sglang.srt.server_args import ServerArgs

    registered = REGISTRY._names_to_collectors
    if "sglang:schedule_policy" not in registered:
        return mc.SchedulerMetricsCollector(
            labels=LABELS, server_args=ServerArgs(model_path="dummy")
        )
    c = mc.SchedulerMetricsCollector.__new__(mc.SchedulerMetricsCollector)
    c.labels = LABELS
    for attr, name in _SERIES.items():
        setattr(c, attr, registered[name])
    c._known_schedule_policies = set()
    return c


def _gauge(policy: str) -> float | None:
    return REGISTRY.get_sample_value("sglang:schedule_policy", {**LABELS, "policy": policy})


def _in_force(eng) -> tuple[str, str]:
    """The order /get_internal_state reports (the scheduler's long-prefill state) and
    the one the resolved config (get_schedule(), read by upstream's admission) holds."""
    from sglang.srt.runtime_context import get_context

    return (
        eng.s._long_prefill_state()["schedule_policy"],
        get_context().resolved_server_args_dict()["schedule_policy"],
    )


def _queue(eng):
    """b: 1000 tokens, first in; a: 100 tokens, second; c: 50 tokens, last. With the
    prefill-token counter at 10,000 (hrrn's clock), b has waited 10,000 tokens
    (ratio 10), a 5,000 (ratio 50), c 10 (ratio 0.2)."""
    eng.s.processed_tokens_counter = 10_000
    for rid, need, arrival, snapshot in (
        ("b", 1000, 0.0, 0),
        ("a", 100, 1.0, 5000),
        ("c", 50, 2.0, 9990),
    ):
        req = eng.add(need, rid=rid, arrival=arrival)
        req.arrival_processed_tokens = snapshot


ORDERS = {
    "fcfs": ["b", "a", "c"],
    "hrrn": ["a", "b", "c"],  # highest response ratio first
    "shortest-prefill-first": ["c", "a", "b"],
}


@pytest.mark.parametrize("threshold", [0, 512])
@pytest.mark.parametrize("policy", ["hrrn", "shortest-prefill-first", "fcfs"])
def test_hot_switch_to_an_upstream_order_orders_the_next_passes(policy, threshold):
    eng = h.make_engine(chunked_prefill_size=4096, page_size=1, threshold=threshold, policy="lpm")
    eng.s.metrics_collector = _collector()
    eng.s._report_long_prefill_metrics()  # what the first round publishes: lpm
    assert _gauge("lpm") == 1
    out = h.set_internal_state(eng, schedule_policy=policy)
    if not h.V0523 and policy != "fcfs":
        _assert_refused_on_0518(eng, out, policy, "lpm")
        return
    assert out.updated, out.reason
    assert _in_force(eng) == (policy, policy)
    assert _gauge(policy) == 1 and _gauge("lpm") == 0
    _queue(eng)
    alloc = eng.step()
    assert list(alloc) == ORDERS[policy], alloc
    cap = threshold or 4096
    assert alloc == {rid: min(need, cap) for rid, need in (("b", 1000), ("a", 100), ("c", 50))}
    eng.run_to_completion()
    assert eng.kv_free() == eng.kv_free_at_start


def test_hot_switch_spf_admits_the_shortest_first_when_the_budget_is_short():
    eng = h.make_engine(chunked_prefill_size=1024, page_size=1, threshold=0, policy="fcfs")
    out = h.set_internal_state(eng, schedule_policy="shortest-prefill-first")
    if not h.V0523:
        _assert_refused_on_0518(eng, out, "shortest-prefill-first", "fcfs")
        return
    assert out.updated, out.reason
    _queue(eng)
    alloc = eng.step()
    assert list(alloc)[:2] == ["c", "a"] and alloc["c"] == 50 and alloc["a"] == 100
    assert h.set_internal_state(eng, schedule_policy="hrrn").updated
    assert _in_force(eng) == ("hrrn", "hrrn")
    eng.run_to_completion()
    assert eng.kv_free() == eng.kv_free_at_start


def test_hot_switch_keeps_upstreams_start_up_refusal_all_or_nothing():
    # shortest-prefill-first needs the radix cache (SchedulePolicy refuses at start).
    eng = h.make_engine(chunked_prefill_size=4096, radix_cache=False, policy="fcfs")
    out = h.set_internal_state(
        eng, schedule_policy="shortest-prefill-first", long_prefill_token_threshold=512
    )
    assert not out.updated
    # 0.5.23: upstream's own reason; 0.5.18 has no such order.
    assert ("requires prefix caching" if h.V0523 else "['fcfs', 'lpm', 'srpt']") in out.reason
    assert (eng.s.schedule_policy, eng.s.long_prefill_token_threshold) == ("fcfs", 0)
    eng.add(100, rid="after")
    assert eng.step() == {"after": 100}


def _assert_refused_on_0518(eng, out, policy: str, before: str) -> None:
    assert not out.updated
    assert "['fcfs', 'lpm', 'srpt']" in out.reason and policy in out.reason
    assert eng.s.schedule_policy == before
    eng.add(100, rid="after")
    assert eng.step() == {"after": 100}
