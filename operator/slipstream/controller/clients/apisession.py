"""kopf's connections to the kube-apiserver, bounded.

kopf opens its aiohttp session with no connection limit. With hundreds of
ServingDeployments the status-refresh timers fire in waves (each deployment's every 30 s,
started within a minute of each other), and a wave of status patches would open hundreds
of TLS connections at once, each with a 256 KiB read buffer and OpenSSL's own, tens of MB
within seconds (docs/reliability.md, "Scale"). kopf lets a login handler hand it a
session of its own (``kopf.AiohttpSession``); this one is kopf's own, credentials and TLS
taken from the same ``ConnectionInfo``, with a connection limit. Requests beyond it wait
for a free connection, the watch streams included, so the limit must leave room beside them.
"""

from __future__ import annotations

import aiohttp
import kopf

MIN_CONNECTIONS = 8
"""Room for kopf's watch streams (one per watched resource and the peering object, each
holding its connection for good) and for requests beside them."""


def bounded(info: kopf.ConnectionInfo, limit: int) -> kopf.AiohttpSession:
    """kopf's session for `info` with at most `limit` connections (never fewer than
    MIN_CONNECTIONS). Call it in the event loop (kopf's login handler): aiohttp binds a
    session to the running loop."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(limit, MIN_CONNECTIONS), ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        priority=info.priority,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
    )
