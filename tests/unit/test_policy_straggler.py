"""spec.straggler: a candidate is remembered with the time it was first seen; flagged after the window, and
cleared once it has been back within the factor for the window too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ddpjob_operator.policies.straggler import flagged, track
from ddpjob_operator.progress import Straggler

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(seconds=30)


@pytest.mark.parametrize(
    ("old", "candidate", "known", "expected"),
    [
        (None, 1, True, Straggler(rank=1, since=LATER)),  # first seen now
        (Straggler(rank=1, since=T0), 1, True, Straggler(rank=1, since=T0)),  # still the same: keeps its start
        (Straggler(rank=1, since=T0 + timedelta(seconds=1)), 0, True, Straggler(rank=0, since=LATER)),  # starts over
        (Straggler(rank=1, since=T0 + timedelta(seconds=1)), None, True, None),  # back before it was flagged
        (Straggler(rank=1, since=T0), None, True, Straggler(rank=1, since=T0, recovering=LATER)),  # flagged: stays
        (Straggler(rank=1, since=T0, recovering=T0), None, True, None),  # back for the window: recovered
        (
            Straggler(rank=1, since=T0, recovering=T0 + timedelta(seconds=1)),
            0,
            True,
            Straggler(rank=1, since=T0, recovering=T0 + timedelta(seconds=1)),
        ),  # another rank: still recovering
        (Straggler(rank=1, since=T0, recovering=T0), 0, True, Straggler(rank=0, since=LATER)),  # then starts over
        (
            Straggler(rank=1, since=T0, recovering=T0 + timedelta(seconds=1)),
            1,
            True,
            Straggler(rank=1, since=T0),
        ),  # slow again before the window passed: stays flagged from its start
        (Straggler(rank=1, since=T0), None, False, Straggler(rank=1, since=T0)),  # a poll that could not tell
        (None, None, True, None),
    ],
)
def test_a_candidate_is_tracked_from_when_it_was_first_seen(
    old: Straggler | None, candidate: int | None, known: bool, expected: Straggler | None
) -> None:
    assert track(old, candidate, known=known, now=LATER, window_seconds=30) == expected


@pytest.mark.parametrize(
    ("since", "window", "expected"),
    [(T0, 30, True), (T0, 31, False), (None, 1, False)],
)
def test_a_candidate_is_flagged_once_it_has_lasted_the_window(
    since: datetime | None, window: int, expected: bool
) -> None:
    state = Straggler(rank=1, since=since) if since else None
    assert flagged(state, window, LATER) is expected
