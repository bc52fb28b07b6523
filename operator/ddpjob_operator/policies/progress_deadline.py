"""spec.progressDeadlineSeconds: no rank advanced its step for that long -> restart the gang (NoProgress).

The clock starts when every rank has joined the process group (the job became Running) and
restarts whenever a poll sees the step advance. It is judged by the time of the poll that
observed the job, not by the reconcile's clock: without fresh polls there is no evidence, and
nothing happens.
"""

from __future__ import annotations

from datetime import datetime


def seconds_left(
    deadline_seconds: int | None, *, running_since: datetime | None, last_progress: datetime | None, observed: datetime
) -> float | None:
    """None when there is no deadline or the job is not running yet; <= 0 once it has passed."""
    if deadline_seconds is None or running_since is None:
        return None
    start = max(running_since, last_progress) if last_progress else running_since
    return deadline_seconds - (observed - start).total_seconds()


def exceeded(
    deadline_seconds: int | None, *, running_since: datetime | None, last_progress: datetime | None, observed: datetime
) -> bool:
    left = seconds_left(deadline_seconds, running_since=running_since, last_progress=last_progress, observed=observed)
    return left is not None and left <= 0
