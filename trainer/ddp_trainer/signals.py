"""Exit promptly on SIGTERM or SIGINT, leaving no partial checkpoint behind. Torch-free.

A Python signal handler only runs between bytecodes of the main thread, so a rank blocked in a
collective would not notice SIGTERM until the collective timed out. Instead the signals are
blocked in every thread and a watcher thread waits for them with ``sigwait``: it removes the
file being written, if any, and ends the process at once with 128 + the signal number.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_partial: set[str] = set()
_lock = threading.Lock()
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def partial_file(path: str) -> Iterator[None]:
    """Mark ``path`` as incomplete while the block writes it; a signal then removes it."""
    with _lock:
        _partial.add(path)
    try:
        yield
    finally:
        with _lock:
            _partial.discard(path)


def _discard_partial_files() -> None:
    with _lock:
        for path in _partial:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # renamed into place just now: complete, so nothing partial is left


def install() -> None:
    """Call first thing in the main thread: threads started later inherit the blocked mask."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)

    def watch() -> None:
        signum = signal.sigwait(SIGNALS)
        _discard_partial_files()
        sys.stderr.write(f"ddp_trainer: stopping on {signal.Signals(signum).name}\n")
        sys.stderr.flush()
        os._exit(128 + signum)

    threading.Thread(target=watch, name="ddp-trainer-signals", daemon=True).start()
