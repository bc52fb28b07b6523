"""spec.progressDeadlineSeconds judged by the newest polls (``policies.progress_deadline``): a running job whose ranks
advanced no step for that long restarts like a failure, or fails when no restart is left."""

from __future__ import annotations

from ddpjob_contract.status import Phase, Reason
from ddpjob_operator import progress_fold
from ddpjob_operator.policies import restart
from ddpjob_operator.transitions import Finish, Restart, Transition
from ddpjob_operator.view import View


def rule(v: View) -> Transition | None:
    """spec.progressDeadlineSeconds, judged by the newest polls: restarted like a failure."""
    if v.fold is None or v.status.phase is not Phase.RUNNING:
        return None
    if v.obs.succeeded:
        # A rank that exited 0 passed the last barrier, so every rank has finished training and the rest are
        # exiting, not hung (kubelet reports their exits late while it or the apiserver restarts, after it tore
        # their pods down, and their polls then time out like a hung rank's): exit_grace.rule bounds the wait.
        return None
    stuck = progress_fold.stuck(v.job, v.status, v.fold.summary)
    if not stuck:
        return None
    rp = v.job.spec.run_policy
    match restart.on_no_progress(rp, v.status.restarts):
        case restart.Verdict.RESTART:
            return Restart(Reason.NO_PROGRESS, stuck, rp.backoff_limit)
        case restart.Verdict.NOT_RETRIED:
            return Finish(False, Reason.NO_PROGRESS, f"{stuck}; not retried under restartPolicy Never")
    return Finish(False, Reason.BACKOFF, f"{stuck}; {restart.no_restarts_left(rp.backoff_limit)}")
