"""ttlSecondsAfterFinished: the finished job is deleted this long after its completionTime."""

from __future__ import annotations

from datetime import datetime

from ddpjob_operator import times


def seconds_left(completion: datetime | None, ttl_seconds: int | None, now: datetime) -> float | None:
    """None when the job keeps forever (no TTL) or has not finished; <= 0 once it is due."""
    return times.seconds_left(completion, ttl_seconds, now)


def expired(completion: datetime | None, ttl_seconds: int | None, now: datetime) -> bool:
    left = seconds_left(completion, ttl_seconds, now)
    return left is not None and left <= 0
