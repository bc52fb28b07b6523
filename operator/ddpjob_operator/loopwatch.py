"""A thread that watches the event loop: a loop that stops answering stops every job at once, and says nothing.

Every job's worker, the watches' events and the work queue's WARNINGs all run on the one asyncio loop. Were it
blocked, each job would keep the status it had, with no line in the log: the silent stall of a queued job that
issue 42 saw. ``LoopWatch`` asks the loop to answer every ``interval`` seconds from a thread of its own; when it
has not answered for ``limit`` seconds, it logs a WARNING with what the loop's thread is doing (its stack), and
once more when the loop answers again, with how long it was away.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("ddpjob_operator")


class LoopWatch:
    """Made on the loop's own thread (it records which thread that is)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, interval: float = 5.0, limit: float = 30.0) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.interval, self.limit = interval, limit
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loop-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            answered = threading.Event()
            asked = time.monotonic()
            try:
                self._loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop is closed: the operator is stopping
                return
            if answered.wait(self.limit):
                continue
            log.warning("the event loop has not answered for %.0f s: no job is reconciled meanwhile; its thread is "
                        "at:\n%s", self.limit, self._loop_stack())  # fmt: skip
            while not answered.wait(self.interval):
                if self._stopped.is_set():
                    return
            log.warning("the event loop answers again, after %.1f s", time.monotonic() - asked)

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(its thread has ended)"
