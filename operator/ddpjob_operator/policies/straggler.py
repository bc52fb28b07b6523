"""spec.straggler: flag a rank whose work time stays above the others' median by ``factor`` for ``windowSeconds``.

Each poll names at most one candidate (``progress.straggler_candidate``). The candidate is
remembered in ``status.progress.straggler`` with the time it was first seen, so an operator that
restarts carries on. It is flagged once it has stayed the candidate for the whole window. A flagged
rank is cleared once it has stayed back within the factor for the window too (``recovering``, from
the first poll that saw it back): one poll of a peer slowed by a busy host is not a recovery, and the
condition does not flap. A rank not yet flagged starts over at the first poll that sees it back. A
poll that cannot time every rank (a rank did not answer, or finished no step since the last poll)
changes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from ddpjob_operator.progress import Straggler


def track(
    old: Straggler | None, candidate: int | None, *, known: bool, now: datetime, window_seconds: float
) -> Straggler | None:
    if not known:
        return old
    if old is not None and old.rank == candidate:
        return replace(old, recovering=None)
    if old is not None and flagged(old, window_seconds, now):
        back = old.recovering or now
        if (now - back).total_seconds() < window_seconds:
            return replace(old, recovering=back)
    return Straggler(rank=candidate, since=now) if candidate is not None else None


def flagged(state: Straggler | None, window_seconds: float, now: datetime) -> bool:
    return state is not None and (now - state.since).total_seconds() >= window_seconds
