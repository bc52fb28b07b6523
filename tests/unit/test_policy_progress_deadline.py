"""spec.progressDeadlineSeconds: judged by the time of the poll, from Running or the last progress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ddpjob_operator.policies.progress_deadline import exceeded, seconds_left

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("deadline", "running_since", "last_progress", "observed", "left"),
    [
        (None, at(0), None, at(999), None),  # no deadline
        (30, None, None, at(999), None),  # not running yet: rendezvous has its own timeouts
        (30, at(0), None, at(10), 20.0),  # no step yet: counted from Running
        (30, at(0), at(25), at(40), 15.0),  # from the last progress
        (30, at(100), at(25), at(110), 20.0),  # progress of before Running does not count
        (30, at(0), at(10), at(40), 0.0),
    ],
)
def test_the_clock_runs_from_running_or_the_last_progress_whichever_is_later(
    deadline: int | None, running_since: datetime | None, last_progress: datetime | None, observed: datetime,
    left: float | None,
) -> None:  # fmt: skip
    got = seconds_left(deadline, running_since=running_since, last_progress=last_progress, observed=observed)
    assert got == left
    assert exceeded(deadline, running_since=running_since, last_progress=last_progress, observed=observed) is (
        left is not None and left <= 0
    )
