"""The operator bounds glibc's malloc arenas before its threads start (controller.runtime.malloc):
threads allocating at once share the bounded arenas instead of growing one each."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import weakref

import pytest

from slipstream.controller import settings as settings_
from slipstream.controller.runtime import malloc

THREADS_ALLOCATING = """
import ctypes, sys, threading
from slipstream.controller.runtime import malloc
applied = malloc.limit_arenas(int(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
barrier = threading.Barrier(8)
def work():
    barrier.wait()  # all eight allocate at once: each would take an arena of its own
    blocks = [libc.malloc(4096) for _ in range(2000)]
    barrier.wait()
    for b in blocks:
        libc.free(b)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(applied, flush=True)
libc.malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


def arenas_used(limit: int) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", THREADS_ALLOCATING, str(limit)], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return done.stdout.strip(), sum(line.startswith("Arena ") for line in done.stderr.splitlines())


def test_eight_threads_allocating_at_once_share_the_two_arenas() -> None:
    applied, bounded = arenas_used(2)
    assert applied == "True" and bounded <= 2, (applied, bounded)
    untouched, default = arenas_used(0)
    assert untouched == "False" and default > 2, f"without the bound the threads take {default} arenas"


def test_the_operator_bounds_them_to_two_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_.ControllerSettings().malloc_arenas == 2
    monkeypatch.setenv("SLIPSTREAM_MALLOC_ARENAS", "0")
    assert settings_.ControllerSettings.from_env().malloc_arenas == 0
    assert malloc.limit_arenas(0) is False, "0 leaves glibc's setting alone"


MMAP_AFTER_A_LARGE_FREE = """
import ctypes, sys
from slipstream.controller.runtime import malloc
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = MallInfo2
applied = malloc.fix_mmap_threshold(int(sys.argv[1]))
libc.free(libc.malloc(8 << 20))  # a freed 8 MB block: glibc's dynamic threshold rises to 8 MB
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)     # a 1 MB block after it (a fleet read's next response body)
print(applied, libc.mallinfo2().hblks - before, flush=True)
"""


def mmapped_blocks_after_a_large_free(threshold: int) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", MMAP_AFTER_A_LARGE_FREE, str(threshold)], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    applied, blocks = done.stdout.split()
    return applied, int(blocks)


def test_with_the_threshold_fixed_a_large_block_gets_pages_it_gives_back() -> None:
    """After a freed 8 MB block, glibc's own threshold puts a 1 MB block in the heap (which
    keeps the space when it is freed); fixed at 128 KiB, the block gets pages of its own."""
    assert mmapped_blocks_after_a_large_free(0) == ("False", 0)
    assert mmapped_blocks_after_a_large_free(128 << 10) == ("True", 1)
    assert settings_.ControllerSettings().malloc_mmap_threshold_bytes == 128 << 10


def test_cycles_are_collected_on_the_schedule_with_pythons_own_collector_off() -> None:
    class Connection:  # a closed TLS connection: transport and protocol point at each other
        pass

    a, b = Connection(), Connection()
    a.peer, b.peer = b, a  # type: ignore[attr-defined]
    gone = weakref.ref(a)
    del a, b
    stop = threading.Event()
    gc.disable()
    try:
        assert malloc.collect_cycles_every(0, stop) is None
        assert gone() is not None  # a cycle: reference counting alone never frees it
        thread = malloc.collect_cycles_every(0.01, stop)
        deadline = time.monotonic() + 10
        while gone() is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the collection, with a deadline
        assert gone() is None, "the scheduled collection freed the cycle"
    finally:
        stop.set()
        gc.enable()
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()


FREED_BETWEEN_LIVE = """
import sys
from slipstream.controller.runtime import malloc
malloc.configure(2, 128 << 10)  # as the operator starts
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024
blocks, live, big, small = [], [], int(sys.argv[2]), int(sys.argv[3])  # sizes from argv: never constants
for i in range(4000):
    blocks.append(b"x" * big)  # a burst of bodies: glibc's heap (over 512 B, under the mmap threshold)
    if i % 8 == 0:
        live.append(b"y" * small)  # what outlives the burst, between its blocks
del blocks
freed = rss_mb()
trimmed = malloc.trim() if sys.argv[1] == "trim" else False
print(freed, rss_mb(), trimmed)
"""


def rss_after_a_freed_burst(trim: bool) -> tuple[int, int, str]:
    done = subprocess.run([sys.executable, "-c", FREED_BETWEEN_LIVE, "trim" if trim else "keep", "20000", "600"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    freed, after, trimmed = done.stdout.split()
    return int(freed), int(after), trimmed


def test_a_trim_gives_back_the_pages_a_freed_burst_left_between_live_blocks() -> None:
    """80 MB of 20 kB blocks freed between small blocks that live on stay resident (glibc
    gives back only the top of a heap); `malloc.trim`, which the scheduled collection calls,
    gives them back."""
    freed, after, trimmed = rss_after_a_freed_burst(trim=False)
    assert freed >= 70 and after >= 70 and trimmed == "False", "freed but still resident"
    freed, after, trimmed = rss_after_a_freed_burst(trim=True)
    assert freed >= 70 and trimmed == "True" and after <= freed - 60, (freed, after)


def test_the_scheduled_collection_trims(monkeypatch: pytest.MonkeyPatch) -> None:
    trims = threading.Event()
    monkeypatch.setattr(malloc, "trim", lambda: trims.set() or True)
    stop = threading.Event()
    thread = malloc.collect_cycles_every(0.01, stop)
    try:
        assert trims.wait(10), "the collection thread trimmed"
    finally:
        stop.set()
    assert thread is not None
    thread.join(5)
