"""The PromQL the operator sends: one query per metric family per interval (the three
largest in six parts), for every ServingDeployment at once.

Each query aggregates ``by (namespace, servingdeployment, ...)`` (the target labels of
INTERFACES.md section E), so the number of queries per interval (``fleet_reads``) is the
same whether one deployment or five hundred are watched. Where a family needs more than one
series (a histogram's buckets and its ``_sum``; cached and prompt token counters), the parts
are joined with ``or`` and told apart by a ``part`` label added with ``label_replace``: one
round trip, one evaluation time, so the parts can never disagree about the window.

The three largest answers (TTFT and uncached-token buckets, the queue mix: ~50,000 of the
~73,000 series at 500 deployments) are sent in six parts (``SHARDS``), split by the last
character of the deployment's name: each part's answer is about a sixth of the whole, and
the operator's peak memory is set by the largest answer alive at once (its body, its text
and its decoded series; the figures are in docs/reliability.md, "What keeps the memory
bounded"). The parts cover every name once (a DNS-1123 name ends in a letter or digit), so
their answers are disjoint by deployment, and Prometheus evaluates the same series in all.

Pure: strings in, strings out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from slipstream.engine import metrics

DEPLOYMENT_LABELS = ("namespace", "servingdeployment")
"""Target labels naming a ServingDeployment."""
TENANT_LABEL = "tenant"
"""The custom label the engines take from the ``x-custom-labels`` header (the default of
``spec.tuning.objective.tenantLabel``)."""
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
POD_LABEL = "pod"
PART_LABEL = "part"
"""Added by ``label_replace`` to tell the parts of one query's answer apart."""

SUM_PART = "sum"
BUCKET_PART = "bucket"

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def window(seconds: float) -> str:
    """A PromQL range for ``seconds`` (whole milliseconds, never below 1 ms)."""
    if seconds <= 0:
        raise ValueError(f"window must be > 0 s, got {seconds}")
    return f"{max(1, round(seconds * 1000))}ms"


def _by(*labels: str) -> str:
    return ", ".join(labels)


def tagged(part: str, expr: str) -> str:
    """``expr`` with a constant label ``part="<part>"`` (to join parts with ``or``)."""
    return f'label_replace({expr}, "{PART_LABEL}", "{part}", "", "")'


def union(*exprs: str) -> str:
    return " or ".join(f"({e})" for e in exprs)


def name_matcher(metric: str) -> str:
    """A ``__name__`` matcher for ``sglang:x`` that also takes ``sglang_x``.

    prometheus_client 0.26 (SGLang's, the engine simulator's) writes ``sglang_x`` sample
    names when the scraper negotiates OpenMetrics, as Prometheus 2.x does
    (prometheus/client_python#1177), and ``sglang:x`` in the text format. Which one a
    Prometheus stores depends on its version and config, so queries take either.
    """
    prefix, colon, rest = metric.partition(":")
    if not colon:
        return f'__name__="{metric}"'
    return f'__name__=~"{re.escape(prefix)}[:_]{re.escape(rest)}"'


def selector(metric: str, matchers: Sequence[str] = ()) -> str:
    """``{__name__=~"sglang[:_]x", servingdeployment!="", ...}``: engine targets only."""
    return "{" + ", ".join([name_matcher(metric), 'servingdeployment!=""', *matchers]) + "}"


def histogram_increase(metric: str, by: Sequence[str], rng: str, matchers: Sequence[str] = ()) -> str:
    """The increase of a histogram's buckets (``le`` kept) and of its ``_sum``, by ``by``."""
    buckets = f"sum by ({_by(*by, 'le')}) (increase({selector(metric + '_bucket', matchers)}[{rng}]))"
    total = f"sum by ({_by(*by)}) (increase({selector(metric + '_sum', matchers)}[{rng}]))"
    return union(tagged(BUCKET_PART, buckets), tagged(SUM_PART, total))


SHARDS = ("[01a-d]", "[23e-h]", "[45i-m]", "[67n-r]", "[8s-v]", "[9w-z]")
"""The last characters of the deployment names each part of a sharded query covers
(``fleet_reads``): a partition of DNS-1123's last characters, balanced for names that end
in a counter or a word."""
SHARDED = ("ttft", "uncached", "mix")
"""The ``FleetQueries`` fields sent in ``SHARDS`` parts: the largest answers."""


def shard_matcher(last: str) -> str:
    """Only the deployments whose name ends in one of the characters ``last`` (a class)."""
    return f'{DEPLOYMENT_LABELS[1]}=~".*{last}"'


