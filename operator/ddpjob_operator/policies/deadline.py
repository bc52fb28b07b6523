"""activeDeadlineSeconds: counted from status.startTime, which is set at start and again on resume."""

from __future__ import annotations

from datetime import datetime

from ddpjob_operator import times


def seconds_left(start: datetime | None, deadline_seconds: int | None, now: datetime) -> float | None:
    """None when there is no deadline (none set, or not started); <= 0 once it has passed."""
    return times.seconds_left(start, deadline_seconds, now)


def exceeded(start: datetime | None, deadline_seconds: int | None, now: datetime) -> bool:
    left = seconds_left(start, deadline_seconds, now)
    return left is not None and left <= 0
