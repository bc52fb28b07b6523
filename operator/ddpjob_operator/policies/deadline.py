"""activeDeadlineSeconds: counted from status.startTime, which is set at start and again on resume."""

from __future__ import annotations

from datetime import datetime


def seconds_left(start: datetime | None, deadline_seconds: int | None, now: datetime) -> float | None:
    """None when there is no deadline (none set, or not started); <= 0 once it has passed."""
    if deadline_seconds is None or start is None:
        return None
    return deadline_seconds - (now - start).total_seconds()


def exceeded(start: datetime | None, deadline_seconds: int | None, now: datetime) -> bool:
    left = seconds_left(start, deadline_seconds, now)
    return left is not None and left <= 0
