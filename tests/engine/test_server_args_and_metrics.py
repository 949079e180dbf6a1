"""Start-up flags, refusals of unsupported combinations, and the metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram

from sglang.srt.managers import long_prefill as lp
from sglang.srt.server_args import ServerArgs, prepare_server_args


def args(**kw):
    a = ServerArgs(model_path="dummy", chunked_prefill_size=8192, page_size=16, **kw)
    return a


def test_cli_flags_parse():
    a = prepare_server_args(["--model-path", "dummy", "--long-prefill-token-threshold", "4096",
                             "--long-prefill-mode", "floor", "--schedule-policy", "srpt",
                             "--srpt-aging-tokens-per-s", "512"])
    assert (a.long_prefill_token_threshold, a.long_prefill_mode, a.schedule_policy,
            a.srpt_aging_tokens_per_s) == (4096, "floor", "srpt", 512.0)
    defaults = prepare_server_args(["--model-path", "dummy"])
    assert (defaults.long_prefill_token_threshold, defaults.long_prefill_mode) == (0, "ceiling")


@pytest.mark.parametrize("kw, reason", [
    ({"long_prefill_token_threshold": 4096, "pp_size": 2}, "pipeline parallelism"),
    ({"long_prefill_token_threshold": 4096, "disaggregation_mode": "prefill"}, "disaggregation"),
    ({"schedule_policy": "srpt", "pp_size": 2}, "pipeline parallelism"),
    ({"long_prefill_token_threshold": 100}, "multiple of the page size"),
    ({"long_prefill_token_threshold": 16384}, "<= chunked_prefill_size"),
])
def test_start_up_refuses_unsupported_combinations(kw, reason):
    with pytest.raises(ValueError, match=reason):
        lp.check_long_prefill_server_args(args(**kw))


def test_start_up_accepts_supported_settings():
    lp.check_long_prefill_server_args(args(long_prefill_token_threshold=4096))
    lp.check_long_prefill_server_args(args(pp_size=2))  # threshold 0: stock, any deployment


def test_metrics_gauges_and_buckets(monkeypatch):
    from sglang.srt.observability import metrics_collector as mc

    registry = CollectorRegistry()
    monkeypatch.setattr(mc.SchedulerMetricsCollector, "_gauge_cls",
                        lambda *a, **k: Gauge(*a, registry=registry, **k), raising=False)
    collector = mc.SchedulerMetricsCollector.__new__(mc.SchedulerMetricsCollector)
    labels = {"model_name": "m"}
    # Build only the patch's gauges via the real __init__ code path is heavy; check the
    # method and names against a registry-backed collector instance.
    collector.labels = labels
    collector.long_prefill_token_threshold = Gauge("sglang:long_prefill_token_threshold", "",
                                                   labels.keys(), registry=registry)
    collector.num_partial_prefills = Gauge("sglang:num_partial_prefills", "", labels.keys(),
                                           registry=registry)
    collector.long_prefill_mode = Gauge("sglang:long_prefill_mode", "", ["model_name", "mode"],
                                        registry=registry)
    collector.schedule_policy_info = Gauge("sglang:schedule_policy", "",
                                           ["model_name", "policy"], registry=registry)
    collector._known_schedule_policies = set()
    collector.log_long_prefill(threshold=2048, mode="floor", policy="fcfs", num_partial_prefills=3)
    collector.log_long_prefill(threshold=2048, mode="floor", policy="srpt", num_partial_prefills=3)
    get = registry.get_sample_value
    assert get("sglang:long_prefill_token_threshold", labels) == 2048
    assert get("sglang:num_partial_prefills", labels) == 3
    assert get("sglang:long_prefill_mode", {**labels, "mode": "floor"}) == 1
    assert get("sglang:long_prefill_mode", {**labels, "mode": "ceiling"}) == 0
    assert get("sglang:schedule_policy", {**labels, "policy": "srpt"}) == 1
    assert get("sglang:schedule_policy", {**labels, "policy": "fcfs"}) == 0


def test_the_real_collector_declares_the_gauges_and_1m_buckets():
    import inspect

    from sglang.srt.observability import metrics_collector as mc

    src = inspect.getsource(mc.SchedulerMetricsCollector.__init__)
    for name in ("sglang:long_prefill_token_threshold", "sglang:num_partial_prefills",
                 "sglang:long_prefill_mode", "sglang:schedule_policy"):
        assert name in src
    tok = inspect.getsource(mc.TokenizerMetricsCollector.__init__)
    assert "sglang:uncached_prompt_tokens_histogram" in tok
    assert "1000000," in tok  # default prompt-token buckets reach 1M


def test_metric_names_match_the_operator():
    from slipstream.engine import metrics

    assert metrics.LONG_PREFILL_TOKEN_THRESHOLD == "sglang:long_prefill_token_threshold"
    assert metrics.NUM_PARTIAL_PREFILLS == "sglang:num_partial_prefills"
    assert metrics.LONG_PREFILL_MODE == "sglang:long_prefill_mode"
