"""A pod the apiserver refused as invalid (the job's pod template, as the operator builds it, cannot be made): the
job fails at once, in the apiserver's words. Any other failure to create a pod is retried (``cannot_start``)."""

from __future__ import annotations

from ddpjob_contract.status import Reason
from ddpjob_operator.transitions import Finish, Transition
from ddpjob_operator.view import View


def rule(v: View) -> Transition | None:
    return Finish(False, Reason.INVALID_POD, v.creates.refused) if v.creates.refused else None
