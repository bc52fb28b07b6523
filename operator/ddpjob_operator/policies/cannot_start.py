"""A rank stuck before it starts: its container cannot start, the scheduler cannot place it, creating the pods
failed (retried), or Kueue has yet to place it by topology. The job says which, and why, in its Running condition,
instead of a silent Pending; and says when it is no longer so."""

from __future__ import annotations

from ddpjob_contract import kueue
from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator.policies import gang
from ddpjob_operator.status import Condition
from ddpjob_operator.transitions import Transition, Wait
from ddpjob_operator.view import Placement, View


def rule(v: View) -> Transition | None:
    """A rank is stuck before it starts (its container cannot start, or the scheduler cannot place it):
    say which, and why, instead of a silent Pending."""
    if v.status.phase is Phase.RUNNING:
        return None
    said = v.status.condition(ConditionType.RUNNING)
    why = _why_not_started(v)
    if why is not None:
        reason, message = why
        if said and _said_already(said, reason, message):
            return None
        return Wait(blocked=message, reason=reason, warning=reason is not Reason.TOPOLOGY_GATED)
    stuck = (Reason.CANNOT_START, Reason.UNSCHEDULABLE, Reason.POD_CREATE_FAILED, Reason.TOPOLOGY_GATED)
    unblocked = said and said.reason in stuck and v.status.phase is not Phase.RESTARTING
    return Wait(unblocked=True) if unblocked else None


def _said_already(said: Condition, reason: Reason, message: str) -> bool:
    """Said once. A gang's pods take turns carrying the scheduler's words ('Insufficient nvidia.com/gpu'), and
    between turns all of them may carry only the gang's count: that does not replace the words said before."""
    if said.message == message:
        return True
    kept = said.reason == reason and gang.says_why(said.message) and not gang.says_why(message)
    return reason is Reason.UNSCHEDULABLE and kept


def _why_not_started(v: View) -> tuple[Reason, str] | None:
    if v.creates.failed:
        return Reason.POD_CREATE_FAILED, f"creating the pods failed, retrying with backoff: {v.creates.failed}"
    current = sorted((rank, pod) for rank, pod in v.obs.current.items() if not pod.terminating)
    for rank, pod in current:
        if pod.blocked:
            return Reason.CANNOT_START, f"rank {rank} (pod {pod.name}) cannot start: {pod.blocked}"
    waiting = [(rank, pod) for rank, pod in current if pod.unschedulable]
    if not waiting:
        return _gated(v, [rank for rank, pod in current if pod.topology_gated])
    replicas = v.job.spec.replicas
    rank, pod = waiting[0]
    if v.placement is Placement.GANG:
        return Reason.UNSCHEDULABLE, gang.unplaced(replicas, [p.unschedulable for _, p in waiting]) + _excluding(v)
    placed = sum(bool(p.node) for _, p in current)
    return Reason.UNSCHEDULABLE, (
        f"{placed} of {replicas} pods are placed (one by one, holding their resources); rank {rank} (pod {pod.name}) "
        f"cannot be: {pod.unschedulable}{_excluding(v)}"
    )


def _gated(v: View, ranks: list[int]) -> tuple[Reason, str] | None:
    """Ranks whose pods wait for Kueue to place them by topology: the normal wait before Kueue's ungater runs, or
    while Kueue replaces a failed node of the assignment. Not a failure, and not the scheduler's doing."""
    if not ranks:
        return None
    which = "every rank" if len(ranks) == v.job.spec.replicas else "ranks " + ", ".join(map(str, ranks))
    return Reason.TOPOLOGY_GATED, (
        f"waiting for Kueue's topology assignment: {which} gated ({kueue.TOPOLOGY_GATE}) until Kueue places them"
    )


def _excluding(v: View) -> str:
    """What an unplaced gang's line adds when the job keeps its pods off some nodes (``status.excludedNodes``)."""
    excluded = v.status.excluded_nodes
    if not excluded:
        return ""
    nodes = ", ".join(f"{e.name} ({e.reason})" for e in excluded)
    return f"; this job excludes {nodes} until they expire or are removed from status.excludedNodes"
