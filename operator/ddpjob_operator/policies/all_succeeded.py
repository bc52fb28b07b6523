"""Every rank of the launched attempt exited 0: the job has Succeeded."""

from __future__ import annotations

from ddpjob_contract.status import Reason
from ddpjob_operator.transitions import Finish, Transition
from ddpjob_operator.view import View


def rule(v: View) -> Transition | None:
    replicas = v.job.spec.replicas
    if v.status.launched_attempt < v.status.attempt or not v.obs.all_succeeded(replicas):
        return None
    return Finish(True, Reason.ALL_SUCCEEDED, f"all {replicas} ranks exited 0 (attempt {v.status.attempt})")
