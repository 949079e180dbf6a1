"""The operator bounds glibc's malloc arenas before its threads start (controller.malloc):
threads allocating at once share the bounded arenas instead of growing one each."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slipstream.controller import malloc
from slipstream.controller import settings as settings_

THREADS_ALLOCATING = """
import ctypes, sys, threading
from slipstream.controller import malloc
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
