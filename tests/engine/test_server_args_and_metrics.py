"""Start-up flags, refusals of unsupported combinations, and the metrics."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from sglang.srt.managers import long_prefill as lp
from sglang.srt.server_args import ServerArgs, prepare_server_args


def args(**kw):
    a = ServerArgs(model_path="dummy", chunked_prefill_size=8192, page_size=16, **kw)
    return a


def test_cli_flags_parse():
    a = prepare_server_args(
        [
            "--model-path",
            "dummy",
            "--long-prefill-token-threshold",
            "4096",
            "--long-prefill-mode",
            "floor",
            "--schedule-policy",
            "srpt",
            "--srpt-aging-tokens-per-s",
            "512",
        ]
    )
    assert (
        a.long_prefill_token_threshold,
        a.long_prefill_mode,
        a.schedule_policy,
        a.srpt_aging_tokens_per_s,
    ) == (4096, "floor", "srpt", 512.0)
    defaults = prepare_server_args(["--model-path", "dummy"])
    assert (defaults.long_prefill_token_threshold, defaults.long_prefill_mode) == (0, "ceiling")


@pytest.mark.parametrize(
    "kw, reason",
    [
        ({"long_prefill_token_threshold": 4096, "pp_size": 2}, "pipeline parallelism"),
        (
            {"long_prefill_token_threshold": 4096, "disaggregation_mode": "prefill"},
            "disaggregation",
        ),
        ({"schedule_policy": "srpt", "pp_size": 2}, "pipeline parallelism"),
        ({"long_prefill_token_threshold": 100}, "multiple of the page size"),
        ({"long_prefill_token_threshold": 16384}, "<= chunked_prefill_size"),
    ],
)
def test_start_up_refuses_unsupported_combinations(kw, reason):
    with pytest.raises(ValueError, match=reason):
        lp.check_long_prefill_server_args(args(**kw))


def test_launch_check_refuses_before_anything_starts():
    # Engine._launch_subprocesses calls check_server_args() first thing.
    a = args(long_prefill_token_threshold=4096, pp_size=2)
    with pytest.raises(ValueError, match="not supported with pipeline parallelism"):
        a.check_server_args()


def test_start_up_accepts_supported_settings():
    lp.check_long_prefill_server_args(args(long_prefill_token_threshold=4096))
    lp.check_long_prefill_server_args(args(pp_size=2))  # threshold 0: stock, any deployment


@pytest.fixture(scope="module")
def collectors():
    """The real collectors, registered once in prometheus_client's default registry."""
    from sglang.srt.observability import metrics_collector as mc

    labels = {"model_name": "m", "moe_ep_rank": "0"}
    sched = mc.SchedulerMetricsCollector(labels=labels, server_args=ServerArgs(model_path="dummy"))
    tok = mc.TokenizerMetricsCollector(server_args=ServerArgs(model_path="dummy"), labels=labels)
    return labels, sched, tok


def test_long_prefill_gauges(collectors):
    labels, sched, _ = collectors
    sched.log_long_prefill(threshold=2048, mode="floor", policy="fcfs", num_partial_prefills=3)
    sched.log_long_prefill(threshold=2048, mode="floor", policy="srpt", num_partial_prefills=2)
    get = REGISTRY.get_sample_value
    assert get("sglang:long_prefill_token_threshold", labels) == 2048
    assert get("sglang:num_partial_prefills", labels) == 2
    assert get("sglang:long_prefill_mode", {**labels, "mode": "floor"}) == 1
    assert get("sglang:long_prefill_mode", {**labels, "mode": "ceiling"}) == 0
    assert get("sglang:schedule_policy", {**labels, "policy": "srpt"}) == 1
    assert get("sglang:schedule_policy", {**labels, "policy": "fcfs"}) == 0


def test_scheduler_publishes_the_gauges_each_round(collectors):
    import harness as h

    labels, sched, _ = collectors
    eng = h.make_engine(chunked_prefill_size=8192, threshold=2048, mode="ceiling")
    eng.s.metrics_collector = sched
    for i in range(3):
        eng.add(100_000, rid=f"L{i}")
    eng.step()
    get = REGISTRY.get_sample_value
    assert get("sglang:num_partial_prefills", labels) == 3
    assert get("sglang:long_prefill_mode", {**labels, "mode": "ceiling"}) == 1
    # Three partials of 100,000 tokens, 2048 each prefilled: their remainders reserved.
    assert get("sglang:partial_prefill_kv_reserved_tokens", labels) == 3 * (100_000 - 2048)
    assert get("sglang:max_partial_prefills", labels) == 8
    h.set_internal_state(eng, long_prefill_token_threshold=4096, max_partial_prefills=5)
    assert get("sglang:long_prefill_token_threshold", labels) == 4096
    assert get("sglang:max_partial_prefills", labels) == 5


