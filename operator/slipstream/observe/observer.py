"""One observation per control interval: the fleet's queries, then a snapshot per deployment.

The loop's named steps (the VPA recommender's shape): check the backoff, send the
``queries.fleet`` queries (one per metric family, all deployments together), assemble
(``assemble.snapshots``, pure). Any failed query fails the whole interval as
``PrometheusUnreachable`` for every deployment asked about: the answers are one picture
taken at one evaluation time, and half of it is not a smaller picture. The evaluation time
is the injected clock's ``now``, so tests with a fake clock get deterministic windows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from slipstream.api import snapshot as snap
from slipstream.observe import assemble, queries
from slipstream.observe.backoff import Backoff
from slipstream.observe.client import (
    DEFAULT_CONNECTIONS,
    DEFAULT_TIMEOUT_S,
    PromClient,
    QueryFailed,
)


@dataclass(frozen=True, slots=True)
class ObserveSettings:
    """How much data is read and what makes it usable."""

    window_s: float = 300.0
    """Seconds of history per snapshot: enough first tokens for a p99 at modest traffic."""
    min_samples: int = 50
    """First tokens needed in the window (all tenants): the tuner's guardrail default
    (``tune.guardrails``), so the two never disagree about "enough"."""
    max_staleness_s: float = 60.0
    """Oldest the newest engine sample may be: four 15 s scrapes (1 s scrapes in tests)."""
    query_timeout_s: float = DEFAULT_TIMEOUT_S
    """Seconds one query may take before the read counts as failed."""
    backoff_initial_s: float = 10.0
    """First wait after a failed read (see ``backoff.Backoff``)."""
    backoff_max_s: float = 300.0
    """Longest wait between reads of a failing Prometheus."""
    tenant_label: str = queries.TENANT_LABEL
    """The label naming the tenant (``spec.tuning.objective.tenantLabel``)."""
    connections: int = DEFAULT_CONNECTIONS
    """Connections to Prometheus kept for reuse: the threads that may query it at once."""

    def __post_init__(self) -> None:
        queries.check_label(self.tenant_label)
        if self.window_s <= 0 or self.min_samples < 0 or self.max_staleness_s <= 0:
            raise ValueError("window_s and max_staleness_s must be > 0 and min_samples >= 0")

    def rules(self, window_s: float | None = None, min_samples: int | None = None) -> assemble.Rules:
        return assemble.Rules(
            window_s=self.window_s if window_s is None else window_s,
            min_samples=self.min_samples if min_samples is None else min_samples,
            max_staleness_s=self.max_staleness_s,
        )


@dataclass(frozen=True, slots=True)
class FleetRead:
    """One interval's answers (or why there are none), turned into snapshots on demand."""

    at: float
    rules: assemble.Rules
    tenant_label: str
    results: dict[str, object] | None
    """``FleetQueries`` field -> its answer, ``assemble.reduce``d; None when the read failed."""
    failure: str
    """Why the read failed (the PrometheusUnreachable detail); empty when it did not."""

    def snapshots(self, names: Sequence[str] | None = None) -> dict[str, snap.WorkloadSnapshot]:
        """A snapshot per name (all deployments the answers mention when None)."""
        if self.results is None:
            return {n: snap.invalid(n, self.at, self.rules.window_s, snap.UNREACHABLE, self.failure)
                    for n in names or ()}
        return assemble.combine(self.results, now=self.at, rules=self.rules, deployments=names)


class Observer:
    """Reads Prometheus for every ServingDeployment at once; never raises on a bad read."""

    def __init__(
        self,
        url: str,
        settings: ObserveSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        bearer_token: str | None = None,
    ) -> None:
        self.settings = settings or ObserveSettings()
        self.client = PromClient(
            url, timeout_s=self.settings.query_timeout_s, bearer_token=bearer_token,
            connections=self.settings.connections,
        )
        self.clock = clock
        self.backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)

    @property
    def queries_made(self) -> int:
        """Round trips to Prometheus so far (the scale benchmark's figure)."""
        return self.client.queries_made

    def close(self) -> None:
        self.client.close()

    def read(
        self, deployments: Iterable[str] | None = None, *, at: float | None = None
    ) -> dict[str, snap.WorkloadSnapshot]:
        """A snapshot per deployment (``namespace/name``); all deployments seen when None.

        ``at`` evaluates at that unix time instead of the clock's now (a caller with its own
        clock). When the read failed, and with ``deployments`` None, the answer is empty.
        """
        names = None if deployments is None else list(deployments)
        for name in names or ():
            assemble.split_name(name)
        return self.fetch(at).snapshots(names)

    def fetch(self, at: float | None = None) -> FleetRead:
        """The fleet's queries (``queries.fleet_reads``) at ``at`` (default: now), or why
        there is no answer."""
        now = self.clock() if at is None else at
        rules = self.settings.rules()
        if self.backoff.waiting(now):
            return FleetRead(now, rules, self.settings.tenant_label, None, self._waiting_detail(now))
        results: dict[str, object] = {}
        tenant_label = self.settings.tenant_label
        try:
            for field, promql in queries.fleet_reads(rules.window_s, tenant_label):
                # Reduced at once: only one answer's samples are ever alive; a shard's joins
                # the field's others (disjoint by deployment).
                part = assemble.reduce(field, self.client.query(promql, now), tenant_label)
                results[field] = assemble.join(results[field], part) if field in results else part
        except QueryFailed as exc:
            return FleetRead(now, rules, self.settings.tenant_label, None, self._failed(now, str(exc)))
        self.backoff.succeeded()
        return FleetRead(now, rules, self.settings.tenant_label, results, "")

    def ttft_by_tenant(
        self,
        namespace: str,
        deployment: str,
        pods: Sequence[str],
        window_s: float | None = None,
        *,
        min_samples: int | None = None,
    ) -> snap.WorkloadSnapshot:
        """Per-tenant TTFT over a subset of one deployment's pods (canary vs baseline).

        One query. Valid: ``tenants[i].ttft_p99_s`` (and ``ttft_p50_s``, ``ttft.total``)
        per tenant over ``pods``; invalid: the reason (unreachable, no series, too few
        samples, not finite) as for ``read``.
        """
        rules = self.settings.rules(window_s, min_samples)
        promql = queries.pods_ttft(namespace, deployment, pods, rules.window_s, self.settings.tenant_label)
        name = assemble.deployment_name(namespace, deployment)
        now = self.clock()
        if self.backoff.waiting(now):
            return snap.invalid(name, now, rules.window_s, snap.UNREACHABLE, self._waiting_detail(now))
        try:
            samples = self.client.query(promql, now)
        except QueryFailed as exc:
            return snap.invalid(name, now, rules.window_s, snap.UNREACHABLE, self._failed(now, str(exc)))
        self.backoff.succeeded()
        return assemble.pod_group(
            samples, name=name, now=now, window_s=rules.window_s, min_samples=rules.min_samples,
            tenant_label=self.settings.tenant_label,
        )

    ttft_p99_by_tenant = ttft_by_tenant
    """The rollout's name for it: compare ``ttft_p99_s`` per tenant of canary and baseline."""

    def _failed(self, now: float, error: str) -> str:
        delay = self.backoff.failed(now, error)
        return f"{error}; next query in {delay:g} s (failure {self.backoff.failures} in a row)"

    def _waiting_detail(self, now: float) -> str:
        left = self.backoff.next_try_at - now
        return (f"{self.backoff.last_error}; backing off, next query in {left:.0f} s "
                f"(failure {self.backoff.failures} in a row)")

