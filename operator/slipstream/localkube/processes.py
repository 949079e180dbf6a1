"""Start, watch and stop one control-plane component as a child process.

Each component runs in a session (and so a process group) of its own, its
output going to a log file in the cluster's workdir. Stopping signals the
whole group, SIGTERM first and SIGKILL after a grace period, and then waits
until the group is empty: a test run must leave no etcd or apiserver behind
holding ports and disk.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

TERM_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL; etcd and the apiserver shut down in ~1 s."""

KILL_WAIT_S = 5.0
"""Seconds to wait for the group to vanish after SIGKILL before giving up."""

LOG_TAIL_LINES = 40
"""Lines of a component's log quoted in a start-up error."""


class ComponentError(RuntimeError):
    """A component exited or did not become ready; the message ends with its log tail."""


class Component:
    """One running binary: its process, its log file, and how to stop it."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.argv = list(argv)
        self.env = env
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            # start_new_session: the component leads its own process group, so
            # stop() can signal it and anything it spawned in one call, and a
            # Ctrl-C in the terminal reaches only the test runner, which then
            # shuts the components down in order.
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )

    @property
    def pid(self) -> int:
        """Process id, which is also the process-group id."""
        return self._popen.pid

    def running(self) -> bool:
        """True while the process has not exited."""
        return self._popen.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the component's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ComponentError:
        """An error naming the component, what went wrong, and its log tail."""
        return ComponentError(
            f"{self.name} {what} (log: {self.log_path}); last lines:\n{self.log_tail()}"
        )

    def check_alive(self) -> None:
        """Raise with the log tail if the component has exited."""
        code = self._popen.poll()
        if code is not None:
            raise self.failure(f"exited with code {code}")

    def stop(self) -> None:
        """Terminate the process group, then kill it; return once it is gone."""
        pgid = self._popen.pid
        if not group_alive(pgid) and not self.running():
            self._popen.wait()
            return
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=TERM_GRACE_S)
        # The leader may be gone while something it spawned lives on in the
        # group; SIGKILL whatever is left either way.
        if group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
        self._popen.wait()
        deadline = time.monotonic() + KILL_WAIT_S
        while group_alive(pgid):
            if time.monotonic() > deadline:
                raise ComponentError(f"{self.name}: process group {pgid} survived SIGKILL")
            time.sleep(0.05)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
