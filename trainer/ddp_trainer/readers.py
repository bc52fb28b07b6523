"""Who reads a rank's /metrics, so that the end of a run waits for them to read its final values.

A Prometheus scrapes on its own interval (the chart's PodMonitor: 15 s; the box's: 2 s), so a rank that exits
right after its last step leaves its final counts unread. A fixed ``--metrics-linger-seconds`` is either too short
for a slow interval or longer than a fast one needs. So each rank remembers its readers (address and User-Agent)
and, after its last step, lingers until every one of them has read again, or until a first one reads if none has
yet, and never longer than the linger. The operator's polls are not waited for
(``ddpjob_contract.metrics.POLLER_USER_AGENT``): it reads the run's end from the exit message.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ddpjob_contract.metrics import POLLER_USER_AGENT

Reader = tuple[str, str]
"""A reader of /metrics: its address and its User-Agent (a Prometheus pair's two replicas are two readers)."""


@dataclass(frozen=True)
class Linger:
    """How a linger ended: the readers that read the final values, those that did not come back, and when."""

    came_back: int
    missing: int
    seconds: float

    def line(self) -> str:
        if self.missing:
            return f"metrics: {self.missing} reader(s) did not read the final values in {self.seconds:.1f}s"
        return f"metrics: final values read by {self.came_back} reader(s) after {self.seconds:.1f}s"


class Readers:
    """The readers of one rank's /metrics; ``read`` is called from the server's threads."""

    def __init__(self) -> None:
        self._last: dict[Reader, float] = {}
        self._changed = threading.Condition()

    def read(self, address: str, agent: str) -> None:
        if agent.startswith(POLLER_USER_AGENT):
            return
        with self._changed:
            self._last[(address, agent)] = time.monotonic()
            self._changed.notify_all()

    def linger(self, limit: float) -> Linger:
        """Wait until every reader so far has read again (a first reader, when there was none), at most ``limit``
        seconds."""
        start = time.monotonic()
        with self._changed:
            expected = set(self._last)

            def back() -> set[Reader]:
                return {reader for reader, at in self._last.items() if at > start}

            self._changed.wait_for(lambda: expected <= back() if expected else bool(back()), timeout=limit)
            came = back()
        if expected:
            return Linger(len(expected & came), len(expected - came), time.monotonic() - start)
        return Linger(len(came), 0 if came else 1, time.monotonic() - start)
