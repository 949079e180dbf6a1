"""A loopback pod CIDR of its own for each running cluster.

kwok hands pod IPs out of ``--cidr``. With a range inside 127.0.0.0/8 every pod
IP is a loopback address this machine can bind, so a simulated engine can
listen on its pod's own IP and port and traffic to ``podIP:port`` really flows,
without leaving the machine. Two clusters on one machine (a developer's
``slipstream cluster up`` and a test run) must never hand out the same pod IP,
or their engine simulators would fight over ``IP:port``: each cluster leases
one ``127.N.0.0/16`` (N in 1..254; 127.0.0.0/16 is left to the components,
which listen on 127.0.0.1) by holding an exclusive ``flock`` on the file
``N.lock`` in a directory shared by every user of the machine. The kernel
drops the lock when the holder exits, however it exits, so a crashed run never
leaks its range.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

FIRST_OCTET = 1
LAST_OCTET = 254
"""Second octets leased out: 127.1.0.0/16 to 127.254.0.0/16."""

LOCK_DIR_ENV = "SLIPSTREAM_POD_CIDR_LOCK_DIR"
"""Overrides the lock directory (default: <tmp>/slipstream-pod-cidr)."""


class NoFreeCidrError(RuntimeError):
    """Every 127.N.0.0/16 is held by a running cluster."""


class PodCidrLease:
    """An exclusive hold on ``127.N.0.0/16`` until release() or process exit."""

    def __init__(self, octet: int, fd: int, path: Path) -> None:
        self.octet = octet
        self._fd: int | None = fd
        self.path = path

    @property
    def cidr(self) -> str:
        """The range kwok's ``--cidr`` gets, e.g. ``127.1.0.0/16``."""
        return f"127.{self.octet}.0.0/16"

    def contains(self, ip: str) -> bool:
        """True when ``ip`` lies in this lease's range."""
        return ip.startswith(f"127.{self.octet}.")

    def release(self) -> None:
        """Give the range back; safe to call more than once."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def lock_dir() -> Path:
    override = os.environ.get(LOCK_DIR_ENV)
    return Path(override) if override else Path(tempfile.gettempdir()) / "slipstream-pod-cidr"


def lease(directory: Path | None = None) -> PodCidrLease:
    """Take the first free ``127.N.0.0/16``; raise NoFreeCidrError when none is."""
    directory = directory if directory is not None else lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # shared by every user of the machine
        directory.chmod(0o1777)
    for octet in range(FIRST_OCTET, LAST_OCTET + 1):
        path = directory / f"{octet}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file, held or not: skip it
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        # Not inherited by the components: a leftover child must not keep the range.
        os.set_inheritable(fd, False)
        return PodCidrLease(octet, fd, path)
    raise NoFreeCidrError(
        f"all pod CIDRs 127.{FIRST_OCTET}-{LAST_OCTET}.0.0/16 are held by running clusters"
        f" (locks in {directory}); stop one with `slipstream cluster down`"
    )
