"""A rank that failed: the gang restarts, or the job fails, as ``policies.restart`` decides; a disruption restarts
it uncounted, and a machine fault twice in a row on the same node restarts it off that node (``policies.node_loss``).
A retryable failure that ends an in-place restart before it trained a step is that restart's failure, already
counted: the gang restarts uncounted (``in_place.unproven``; a power cut under a gang cost two restarts otherwise,
the in-place one and the gang's once the dead node's supervisor never came back).
"""

from __future__ import annotations

from dataclasses import replace

from ddpjob_contract.status import Reason
from ddpjob_operator.policies import in_place, node_loss, restart
from ddpjob_operator.status import ExcludedNode, Failure, MachineFault
from ddpjob_operator.transitions import Finish, Restart, Transition
from ddpjob_operator.view import View


def rule(v: View) -> Transition | None:
    rp = v.job.spec.run_policy
    decision = restart.decide(v.obs.failures, rp, v.status.restarts)
    if decision is None:
        return None
    cause = decision.cause.describe()
    if decision.restart and not decision.counted:
        reason = (
            Reason.PREEMPTED if decision.cause.disruption and decision.cause.disruption.preempted else Reason.DISRUPTED
        )
        return Restart(reason, cause, rp.backoff_limit, counted=False)
    retryable = decision.restart or decision.backoff_exceeded
    if retryable and (restarted := in_place.unproven(v)):
        said = (f"{cause}; the gang's processes, restarted in place (restart {restarted}, already counted), trained "
                f"no step before it: the same failure")  # fmt: skip
        return replace(_restart_for(v, decision.cause, said), counted=False)  # a machine fault is still seen
    if decision.restart:
        return _restart_for(v, decision.cause, cause)
    if decision.backoff_exceeded:
        return Finish(False, Reason.BACKOFF, f"{cause}; {restart.no_restarts_left(rp.backoff_limit)}")
    return Finish(False, Reason.NON_RETRYABLE, f"{cause}: not retryable under restartPolicy {rp.restart_policy.value}")


def _restart_for(v: View, failure: Failure, cause: str) -> Restart:
    """A rank's retryable failure: the gang restarts; when its exit points at its machine (policies.node_loss) for
    the second time in a row, on the same node, it restarts off that node."""
    rp = v.job.spec.run_policy
    pod = v.obs.current.get(failure.rank)
    node = pod.node if pod is not None else ""
    why = node_loss.machine_fault(failure.exit_code, failure.message)
    if not why or not node:
        return Restart(Reason.RETRYABLE, cause, rp.backoff_limit)
    fault = MachineFault(node, failure.rank, why)
    last = v.status.machine_fault
    if not node_loss.twice_on((last.node, last.rank) if last else None, node, failure.rank):
        return Restart(Reason.RETRYABLE, cause, rp.backoff_limit, machine_fault=fault)
    said = f"rank {failure.rank} failed twice in a row on node {node} with an exit that points at the machine ({why})"
    excluded = ExcludedNode(node, Reason.NODE_UNHEALTHY.value, said, v.now)
    return Restart(Reason.NODE_UNHEALTHY, f"{cause}; {said}: the next attempts avoid the node", rp.backoff_limit,
                   exclude=excluded)  # fmt: skip
