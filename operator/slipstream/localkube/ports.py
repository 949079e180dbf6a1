"""Free loopback ports for the components.

Ports are picked by binding to 127.0.0.1:0 and closing the socket again, so a
cluster never collides with a fixed port of another run (parallel CI jobs, a
developer's own cluster). Another process can still take a port between the
close and the component's bind; the cluster retries start-up with new ports
when a component reports "address already in use".
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
"""The only address the components listen on: nothing is reachable from outside."""

ADDRESS_IN_USE = "address already in use"
"""What Go's net package says when a bind lost the race for its port."""


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports that were free on the loopback address."""
    sockets: list[socket.socket] = []
    try:
        # Hold every socket open until all are bound, so the kernel cannot hand
        # out the same port twice within one call.
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
