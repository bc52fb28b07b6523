"""spec.straggler: flag a rank whose work time stays above the others' median by ``factor`` for ``windowSeconds``.

Each poll names at most one candidate (``progress.straggler_candidate``). The candidate is
remembered in ``status.progress.straggler`` with the time it was first seen, so an operator that
restarts carries on. It is flagged once it has stayed the candidate for the whole window, and
cleared as soon as a poll sees it back within the factor. A poll that cannot time every rank (a
rank did not answer, or finished no step since the last poll) changes nothing.
"""

from __future__ import annotations

from datetime import datetime

from ddpjob_operator.progress import Straggler


def track(old: Straggler | None, candidate: int | None, *, known: bool, now: datetime) -> Straggler | None:
    if not known:
        return old
    if candidate is None:
        return None
    if old is not None and old.rank == candidate:
        return old
    return Straggler(rank=candidate, since=now)


def flagged(state: Straggler | None, window_seconds: float, now: datetime) -> bool:
    return state is not None and (now - state.since).total_seconds() >= window_seconds
