"""runPolicy.suspend: suspending deletes the pods and keeps the job; resuming starts a new attempt.

A finished job stays finished: suspending it changes nothing.
"""

from __future__ import annotations

from enum import Enum

from ddpjob_contract.status import Phase
from ddpjob_operator import transitions
from ddpjob_operator.view import View


class Transition(Enum):
    SUSPEND = "suspend"
    RESUME = "resume"


def transition(suspend: bool, phase: Phase) -> Transition | None:
    if phase.finished:
        return None
    if suspend and phase is not Phase.SUSPENDED:
        return Transition.SUSPEND
    if not suspend and phase is Phase.SUSPENDED:
        return Transition.RESUME
    return None


def rule(v: View) -> transitions.Transition | None:
    change = transition(v.job.spec.run_policy.suspend, v.status.phase)
    return {Transition.SUSPEND: transitions.Suspend(), Transition.RESUME: transitions.Resume(), None: None}[change]
