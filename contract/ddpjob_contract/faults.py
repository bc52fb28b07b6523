"""Fault injection for crash-safety tests: exit abruptly at a named point, like a SIGKILL would.

``DDPJOB_FAULTS=pod-created:2`` makes the operator process exit with 137 right after its second
pod creation. Unset (always, in production) it costs one dict lookup.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

ENV = "DDPJOB_FAULTS"
EXIT_CODE = 137

_hits: Counter[str] = Counter()
_lock = threading.Lock()


def _armed() -> dict[str, int]:
    armed = {}
    for item in os.environ.get(ENV, "").split(","):
        point, _, count = item.partition(":")
        if point and count.isdigit():
            armed[point.strip()] = int(count)
    return armed


def point(name: str) -> None:
    """Mark that the operator passed ``name``; exits the process when a fault is armed there."""
    armed = _armed()
    if name not in armed:
        return
    with _lock:
        _hits[name] += 1
        if _hits[name] >= armed[name]:
            os._exit(EXIT_CODE)
