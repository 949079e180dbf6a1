"""Kubeconfig files: admin (client certificate) and service-account (token).

Certificate data is embedded rather than referenced by path so a kubeconfig
can be handed to another process (the operator under test, helm) on its own.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

CLUSTER_NAME = "localkube"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write(
    path: Path,
    *,
    server: str,
    ca_pem: bytes,
    user: str,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> Path:
    """Write a single-context kubeconfig for ``user`` and return its path."""
    credentials: dict[str, str] = {}
    if client_cert_pem is not None and client_key_pem is not None:
        credentials["client-certificate-data"] = _b64(client_cert_pem)
        credentials["client-key-data"] = _b64(client_key_pem)
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {
                "name": user,
                "context": {"cluster": CLUSTER_NAME, "user": user, "namespace": namespace},
            }
        ],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # JSON is valid YAML: kubectl, helm and client libraries all read it.
    path.write_text(json.dumps(config, indent=2) + "\n")
    # Credentials inside: readable by the owner only.
    path.chmod(0o600)
    return path
