"""The queue-mix metrics (slipstream.engine.metrics) from the real TokenizerManager and
TokenizerMetricsCollector, both versions.

The requests go through the real ``TokenizerManager`` methods a served request runs:
``_init_req_state`` (what ``generate_request`` does first), ``_send_one_request`` /
``_send_batch_request`` (tokenized requests to the scheduler), ``_handle_batch_output``
(the scheduler's outputs: ``collect_metrics`` observes TTFT there) and
``_handle_abort_req`` (an abort echo). Stand-ins: the manager is built without its
``__init__`` (no tokenizer, model or ZMQ sockets) with the attributes those methods read;
``_dispatch_to_scheduler`` (the ZMQ send) records what it is sent; the collector's
metric classes (SGLang's ``_StatLoggerDIMixin`` hooks) are prometheus_client's, bound to
a registry of the test's own, which the test scrapes as Prometheus would.
"""

from __future__ import annotations

import asyncio
import functools
import inspect

import msgspec
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sglang.srt.managers import io_struct
from sglang.srt.managers import tokenizer_manager as tm
from sglang.srt.observability import metrics_collector as mc
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from slipstream.api import buckets
from slipstream.engine import metrics as names

BASE = {"model_name": "m", "engine_type": "unified"}


class _NullTransport:
    def prepare_for_dispatch(self, items):
        return []

    async def prepare_for_dispatch_async(self, items):
        return []

    def cancel_for_dispatch(self, items):
        pass


def _collector(registry):
    def bound(cls):
        return functools.partial(cls, registry=registry)

    class Collector(mc.TokenizerMetricsCollector):
        _counter_cls = bound(Counter)
        _gauge_cls = bound(Gauge)
        _histogram_cls = bound(Histogram)

    return Collector(server_args=ServerArgs(model_path="dummy"), labels={**BASE, "tenant": ""})


def _manager(registry):
    m = object.__new__(tm.TokenizerManager)
    m.server_args = ServerArgs(model_path="dummy", skip_tokenizer_init=True, enable_metrics=True)
    set_global_server_args_for_scheduler(m.server_args)  # what launch_server sets
    m.rid_to_state = {}
    m.enable_metrics = True
    m.metrics_collector = _collector(registry)
    m.enable_priority_scheduling = False
    m.enable_trace = False
    m.enable_lora = False
    m.disaggregation_mode = tm.DisaggregationMode.NULL
    m.dump_requests_folder = ""
    m.crash_dump_folder = ""
    m.skip_tokenizer_init = True
    m.incremental_streaming_output = False
    m.tokenizer_ipc_name = None
    m.cuda_vmm_feature_transport = _NullTransport()
    m.positional_embeds_transport = _NullTransport()
    m.encoder_dispatch_ready = {}
    m.sent = []
    m._dispatch_to_scheduler = m.sent.append
    return m


def _call(result):
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def _fields(cls, **given):
    """An io_struct message with the given fields and None for every other required one."""
    required = {f.name: None for f in msgspec.structs.fields(cls) if f.required}
    return cls(**{**required, **given})


def _tokenized(rid, prompt_tokens, stream=True):
    return _fields(
        io_struct.TokenizedGenerateReqInput, rid=rid, input_text=None,
        input_ids=list(range(prompt_tokens)), sampling_params=SamplingParams(max_new_tokens=4),
        return_logprob=False, logprob_start_len=-1, top_logprobs_num=0, stream=stream,
    )


def arrive(m, tenant, prompt_tokens, rid, stream=True):
    """What generate_request does for one request, up to its send to the scheduler."""
    obj = io_struct.GenerateReqInput(
        rid=rid, input_ids=[0] * prompt_tokens, stream=stream,
        custom_labels={"tenant": tenant}, sampling_params={"max_new_tokens": 4},
    )
    obj.normalize_batch_and_arguments()
    m._init_req_state(obj)
    tok = _tokenized(rid, prompt_tokens, stream)
    tok.time_stats = m.rid_to_state[rid].time_stats
    _call(m._send_one_request(tok))
    return obj


def first_output(m, rid, prompt_tokens, cached_tokens, finished=False):
    """The scheduler's first output of ``rid`` (one token), through _handle_batch_output."""
    out = _fields(
        io_struct.BatchStrOutput, rids=[rid],
        finished_reasons=[{"type": "length", "length": 1} if finished else None],
        output_strs=["x"], output_ids=[[1]], prompt_tokens=[prompt_tokens],
        completion_tokens=[1], reasoning_tokens=[0], cached_tokens=[cached_tokens],
        retraction_counts=[0],
    )
    _call(m._handle_batch_output(out))


