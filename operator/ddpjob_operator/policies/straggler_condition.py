"""The StragglerDetected condition, from the newest polls: a rank flagged once it has stayed the candidate for
spec.straggler's window (``policies.straggler``), and said when it recovers."""

from __future__ import annotations

from ddpjob_contract.status import ConditionType
from ddpjob_operator import progress_fold
from ddpjob_operator.policies import straggler
from ddpjob_operator.transitions import FlagStraggler, StragglerRecovered, Transition
from ddpjob_operator.view import View


def rule(v: View) -> Transition | None:
    """spec.straggler, judged by the newest polls: flag the rank once, and say when it recovers."""
    fold, spec = v.fold, v.job.spec
    if fold is None:
        return None
    state = fold.progress.straggler
    flagged = straggler.flagged(state, spec.straggler.window_seconds, fold.summary.at)
    current = v.status.condition(ConditionType.STRAGGLER_DETECTED)
    if flagged and fold.candidate and state and not (current and current.status):
        return FlagStraggler(
            state.rank, progress_fold.straggler_message(v.job, fold, state.rank), state.since, fold.summary.at
        )
    if not flagged and current and current.status and fold.known:
        message = f"every rank works within {spec.straggler.factor:g}x the median of the others"
        if fold.previous is not None:
            message = f"{progress_fold.rank_name(fold, fold.previous.rank)} recovered: {message}"
        return StragglerRecovered(message, current.last_transition_time, fold.summary.at)
    return None
