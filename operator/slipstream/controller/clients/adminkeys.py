"""The engines' admin keys, without the operator reading Secrets it has no business with.

Two sources:

- `spec.engine.adminApiKeySecretRef`: the user's Secret, read with `get` where the chart
  grants it (`rbac.secretNamespaces`, or the watched namespace of a namespaced install);
  a refusal is a condition naming the fix, never a crash.
- otherwise a generated key, *derived*: HMAC-SHA256 of `namespace/name` under the
  operator's seed (one Secret in the operator's own namespace, made by the chart, readable
  by name only). The operator creates `<name>-admin-key` with it (create only: it never
  reads that Secret back, it recomputes the key), so it needs no `get` on Secrets in the
  deployments' namespaces at all. The same name gets the same key, so a ServingDeployment
  deleted and created again meets its old Secret (if not yet collected) with the same key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from slipstream.api import models
from slipstream.controller import settings as settings_
from slipstream.controller.clients import kube as kube_

SEED_KEY = "seed"


class KeyUnavailable(RuntimeError):
    """The key cannot be had; `reason` and the message (which names the fix) go to a condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def derive(seed: str, namespace: str, name: str) -> str:
    """The generated admin key of one ServingDeployment (48 hex digits)."""
    return hmac.new(seed.encode(), f"{namespace}/{name}".encode(), hashlib.sha256).hexdigest()[:48]


@dataclass
class AdminKeys:
    kube: kube_.Kube
    config: settings_.ControllerSettings
    _seed: str | None = field(default=None, repr=False)

    def seed(self) -> str:
        """Blocking. The operator's seed, read once (by name) and kept."""
        if self._seed is not None:
            return self._seed
        namespace, _, name = self.config.admin_seed_secret.partition("/")
        where = f"Secret {self.config.admin_seed_secret} (SLIPSTREAM_ADMIN_SEED_SECRET)"
        try:
            value = self.kube.secret_value(namespace, name, SEED_KEY)
        except kube_.ApiError as error:
            raise KeyUnavailable("AdminKeySeedUnavailable", f"{where} cannot be read: HTTP {error.status}: "
                                 "the chart's Role grants it; check the release") from error  # fmt: skip
        if not value:
            raise KeyUnavailable("AdminKeySeedUnavailable", f"{where} does not exist or has no key {SEED_KEY!r}: "
                                 "it comes with the chart (helm upgrade restores it)")  # fmt: skip
        self._seed = value
        return value

    def generated(self, sd: models.ServingDeployment) -> str:
        return derive(self.seed(), sd.metadata.namespace, sd.metadata.name)

    def key(self, sd: models.ServingDeployment) -> str:
        """Blocking. The key the engines of `sd` were given."""
        ref = sd.spec.engine.admin_api_key_secret_ref
        if ref is None:
            return self.generated(sd)
        try:
            value = self.kube.secret_value(sd.metadata.namespace, ref.name, ref.key)
        except kube_.ApiError as error:
            if error.status == 403:
                raise KeyUnavailable("AdminKeySecretForbidden", forbidden(sd, ref)) from error
            raise
        if value is None:
            raise KeyUnavailable("AdminKeySecretMissing", f"Secret {ref.name!r} or its key {ref.key!r} "
                                 "(spec.engine.adminApiKeySecretRef) is missing")  # fmt: skip
        return value


def forbidden(sd: models.ServingDeployment, ref: models.SecretKeyRef) -> str:
    ns = sd.metadata.namespace
    return (
        f"the operator may not read Secret {ref.name!r} (spec.engine.adminApiKeySecretRef) in namespace "
        f"{ns!r}: let it read that Secret (`helm upgrade ... --set rbac.secretNames={{{ref.name}}}`) or "
        f"Secrets there (`--set rbac.secretNamespaces={{{ns}}}`), or remove adminApiKeySecretRef and the "
        "operator generates and keeps the key itself"
    )