def scrape(registry):
    """{(name, labels without model_name/engine_type): value} of the exposition."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in BASE}
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture()
def mgr():
    registry = CollectorRegistry()
    return _manager(registry), registry


def test_queue_mix_arrivals_counted_before_any_first_token(mgr):
    m, reg = mgr
    arrive(m, "acme", 500, "a1")
    arrive(m, "acme", 20_000, "a2")
    arrive(m, "beta", 400_000, "b1")
    assert len(m.sent) == 3  # the real send reached the (stand-in) scheduler socket
    s = scrape(reg)
    assert value(s, names.REQUEST_ARRIVALS_TOTAL, tenant="acme") == 2
    assert value(s, names.REQUEST_ARRIVALS_TOTAL, tenant="beta") == 1
    # No first token yet: all three queued, by prompt-token size class.
    q, qt = names.QUEUE_REQS_BY_SIZE_CLASS, names.QUEUE_TOKENS_BY_SIZE_CLASS
    assert value(s, q, tenant="acme", size_class="le1k") == 1
    assert value(s, q, tenant="acme", size_class="le60k") == 1
    assert value(s, qt, tenant="acme", size_class="le60k") == 20_000
    assert value(s, q, tenant="beta", size_class="gt300k") == 1
    assert value(s, qt, tenant="beta", size_class="gt300k") == 400_000


def test_queue_mix_series_at_zero_on_a_tenants_first_arrival(mgr):
    m, reg = mgr
    arrive(m, "acme", 150_000, "a1")
    s = scrape(reg)
    for cls in buckets.SIZE_CLASS_NAMES:
        assert value(s, names.TTFT_BY_SIZE_CLASS_SECONDS + "_count", tenant="acme", size_class=cls) == 0
        for cache in names.CACHE_PARTS:
            assert value(s, names.PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL, tenant="acme",
                         size_class=cls, cache=cache) == 0
    # The upstream TTFT histogram is left as upstream makes it (no series before a token).
    assert not any(k[0].startswith(names.TTFT_SECONDS) for k in s)


def test_queue_mix_first_token_ttft_by_class_and_cached_split(mgr):
    m, reg = mgr
    arrive(m, "acme", 20_000, "a1")
    arrive(m, "acme", 900, "a2")
    # 20,000 prompt tokens, 14,000 from the prefix cache: 6,000 uncached, class le8k.
    first_output(m, "a1", 20_000, 14_000)
    s = scrape(reg)
    ttft = names.TTFT_BY_SIZE_CLASS_SECONDS
    assert value(s, ttft + "_count", tenant="acme", size_class="le8k") == 1
    assert value(s, ttft + "_count", tenant="acme", size_class="le60k") == 0
    assert value(s, ttft + "_bucket", tenant="acme", size_class="le8k", le="0.1") == 1
    tokens = names.PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL
    assert value(s, tokens, tenant="acme", size_class="le8k", cache="uncached") == 6_000
    assert value(s, tokens, tenant="acme", size_class="le8k", cache="cached") == 14_000
    # Upstream's TTFT histogram saw the same first token.
    assert value(s, names.TTFT_SECONDS + "_count", tenant="acme", is_streaming="true") == 1
    # a1 left the queue (its class reads 0, not its old value); a2 still waits.
    q, qt = names.QUEUE_REQS_BY_SIZE_CLASS, names.QUEUE_TOKENS_BY_SIZE_CLASS
    assert value(s, q, tenant="acme", size_class="le60k") == 0
    assert value(s, qt, tenant="acme", size_class="le60k") == 0
    assert value(s, q, tenant="acme", size_class="le1k") == 1
    # Later outputs of a1 change nothing in the mix.
    first_output(m, "a1", 20_000, 14_000, finished=True)
    s2 = scrape(reg)
    assert value(s2, ttft + "_count", tenant="acme", size_class="le8k") == 1
    assert value(s2, q, tenant="acme", size_class="le60k") == 0
    assert value(s2, names.REQUEST_ARRIVALS_TOTAL, tenant="acme") == 2


def test_queue_mix_abort_before_first_token_leaves_the_queue(mgr):
    m, reg = mgr
    arrive(m, "acme", 5_000, "a1")
    m._handle_abort_req(io_struct.AbortReq(rid="a1"))
    s = scrape(reg)
    assert value(s, names.QUEUE_REQS_BY_SIZE_CLASS, tenant="acme", size_class="le8k") == 0
    assert value(s, names.QUEUE_TOKENS_BY_SIZE_CLASS, tenant="acme", size_class="le8k") == 0
    assert value(s, names.REQUEST_ARRIVALS_TOTAL, tenant="acme") == 1
    assert "a1" not in m.rid_to_state


def test_queue_mix_batch_send_counts_each_request(mgr):
    m, reg = mgr
    objs = []
    for i, n in enumerate((100, 3_000)):
        obj = io_struct.GenerateReqInput(rid=f"b{i}", input_ids=[0] * n, stream=True,
                                         custom_labels={"tenant": "acme"})
        obj.normalize_batch_and_arguments()
        m._init_req_state(obj)
        objs.append(_tokenized(f"b{i}", n))
        objs[-1].time_stats = m.rid_to_state[f"b{i}"].time_stats
    m.batch_tokenized_generate_req_type = io_struct.BatchTokenizedGenerateReqInput
    _call(m._send_batch_request(objs))
    s = scrape(reg)
    assert value(s, names.REQUEST_ARRIVALS_TOTAL, tenant="acme") == 2
    assert value(s, names.QUEUE_REQS_BY_SIZE_CLASS, tenant="acme", size_class="le1k") == 1
    assert value(s, names.QUEUE_REQS_BY_SIZE_CLASS, tenant="acme", size_class="le8k") == 1


def test_queue_mix_size_classes_match_the_operator():
    assert mc.SIZE_CLASSES == buckets.SIZE_CLASSES
    assert [mc.size_class_of(n) for n in (1_000, 1_001, 300_000, 300_001)] == [
        "le1k", "le8k", "le300k", "gt300k",
    ]
