"""The engine Deployments as the drift watch last saw them, for the status refresh.

The refresh reads each engine Deployment every 30 s (status_interval_seconds) for its
readiness and for who else writes its replicas. One GET per ServingDeployment per refresh
would be the largest item of the operator's apiserver requests in a large fleet, though the
drift watch (`kopf.on.event` on the managed Deployments) already receives every change of
them. Each event's body, trimmed
to what the refresh reads (generation, spec.replicas, status, and the managedFields entries
that own spec.replicas), is kept here by namespace and name.

A view is trusted for `max_age_s` after the event (or GET) that brought it: a watch can
miss an event (a Deployment whose managed-by label someone removed leaves the watch without
a DELETED event), so an old view is read again with a GET, as is one never seen (the watch
not listed yet) or deleted, and the GET's answer is the view for the next `max_age_s` (a
steady Deployment sends no events: without this it would be read every refresh). An answer
is kept only if no event came while it was asked for: an answer read before an event and
stored after it would put an older state back.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any


def trimmed(body: dict[str, Any]) -> dict[str, Any]:
    """What `status.with_readiness`, `status.readiness_patch` and `replicas.writers` read."""
    meta = body.get("metadata") or {}
    owners = [
        {k: entry[k] for k in ("manager", "operation", "subresource") if k in entry}
        | {"fieldsV1": {"f:spec": {"f:replicas": {}}}}
        for entry in meta.get("managedFields") or []
        if isinstance((entry.get("fieldsV1") or {}).get("f:spec"), dict) and "f:replicas" in entry["fieldsV1"]["f:spec"]
    ]
    out: dict[str, Any] = {
        "metadata": {k: meta[k] for k in ("name", "namespace", "generation", "resourceVersion") if k in meta}
        | {"managedFields": owners},
        "status": copy.deepcopy(body.get("status") or {}),
    }
    if "replicas" in (body.get("spec") or {}):
        out["spec"] = {"replicas": body["spec"]["replicas"]}
    return out


@dataclass
class Views:
    """namespace/name -> (monotonic seconds of the event, the trimmed Deployment)."""

    max_age_s: float
    """Longest a view is used without a newer event (settings.status_watch_seconds)."""
    views: dict[tuple[str, str], tuple[float, dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def seen(self, body: dict[str, Any], event: str | None, now: float) -> None:
        """Record a watch event (None: the initial listing; ADDED, MODIFIED, DELETED)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        with self.lock:
            if event == "DELETED":
                self.views.pop(key, None)
            else:
                self.views[key] = (now, trimmed(body))

    def answered(self, namespace: str, name: str, body: dict[str, Any] | None, asked_at: float) -> None:
        """Keep a GET's answer (None: not found) asked at `asked_at`, unless an event came
        since (the watch's view is then at least as new)."""
        key = (namespace, name)
        with self.lock:
            found = self.views.get(key)
            if found is not None and found[0] >= asked_at:
                return
            if body is None:
                self.views.pop(key, None)
            else:
                self.views[key] = (asked_at, trimmed(body))

    def get(self, namespace: str, name: str, now: float) -> dict[str, Any] | None:
        """The watch's view of this Deployment if younger than max_age_s, else None (GET it)."""
        with self.lock:
            found = self.views.get((namespace, name))
        if found is None or not 0 <= now - found[0] < self.max_age_s:
            return None
        return copy.deepcopy(found[1])
