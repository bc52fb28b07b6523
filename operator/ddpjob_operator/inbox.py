"""Calls from the watch threads onto the event loop, in the order posted, with one wake-up of the loop per batch.

Each ``loop.call_soon_threadsafe`` writes a byte to the loop's self-pipe, and the loop then turns once (a select, the
byte read back, the call). Under load the watches' events come faster than the loop turns: those that arrive while a
batch is waiting join it, and the loop wakes once for all of them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable

log = logging.getLogger("ddpjob_operator")


class Inbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()

    def post(self, call: Callable[[], None]) -> None:
        """From any thread: ``call()`` on the loop, after every call posted before it."""
        with self._lock:
            self._calls.append(call)
            if len(self._calls) > 1:
                return  # a batch is waiting for the loop already, which runs this call with it
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._calls:
                    return
                call = self._calls.popleft()
            try:
                call()
            except Exception:  # a bug in one call must not leave the others waiting forever
                log.exception("a call from a watch thread failed")
