"""Timestamps as the API writes them (RFC 3339, UTC, whole seconds) and as the operator reads them."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any


def to_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API, as an aware datetime; None for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def from_unix(seconds: float | None) -> datetime | None:
    """A Unix time the ranks report (a checkpoint's save), to whole seconds as the API writes it; None for 0 or none
    (not known)."""
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=0) if seconds else None


def seconds_left(since: datetime | None, limit_seconds: float | None, now: datetime) -> float | None:
    """What is left of ``limit_seconds`` counted from ``since``: None without a limit or a start; <= 0 once up."""
    if limit_seconds is None or since is None:
        return None
    return limit_seconds - (now - since).total_seconds()


@functools.lru_cache(maxsize=4096)
def from_time(value: datetime | None) -> str | None:
    """Cached: each reconcile writes every condition's times again (strftime is slow), and they rarely change."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
