"""Bound glibc's malloc arenas before the operator starts its threads.

glibc gives threads their own arenas, up to 8 per core, and an arena keeps the memory its
threads freed for its own later use: the operator's 32 worker threads (Kubernetes and
Prometheus calls, each fleet read parsing megabytes of JSON) each grew one. In the scale
benchmark at 100 deployments, 196 MB of the operator's 453 MB RSS were such thread arenas
while Python's live objects were 55 MB (tracemalloc), docs/reliability.md "Scale". Two
arenas shared by all threads keep what one thread freed for the next; the threads wait on an
arena lock only while they allocate, which under the GIL they rarely do at once. The same
knob as the MALLOC_ARENA_MAX environment variable, set here so that every way of starting
the operator (chart, `slipstream run`, tests) gets it.
"""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8
"""mallopt's parameter number for the arena limit (glibc malloc.h)."""


def limit_arenas(arenas: int) -> bool:
    """Allow at most `arenas` malloc arenas (0: glibc's default). True when applied; False
    where the C library has no mallopt (musl, macOS) or refused it."""
    if arenas <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
