"""Bound glibc's malloc arenas before the operator starts its threads, fix its mmap
threshold, and collect Python's reference cycles on a schedule.

glibc gives threads their own arenas, up to 8 per core, and an arena keeps the memory its
threads freed for its own later use: the operator's 32 worker threads (Kubernetes and
Prometheus calls, each fleet read parsing megabytes of JSON) would each grow one, and
thread arenas would then hold far more of the RSS than Python's live objects do
(docs/reliability.md, "Scale"). Two arenas shared by all threads keep what one thread
freed for the next; the threads wait on an arena lock only while they allocate, which under
the GIL they rarely do at once. The same
knob as the MALLOC_ARENA_MAX environment variable, set here so that every way of starting
the operator (chart, `slipstream run`, tests) gets it.

The mmap threshold: a block of at least M_MMAP_THRESHOLD bytes gets pages of its own,
given back when it is freed. glibc starts at 128 KiB but raises the threshold to the size
of any such block freed (up to 32 MB), so after the first fleet read freed its ~10 MB
response body and text, the next reads' bodies came from the heap, which kept the space.
Setting it fixes it where it starts (and turns the adjustment off). In one process, four
fleet reads of 500 deployments peaked at 139 MB with glibc's dynamic threshold and 127 MB
with it fixed at 128 KiB (`scripts/bench-memory.py 500 --no-tuner --reads 4`).
"""

from __future__ import annotations

import ctypes
import gc
import threading

M_ARENA_MAX = -8
"""mallopt's parameter number for the arena limit (glibc malloc.h)."""
M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the mmap threshold (glibc malloc.h)."""


def _mallopt(param: int, value: int) -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(param, value))


def limit_arenas(arenas: int) -> bool:
    """Allow at most `arenas` malloc arenas (0: glibc's default). True when applied; False
    where the C library has no mallopt (musl, macOS) or refused it."""
    return arenas > 0 and _mallopt(M_ARENA_MAX, arenas)


def fix_mmap_threshold(size: int) -> bool:
    """Give blocks of at least `size` bytes pages of their own, for good (0: glibc's
    dynamic threshold). True when applied; False where there is no mallopt or it refused."""
    return size > 0 and _mallopt(M_MMAP_THRESHOLD, size)


def configure(arenas: int, mmap_threshold: int) -> None:
    """Both, as the operator's settings say (`ControllerSettings.malloc_*`)."""
    limit_arenas(arenas)
    fix_mmap_threshold(mmap_threshold)


def trim() -> bool:
    """Give the pages of glibc's free chunks back to the system (`malloc_trim(0)`), in every
    arena and not only at a heap's top. True when it gave any back; False also where the C
    library has none (musl, macOS).

    Python's blocks over 512 bytes (response bodies and the socket reads they are made of,
    large strings, the tables of large dicts and lists) and OpenSSL's buffers come from
    glibc. A burst of them freed leaves free chunks between live ones, which glibc keeps
    resident: only the free space at the top of a heap goes back by itself. What stays
    resident raises the floor the next burst adds to, and so the peak."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return bool(malloc_trim(0))


def collect_cycles_every(seconds: float, stop: threading.Event | None = None) -> threading.Thread | None:
    """Run a full collection of reference cycles every `seconds` on a daemon thread, then
    give glibc's free pages back (`trim`), until `stop` is set (None when `seconds` <= 0).
    Python collects its oldest generation only after the number of
    objects that outlived younger collections grew by a quarter of those already there; an
    operator holding ~400,000 objects for 500 deployments kept hundreds of closed TLS
    connections (cycles, each with its read buffer) alive between such collections."""
    if seconds <= 0:
        return None

    stopped = stop or threading.Event()

    def collect() -> None:
        while not stopped.wait(seconds):
            gc.collect()
            trim()  # what the collection freed in glibc's heaps, and the last burst's rest

    thread = threading.Thread(target=collect, name="slipstream-gc", daemon=True)
    thread.start()
    return thread
