"""activeDeadlineSeconds: counted from status.startTime, which is set at start and again on resume."""

from __future__ import annotations

from datetime import datetime

from ddpjob_contract.status import Reason
from ddpjob_operator import times
from ddpjob_operator.transitions import Finish, Transition
from ddpjob_operator.view import View


def seconds_left(start: datetime | None, deadline_seconds: int | None, now: datetime) -> float | None:
    """None when there is no deadline (none set, or not started); <= 0 once it has passed."""
    return times.seconds_left(start, deadline_seconds, now)


def exceeded(start: datetime | None, deadline_seconds: int | None, now: datetime) -> bool:
    left = seconds_left(start, deadline_seconds, now)
    return left is not None and left <= 0


def rule(v: View) -> Transition | None:
    limit = v.job.spec.run_policy.active_deadline_seconds
    if not exceeded(v.status.start_time, limit, v.now):
        return None
    return Finish(False, Reason.DEADLINE, f"ran longer than spec.runPolicy.activeDeadlineSeconds={limit}")
