"""SIGTERM and SIGINT: save at the next step boundary when there is time, else exit at once. Torch-free.

A Python signal handler only runs between bytecodes of the main thread, so a rank blocked in a
collective would not notice SIGTERM until the collective timed out. Instead the signals are
blocked in every thread and a watcher thread waits for them with ``sigwait``.

Unarmed (no checkpoint directory), the watcher removes the file being written, if any, and ends the
process at once with 128 + the signal number. Armed (``arm``), it first asks the training loop to
stop: the loop agrees on one step with its peers, saves that step's checkpoint and exits with the
same code. The watcher ends the process as before if a second signal comes, or if the loop has not
exited by the deadline: a rank blocked in a collective, or a save too slow for the pod's grace period.
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
_deadline = [0.0]  # seconds from the first signal to the forced exit; 0: unarmed
_requested = threading.Event()
_signum = [0]
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


def deadline_for(grace_seconds: float) -> float:
    """How long a stop may take, out of the pod's grace period: a margin is kept for the exit itself and for
    the kubelet, so the forced exit (which removes partial files) comes before its SIGKILL (which cannot)."""
    return max(grace_seconds - min(5.0, grace_seconds / 4), 0.0)


def arm(grace_seconds: float) -> None:
    """From now on a first signal asks the loop to stop at a step boundary (``requested``); the process is
    ended anyway ``deadline_for(grace_seconds)`` seconds after it."""
    with _lock:
        _deadline[0] = deadline_for(grace_seconds)


def requested() -> bool:
    """Whether a signal asked this process to stop (read by the loop at each step boundary)."""
    return _requested.is_set()


def signal_name() -> str:
    """The name of the signal that asked us to stop ("SIGTERM"); empty before one came."""
    return signal.Signals(_signum[0]).name if _signum[0] else ""


def _stop_now(signum: int) -> None:
    _discard_partial_files()
    sys.stderr.write(f"ddp_trainer: stopping on {signal.Signals(signum).name}\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def install() -> None:
    """Call first thing in the main thread: threads started later inherit the blocked mask."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)

    def watch() -> None:
        signum = signal.sigwait(SIGNALS)
        _signum[0] = signum
        with _lock:
            deadline = _deadline[0]
        if deadline > 0:
            _requested.set()
            sys.stderr.write(
                f"ddp_trainer: {signal.Signals(signum).name}: saving a checkpoint at the next step boundary, then "
                f"stopping (within {deadline:.0f}s; a second signal stops at once)\n"
            )
            sys.stderr.flush()
            signal.sigtimedwait(SIGNALS, deadline)
        _stop_now(signum)

    threading.Thread(target=watch, name="ddp-trainer-signals", daemon=True).start()