def test_reflex_mode_gauge_has_a_reflex_label(collectors):
    import harness as h

    labels, sched, _ = collectors
    eng = h.make_engine(chunked_prefill_size=8192, threshold=2048, mode="reflex")
    eng.s.metrics_collector = sched
    eng.add(100, rid="s")
    eng.step()
    get = REGISTRY.get_sample_value
    modes = {m: get("sglang:long_prefill_mode", {**labels, "mode": m}) for m in lp.LONG_PREFILL_MODES}
    assert modes == {"ceiling": 0, "floor": 0, "reflex": 1}
    assert h.set_internal_state(eng, long_prefill_mode="floor").updated
    assert get("sglang:long_prefill_mode", {**labels, "mode": "reflex"}) == 0
    assert get("sglang:long_prefill_mode", {**labels, "mode": "floor"}) == 1


def test_uncached_prompt_tokens_buckets_reach_1m(collectors):
    labels, _, tok = collectors
    tok.uncached_prompt_tokens_histogram.labels(**labels).observe(950_000)
    get = REGISTRY.get_sample_value
    name = "sglang:uncached_prompt_tokens_histogram_bucket"
    assert get(name, {**labels, "le": "1e+06"}) == 1
    assert get(name, {**labels, "le": "800000.0"}) == 0


def test_metric_names_match_the_operator():
    from slipstream.engine import metrics

    assert metrics.LONG_PREFILL_TOKEN_THRESHOLD == "sglang:long_prefill_token_threshold"
    assert metrics.NUM_PARTIAL_PREFILLS == "sglang:num_partial_prefills"
    assert metrics.LONG_PREFILL_MODE == "sglang:long_prefill_mode"


def rounds(labels):
    """(capped, uncapped) of sglang:long_prefill_rounds_total so far."""
    get = REGISTRY.get_sample_value
    return tuple(int(get("sglang:long_prefill_rounds_total", {**labels, "capped": c})) for c in ("true", "false"))


def test_long_prefill_rounds_counts_capped_and_uncapped_reflex_rounds(collectors):
    """A giant alone (uncapped, it takes C), a short arrival (capped: T and the short one),
    the giant alone again (no hold: uncapped), and a round with nothing to prefill (not
    counted); then ceiling mode, every round capped."""
    import harness as h

    labels, sched, _ = collectors
    assert REGISTRY.get_sample_value("sglang:long_prefill_rounds_total", {**labels, "capped": "true"}) is not None
    eng = h.make_engine(chunked_prefill_size=8192, threshold=2048, mode="reflex", reflex_hold=0.0,
                        max_context_len=h.context_for(30_000))  # fmt: skip
    eng.s.metrics_collector = sched
    clock = h.FakeClock()
    eng.s._reflex_clock = clock
    start = rounds(labels)

    def since() -> tuple[int, int]:
        now = rounds(labels)
        return now[0] - start[0], now[1] - start[1]

    eng.add(20_000, rid="G")
    assert eng.step() == {"G": 8192}
    assert since() == (0, 1)
    eng.add(100, rid="s")
    clock.advance(1.0)
    assert eng.step() == {"G": 2048, "s": 100}
    assert since() == (1, 1)
    clock.advance(1.0)
    assert eng.step() == {"G": 8192}
    assert since() == (1, 2)
    eng.run_to_completion()
    done = since()
    assert done == (1, 3)  # the giant's last 1,568 tokens: uncapped; then decode passes only
    assert eng.step() == {}  # nothing waits: no prefill round, nothing counted
    assert since() == done
    assert h.set_internal_state(eng, long_prefill_mode="ceiling").updated
    eng.add(5000, rid="c")
    assert eng.step() == {"c": 2048}
    assert eng.step() == {"c": 2048}
    assert since() == (done[0] + 2, done[1])