@dataclass(frozen=True, slots=True)
class FleetQueries:
    """The queries of one interval, every deployment together (one per metric family)."""

    ttft: str
    """TTFT histogram increase by deployment, tenant and ``le``, plus its ``_sum``."""
    uncached: str
    """Uncached-prompt-token histogram increase, same shape."""
    output: str
    """Output-token histogram increase (finished requests), same shape."""
    tokens: str
    """Cached and prompt token increases by deployment and tenant (the cache-hit ratio)."""
    queue: str
    """Queue depth now (sum over pods) and the newest sample's timestamp (freshness)."""
    settings: str
    """Each pod's setting gauges: threshold, mode in force, admission order in force."""
    targets: str
    """Scrape targets up and down, by deployment and pod: the pods that are up are the
    deployment's pods even when they export no setting gauge."""
    mix: str
    """The queue mix (patch): arrivals by tenant; first tokens, cached and uncached tokens
    by tenant and size class over the window; waiting requests and their tokens by tenant
    and size class now. Empty for an engine without these series."""

    def items(self) -> list[tuple[str, str]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def check_label(label: str) -> str:
    if not _LABEL_NAME.match(label) or label.startswith("__"):
        raise ValueError(f"tenant label {label!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    return label


def fleet_reads(window_s: float, tenant_label: str = TENANT_LABEL) -> list[tuple[str, str]]:
    """(field, query) of every query one fleet read sends, in order: each ``FleetQueries``
    field once, the ``SHARDED`` ones once per shard (their answers are joined by field)."""
    whole = fleet(window_s, tenant_label)
    shards = [fleet(window_s, tenant_label, last) for last in SHARDS]
    return [(name, promql) for name, promql in whole.items()
            for promql in ([getattr(s, name) for s in shards] if name in SHARDED else [promql])]  # fmt: skip


def fleet(window_s: float, tenant_label: str = TENANT_LABEL, shard: str = "") -> FleetQueries:
    """All queries of one observation over the last ``window_s`` seconds; with ``shard`` (one
    of ``SHARDS``), the ``SHARDED`` ones only for the deployments whose name ends in it."""
    rng = window(window_s)
    dep = DEPLOYMENT_LABELS
    per_tenant = (*dep, check_label(tenant_label))
    per_pod = (*dep, POD_LABEL)
    only = (shard_matcher(shard),) if shard else ()
    return FleetQueries(
        ttft=histogram_increase(metrics.TTFT_SECONDS, per_tenant, rng, only),
        uncached=histogram_increase(metrics.UNCACHED_PROMPT_TOKENS, per_tenant, rng, only),
        output=histogram_increase(metrics.GENERATION_TOKENS, per_tenant, rng),
        tokens=union(
            tagged("cached", f"sum by ({_by(*per_tenant)}) (increase({selector(metrics.CACHED_TOKENS_TOTAL)}[{rng}]))"),
            tagged("prompt", f"sum by ({_by(*per_tenant)}) (increase({selector(metrics.PROMPT_TOKENS_TOTAL)}[{rng}]))"),
        ),
        queue=union(
            tagged("depth", f"sum by ({_by(*dep)}) ({selector(metrics.NUM_QUEUE_REQS)})"),
            tagged("newest", f"max by ({_by(*dep)}) (timestamp({selector(metrics.NUM_QUEUE_REQS)}))"),
        ),
        settings=union(
            tagged("threshold", f"max by ({_by(*per_pod)}) ({selector(metrics.LONG_PREFILL_TOKEN_THRESHOLD)})"),
            tagged("mode", f"max by ({_by(*per_pod, 'mode')}) ({selector(metrics.LONG_PREFILL_MODE)} == 1)"),
            tagged("policy", f"max by ({_by(*per_pod, 'policy')}) ({selector(metrics.SCHEDULE_POLICY)} == 1)"),
        ),
        targets=union(
            tagged("up", f"count by ({_by(*per_pod)}) ({selector('up')} == 1)"),
            tagged("down", f"count by ({_by(*per_pod)}) ({selector('up')} == 0)"),
        ),
        mix=mix(per_tenant, rng, only),
    )


def mix(per_tenant: Sequence[str], rng: str, matchers: Sequence[str] = ()) -> str:
    """The queue-mix query (``FleetQueries.mix``): five parts told apart by ``part``."""
    by_class = (*per_tenant, metrics.SIZE_CLASS_LABEL)
    ttft_count = selector(metrics.TTFT_BY_SIZE_CLASS_SECONDS + "_count", matchers)
    arrivals = selector(metrics.REQUEST_ARRIVALS_TOTAL, matchers)
    tokens = selector(metrics.PROMPT_TOKENS_BY_SIZE_CLASS_TOTAL, matchers)
    return union(
        tagged("arrivals", f"sum by ({_by(*per_tenant)}) (increase({arrivals}[{rng}]))"),
        tagged("first_tokens", f"sum by ({_by(*by_class)}) (increase({ttft_count}[{rng}]))"),
        tagged("tokens", f"sum by ({_by(*by_class, metrics.CACHE_LABEL)}) (increase({tokens}[{rng}]))"),
        tagged("queued", f"sum by ({_by(*by_class)}) ({selector(metrics.QUEUE_REQS_BY_SIZE_CLASS, matchers)})"),
        tagged("queued_tokens", f"sum by ({_by(*by_class)}) ({selector(metrics.QUEUE_TOKENS_BY_SIZE_CLASS, matchers)})"),
    )


def _quote(value: str) -> str:
    """A PromQL string literal (double-quoted, Go escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_name(field: str, value: str) -> str:
    """Refuse anything that is not a Kubernetes (DNS-1123) name, naming the field."""
    if not _DNS_NAME.match(value) or len(value) > 253:
        raise ValueError(
            f"{field} {value!r} is not a Kubernetes name (lower-case letters, digits, '-' and '.')"
        )
    return value


def pods_ttft(
    namespace: str, deployment: str, pods: Sequence[str], window_s: float, tenant_label: str = TENANT_LABEL
) -> str:
    """TTFT increase by tenant over ``pods`` of one deployment (canary or baseline subset)."""
    matchers = pod_matchers(namespace, deployment, pods)
    return histogram_increase(metrics.TTFT_SECONDS, (check_label(tenant_label),), window(window_s), matchers)


def pod_matchers(namespace: str, deployment: str, pods: Sequence[str]) -> list[str]:
    """Label matchers of a subset of one deployment's pods (names checked)."""
    if not pods:
        raise ValueError("pods must name at least one pod")
    names = [check_name("pod", p) for p in pods]
    pod_regex = "|".join(re.escape(p) for p in names)
    return [
        f"namespace={_quote(check_name('namespace', namespace))}",
        f"servingdeployment={_quote(check_name('deployment', deployment))}",
        f"pod=~{_quote(pod_regex)}",
    ]


def size_class_exported(namespace: str, deployment: str, pods: Sequence[str], lookback_s: float) -> str:
    """How many size-class TTFT series the pods had in the last ``lookback_s``: whether the
    engines export ``sglang:ttft_by_size_class_seconds`` at all, so that an analysis whose
    every sub-window Prometheus missed can tell a scrape gap (they do) from engines without
    the histogram (they never did)."""
    sel = selector(f"{metrics.TTFT_BY_SIZE_CLASS_SECONDS}_count", pod_matchers(namespace, deployment, pods))
    return f"count(last_over_time({sel}[{window(lookback_s)}]))"


def size_class_windows(
    namespace: str, deployment: str, sides: Mapping[str, Sequence[str]], offsets_s: Sequence[float],
    sub_window_s: float, tenant_label: str = TENANT_LABEL,
) -> str:
    """Per-(tenant, ``size_class``) TTFT ``_count`` and ``_sum`` increases of pod subsets over
    successive sub-windows, in one query (the sequential canary rule's cells).

    ``sides`` names each pod subset (``canary``, ``baseline``); sub-window k ends
    ``offsets_s[k]`` seconds before the evaluation time. Each series is tagged
    ``part="SIDE/K/count"`` or ``"SIDE/K/sum"``."""
    by = _by(check_label(tenant_label), metrics.SIZE_CLASS_LABEL)
    rng = window(sub_window_s)
    exprs = []
    for side, pods in sides.items():
        matchers = pod_matchers(namespace, deployment, pods)
        for k, offset in enumerate(offsets_s):
            shift = f" offset {window(offset)}" if offset > 0 else ""
            for part in ("count", "sum"):
                sel = selector(f"{metrics.TTFT_BY_SIZE_CLASS_SECONDS}_{part}", matchers)
                exprs.append(tagged(f"{side}/{k}/{part}", f"sum by ({by}) (increase({sel}[{rng}]{shift}))"))
    return union(*exprs)
