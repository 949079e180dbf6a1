"""The cluster tier: a real kube-apiserver (with etcd, controller manager and scheduler)
and kwok-simulated GPU nodes on which the pods of Deployments become Running and Ready.

The `cluster` fixture is session-scoped: start-up costs ~7-15 s, so every
test shares one control plane and isolates itself by namespace or name.
Missing binaries FAIL the tier instead of skipping it, because a skipped tier
reads as green in CI while testing nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from slipstream import localkube

T = TypeVar("T")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[localkube.Cluster]:
    """A running local control plane, stopped at the end of the session."""
    workdir = tmp_path_factory.mktemp("localkube")
    missing: str | None = None
    try:
        started = localkube.Cluster.start(workdir)
    except localkube.BinariesMissingError as exc:
        missing = str(exc)
    if missing is not None:
        # Outside the except block, so the report is this one line, not a chain.
        pytest.fail(missing, pytrace=False)
    with started:
        yield started


def eventually(check: Callable[[], T], *, deadline_s: float, what: str) -> T:
    """Call ``check`` until it returns without AssertionError, or fail at the deadline.

    For state that controllers reach asynchronously (garbage collection, RBAC
    caches): polling with a deadline passes as soon as the state is reached.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return check()
        except AssertionError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not reached within {deadline_s:.0f}s: {exc}"
                ) from exc
        time.sleep(0.25)


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line contains ``text``.

    Reads /proc directly: each component's command line names its workdir, so
    this finds leftovers of one cluster without psutil.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found
