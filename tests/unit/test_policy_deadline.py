"""activeDeadlineSeconds, counted from startTime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ddpjob_operator.policies.deadline import exceeded, seconds_left

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("start", "deadline", "elapsed", "left", "over"),
    [
        (T0, None, 10**6, None, False),  # no deadline
        (None, 60, 10**6, None, False),  # not started (or suspended)
        (T0, 60, 0, 60.0, False),
        (T0, 60, 59.5, 0.5, False),
        (T0, 60, 60, 0.0, True),
        (T0, 60, 61, -1.0, True),
    ],
)
def test_the_deadline_passes_when_the_elapsed_time_reaches_it(
    start: datetime | None, deadline: int | None, elapsed: float, left: float | None, over: bool
) -> None:
    now = T0 + timedelta(seconds=elapsed)
    assert seconds_left(start, deadline, now) == left
    assert exceeded(start, deadline, now) is over
