"""Reads from the apiserver without kubectl: GET a path, get parsed JSON.

The engine-pod runner, the load's target list and the demo's status line poll
the apiserver every fraction of a second; a kubectl process per read would cost
more CPU than the rest of the loop on a two-core machine. Credentials come from
a Cluster's own admin certificate or from a kubeconfig this package wrote (for
a demo that reuses a running ``slipstream cluster up``).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT_S = 5.0
"""Per-request timeout: reads of a local apiserver take milliseconds."""


class ApiReader:
    """GET-only JSON client for one apiserver."""

    def __init__(self, server: str, context: ssl.SSLContext, token: str | None = None) -> None:
        self.server = server
        self._context = context
        self._token = token

    def get_json(self, path: str, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        """GET ``path`` (e.g. ``/api/v1/pods``); raises urllib.error.HTTPError on 4xx/5xx."""
        request = urllib.request.Request(f"{self.server}{path}")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(request, timeout=timeout_s, context=self._context) as response:
            return json.load(response)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> ApiReader:
        """A reader with the current user of a kubeconfig written by localkube.kubeconfig."""
        config = json.loads(path.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        context = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
        if "client-certificate-data" in user:
            # ssl loads a client key only from files: a private temporary directory,
            # removed as soon as the context holds the key.
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp) / "client.crt", Path(tmp) / "client.key"
                for target, field in ((cert, "client-certificate-data"), (key, "client-key-data")):
                    target.write_bytes(base64.b64decode(user[field]))
                    os.chmod(target, 0o600)
                context.load_cert_chain(str(cert), str(key))
        return cls(cluster["server"], context, user.get("token"))
