"""Which owned objects the drift watch has already judged, so that an event which changed
none of their owned parts costs no apiserver read.

The drift watch (`kopf.on.event` on the engine Deployments and Services) judges an object
by reading its ServingDeployment and the object again, then comparing what the spec renders
with what is live (`drift.of_object`). Almost every event of a Deployment changes only its
status (readiness, replica counts), and the apply of hundreds of ServingDeployments brings
hundreds of such events within seconds, two GETs each on the blocking client's threads
(docs/reliability.md, "Scale").

So each judgement that ended well (nothing drifted, or reverted) records a digest of the
object's owned parts (`PARTS`: what `drift.of_object` compares, and the annotations) by the
object's uid, together with the state of its ServingDeployment it was judged against
(`JudgementKey`: the spec's generation, and whether spec.replicas is left to another writer — the
two things the desired object depends on). An event is skipped only when both still hold:
its owned parts digest to the recorded digest, and the ServingDeployment, as the watch on
ServingDeployments last saw it, is at the recorded key. A hand edit of the spec, a label or
an annotation changes the digest; a new spec (which reconcile applies itself) or a
contest taken back changes the key; either way the next event is judged. A failed judgement
records nothing, so the next event retries. The first event of an object (the listing at
start or after a watch restart, type None, or an unknown uid) is always judged, and a
DELETED event forgets the object, so the records stay bounded by live objects.

Pure, plain data: the handlers hold one `Judged` and call it from the event loop only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from slipstream.api import models
from slipstream.controller.watch import drift, replicas

PARTS = (*drift.WATCHED, "metadata.annotations")
"""The parts of an owned object whose change is judged: those `drift.of_object` compares,
and the annotations (the operator compares none today; a change of one is rare, and judging
it costs one read, where missing one that a later comparison covers would cost a revert)."""

NOISE = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
"""Annotations left out of the digest: kubectl's copy of what a client-side `kubectl apply`
sent. The owned fields it changed show in spec and labels; the copy is large and only adds
hashing."""

JudgementKey = tuple[int, bool]
"""What an owned object's desired form depends on, of its ServingDeployment: the spec's
generation, and whether spec.replicas is left to another writer (`replicas.contested`)."""


def owned_parts(obj: dict[str, Any]) -> dict[str, Any]:
    """The parts of `obj` in `PARTS` (absent ones as None), noise annotations removed."""
    out: dict[str, Any] = {}
    for part in PARTS:
        head, _, tail = part.partition(".")
        value = obj.get(head)
        if tail:
            value = value.get(tail) if isinstance(value, dict) else None
        out[part] = value
    annotations = out["metadata.annotations"]
    if isinstance(annotations, dict):
        out["metadata.annotations"] = {k: v for k, v in annotations.items() if k not in NOISE}
    return out


def digest(obj: dict[str, Any]) -> str:
    """A digest of `obj`'s owned parts, canonical JSON (keys sorted) under SHA-256."""
    text = json.dumps(owned_parts(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def owner_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the ServingDeployment that owns `obj`, or None."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("kind") == models.KIND), None)


def owner_key(sd: dict[str, Any]) -> JudgementKey:
    """The `JudgementKey` of a ServingDeployment body (as the watch or a GET gives it)."""
    generation = int((sd.get("metadata") or {}).get("generation") or 0)
    conditions = (sd.get("status") or {}).get("conditions") or []
    contested = any(c.get("type") == replicas.CONDITION and c.get("status") == "True" for c in conditions)
    return generation, contested


@dataclass(frozen=True)
class Record:
    """One judgement that ended well."""

    owner: str
    """The owning ServingDeployment's uid."""
    key: JudgementKey
    """The ServingDeployment's state the object was judged against."""
    digest: str
    """`digest` of the object as it was found matching (or as the revert left it)."""


@dataclass
class Judged:
    """Object uid -> its last good judgement; ServingDeployment uid -> its `JudgementKey` as last seen."""

    records: dict[str, Record] = field(default_factory=dict)
    owners: dict[str, JudgementKey] = field(default_factory=dict)

    def owner_seen(self, sd: dict[str, Any], event: str | None) -> None:
        """A watch event of a ServingDeployment (None: the listing; DELETED forgets it)."""
        uid = (sd.get("metadata") or {}).get("uid")
        if not uid:
            return
        if event == "DELETED":
            self.owners.pop(uid, None)
        else:
            self.owners[uid] = owner_key(sd)

    def unchanged(self, obj: dict[str, Any], event: str | None) -> bool:
        """Whether this event of an owned object can be skipped: judged well before, at the
        same owned parts, against the ServingDeployment's state the watch last saw. A
        listing (None), a deletion and an object never judged are never skipped."""
        if event not in ("MODIFIED", "ADDED"):
            return False
        record = self.records.get((obj.get("metadata") or {}).get("uid") or "")
        if record is None or owner_uid(obj) != record.owner:
            return False
        return self.owners.get(record.owner) == record.key and digest(obj) == record.digest

    def record(self, obj: dict[str, Any], sd: dict[str, Any]) -> None:
        """`obj` (the object as judged, or as the revert left it) matches what `sd` renders."""
        uid = (obj.get("metadata") or {}).get("uid")
        owner = (sd.get("metadata") or {}).get("uid")
        if uid and owner:
            self.records[uid] = Record(owner, owner_key(sd), digest(obj))

    def forget(self, obj: dict[str, Any]) -> None:
        """The object is gone (DELETED), or its judgement failed: judge its next event."""
        self.records.pop((obj.get("metadata") or {}).get("uid") or "", None)
