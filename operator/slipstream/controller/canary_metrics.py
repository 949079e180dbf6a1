"""Canary figures from Prometheus: per-tenant p99 TTFT of some pods of one deployment.

Implements `rollout.analysis.PodLatency` with one instant query at the end of the window:

    histogram_quantile(0.99, sum by (<tenant label>, le) (increase(
        sglang:time_to_first_token_seconds_bucket{namespace="ns", servingdeployment="sd",
                                                   pod=~"a|b"}[<window>s])))

The engine targets carry the labels `namespace`, `pod` and `servingdeployment`
(INTERFACES E). NaN answers (no first token in the window) are left out, so a tenant with
no traffic is not compared; a failed or garbled answer raises, so it is never read as
"no regression".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from slipstream.engine import metrics


class QueryError(RuntimeError):
    """Prometheus did not answer the query with a vector."""


def quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def p99_query(namespace: str, deployment: str, pods: Sequence[str], window_s: int, tenant_label: str) -> str:
    pod_re = "|".join(re.escape(p) for p in sorted(pods))
    selector = (
        f'namespace="{quote(namespace)}",servingdeployment="{quote(deployment)}",pod=~"{quote(pod_re)}"'
    )
    return (
        f"histogram_quantile(0.99, sum by ({tenant_label}, le) "
        f"(increase({metrics.TTFT_SECONDS}_bucket{{{selector}}}[{window_s}s])))"
    )


def parse_vector(body: Any, label: str) -> dict[str, float]:
    """{label value: finite sample} of an instant-query answer; raises on anything else."""
    if not isinstance(body, dict) or body.get("status") != "success":
        raise QueryError(f"not a successful answer: {str(body)[:200]}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise QueryError("the answer is not a vector")
    out: dict[str, float] = {}
    for sample in data["result"]:
        try:
            name = str(sample["metric"].get(label, ""))
            value = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise QueryError(f"garbled sample {str(sample)[:200]}") from error
        if math.isfinite(value):
            out[name] = value
    return out


@dataclass(frozen=True)
class PrometheusLatency:
    """`PodLatency` against one Prometheus (the deployment's spec.prometheus.url)."""

    url: str
    tenant_label: str = "tenant"
    timeout_seconds: float = 10.0
    bearer_token: str | None = None

    async def tenant_p99(
        self, namespace: str, deployment: str, pods: Sequence[str], start_s: float, end_s: float
    ) -> dict[str, float]:
        window = max(1, round(end_s - start_s))
        query = p99_query(namespace, deployment, pods, window, self.tenant_label)
        headers = {"Authorization": f"Bearer {self.bearer_token}"} if self.bearer_token else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(self.url.rstrip("/") + "/api/v1/query", params={"query": query, "time": f"{end_s:.3f}"},
                        headers=headers) as response,  # fmt: skip
        ):
            if response.status != 200:
                raise QueryError(f"HTTP {response.status}")
            body = await response.json(content_type=None)
        return parse_vector(body, self.tenant_label)
