"""The one place that talks to Prometheus (through prometheus-api-client).

Every failure of a read becomes ``QueryFailed`` with words for the condition message:
connection refused, timeout, an HTTP error status, a body that is not JSON, JSON that is
not an instant vector. Nothing else escapes, so a misbehaving Prometheus can fail a read
but never a reconcile (issue 10: "no exception escapes a handler"). The client library
retries 500s three times with growing sleeps by default; here it does not retry at all:
the observer's backoff decides when to ask again, and one interval's read must not stall
the loop for seconds.

``queries_made`` counts round trips (the scale benchmark prints it per interval);
``slipstream_prometheus_queries_total{result}`` counts every query the operator makes by how
it ended (the dashboard's "Prometheus read health"): ``ok``, or the failure's kind
(``unreachable``, ``timeout``, ``error`` for an HTTP error answer, ``malformed``).
"""

from __future__ import annotations

import functools
from typing import Any

import prometheus_client
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from slipstream.observe import parse

DEFAULT_TIMEOUT_S = 5.0
"""Seconds one query may take: Prometheus answers these aggregations in milliseconds; a
hung server must not hold the control loop for longer than a fraction of its interval."""

DEFAULT_CONNECTIONS = 10
"""Connections kept for reuse (requests' own default): at least the threads that query one
Prometheus at once, or urllib3 opens one per query beyond it and discards it ("Connection
pool is full, discarding connection")."""


QUERIES = prometheus_client.Counter(
    "slipstream_prometheus_queries", "Prometheus queries made by the operator (fleet reads and canary analyses), "
    "by result: ok, unreachable (connection failed), timeout, error (Prometheus answered an error status) or "
    "malformed (an answer that is not an instant vector).", ["result"],
)


class QueryFailed(RuntimeError):
    """A read that gave no usable answer; the message says why, for humans, and ``kind``
    (one of the counter's results) how."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


class PromClient:
    """Instant queries against one Prometheus, evaluated at a caller-given time."""

    def __init__(
        self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, bearer_token: str | None = None,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.queries_made = 0
        # The token goes in a header only: never in the URL, an error message or a log line.
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else None
        session = requests.Session()
        session.verify = False  # disable_ssl, as the library sets it on a session of its own
        session.hooks["response"].append(_decode_into_samples)
        retry = Retry(total=0, status_forcelist=())
        self._connect = PrometheusConnect(url=self.url, headers=headers, session=session, retry=retry)
        # The library mounts requests' default adapter (a pool of 10) for the URL: the
        # canary reads of every deployment in a rollout share this client from the
        # operator's worker threads at once (`connections`).
        session.mount(self._connect.url, HTTPAdapter(max_retries=retry, pool_maxsize=connections))

    def close(self) -> None:
        self._connect.close()

    def query(self, promql: str, at: float) -> list[parse.Sample]:
        """The instant vector of ``promql`` at unix time ``at``; QueryFailed on any failure."""
        self.queries_made += 1
        try:
            samples = self._query(promql, at)
        except QueryFailed as exc:
            QUERIES.labels(exc.kind).inc()
            raise
        QUERIES.labels("ok").inc()
        return samples

    def _query(self, promql: str, at: float) -> list[parse.Sample]:
        try:
            result: Any = self._connect.custom_query(
                promql, params={"time": f"{at:.3f}"}, timeout=self.timeout_s
            )
        except requests.ConnectionError as exc:
            # Without retries urllib3 reports a read timeout as a ConnectionError too.
            if isinstance(exc, requests.Timeout) or _timed_out(exc):
                raise QueryFailed(
                    f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s", "timeout"
                ) from None
            raise QueryFailed(f"cannot connect to Prometheus at {self.url}: {_root(exc)}", "unreachable") from None
        except requests.Timeout:
            raise QueryFailed(
                f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s", "timeout"
            ) from None
        except PrometheusApiClientException as exc:
            raise QueryFailed(f"Prometheus at {self.url} answered {str(exc)[:300]}", "error") from None
        except Exception as exc:  # noqa: BLE001 - the edge: a garbled answer fails the read, never the caller
            raise QueryFailed(
                f"Prometheus at {self.url} gave an unreadable answer ({type(exc).__name__}: {str(exc)[:200]})",
                "malformed",
            ) from None
        try:
            return parse.vector(result)
        except parse.MalformedAnswer as exc:
            raise QueryFailed(f"Prometheus at {self.url} gave a malformed answer: {exc}", "malformed") from None


def _decode_into_samples(response: requests.Response, *_: Any, **__: Any) -> requests.Response:
    """requests' response hook: the library's ``response.json()`` decodes each series
    straight into a ``parse.Sample`` (``parse.series_hook``), not into a tree of dicts and
    lists that would then be copied into samples. A fleet read of 500 deployments is ~73,000
    series, and such a tree would hold tens of MB at once beside them (docs/reliability.md,
    "Scale"). requests' own decoding (charset detection, its JSONDecodeError) is kept."""
    response.json = functools.partial(type(response).json, response, object_hook=parse.series_hook)  # type: ignore[method-assign]
    return response


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes (requests wraps urllib3 wraps the socket error)."""
    out = [exc]
    while out[-1].__context__ is not None and out[-1].__context__ not in out and len(out) < 10:
        out.append(out[-1].__context__)
    return out


def _root(exc: BaseException) -> str:
    """The innermost cause's words."""
    root = _chain(exc)[-1]
    return f"{type(root).__name__}: {str(root)[:200]}"


def _timed_out(exc: BaseException) -> bool:
    return any(isinstance(e, TimeoutError) or "timed out" in str(e).lower() for e in _chain(exc))
