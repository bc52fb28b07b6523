"""ttlSecondsAfterFinished, counted from completionTime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ddpjob_operator.policies.ttl import expired, seconds_left

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("completion", "ttl", "elapsed", "left", "due"),
    [
        (T0, None, 10**6, None, False),  # kept forever
        (None, 0, 10**6, None, False),  # not finished
        (T0, 0, 0, 0.0, True),  # delete at once
        (T0, 30, 10, 20.0, False),
        (T0, 30, 30, 0.0, True),
    ],
)
def test_a_finished_job_is_due_for_deletion_after_its_ttl(
    completion: datetime | None, ttl: int | None, elapsed: float, left: float | None, due: bool
) -> None:
    now = T0 + timedelta(seconds=elapsed)
    assert seconds_left(completion, ttl, now) == left
    assert expired(completion, ttl, now) is due
