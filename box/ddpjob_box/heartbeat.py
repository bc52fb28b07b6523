"""Progress lines for a long call made in this process, such as starting the box: its elapsed time every
PROGRESS_EVERY seconds, so a log never sits still for minutes."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from ddpjob_box.step_report import PROGRESS_EVERY, progress_line


def _nothing() -> str:
    return ""


@contextlib.contextmanager
def heartbeat(
    step: str, figure: Callable[[], str] = _nothing, *, out: TextIO = sys.stdout, every: float = PROGRESS_EVERY
) -> Iterator[None]:
    """While the body runs, print ``step: 1m10s, <figure>`` every ``every`` seconds (none for a short body)."""
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            print(progress_line(step, time.monotonic() - started, figure()), file=out, flush=True)

    thread = threading.Thread(target=beat, name=f"heartbeat-{step}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
