"""Twin time for a server that runs in wall time: ``twin = (wall - start) * time_scale``.

The clock is injected (``wall``) so tests can drive it; the server reads it on every
arrival and every pump tick, and turns twin deadlines back into wall sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Clock:
    """Twin seconds since the server started; ``time_scale`` twin seconds per wall second."""

    def __init__(self, time_scale: float = 1.0, wall: Callable[[], float] = time.monotonic) -> None:
        if not time_scale > 0:
            raise ValueError(f"time scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        self._wall = wall
        self._start = wall()

    def now(self) -> float:
        return (self._wall() - self._start) * self.time_scale

    def wall_until(self, twin_s: float) -> float:
        """Wall seconds from now until the twin clock reads ``twin_s`` (0 if past)."""
        return max(0.0, (twin_s - self.now()) / self.time_scale)
