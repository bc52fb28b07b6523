"""ttlSecondsAfterFinished: the finished job is deleted this long after its completionTime."""

from __future__ import annotations

from datetime import datetime


def seconds_left(completion: datetime | None, ttl_seconds: int | None, now: datetime) -> float | None:
    """None when the job keeps forever (no TTL) or has not finished; <= 0 once it is due."""
    if ttl_seconds is None or completion is None:
        return None
    return ttl_seconds - (now - completion).total_seconds()


def expired(completion: datetime | None, ttl_seconds: int | None, now: datetime) -> bool:
    left = seconds_left(completion, ttl_seconds, now)
    return left is not None and left <= 0
