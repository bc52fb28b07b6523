"""Kueue's admission: a job labelled ``kueue.x-k8s.io/queue-name`` has pods only while its Workload is admitted.

- Not admitted (or Kueue not installed, or its priority class missing): Queued, no pod, saying why in Kueue's words.
- Admitted while Queued: a new attempt, at the admitted number of ranks.
- Evicted (preempted, PodsReadyTimeout, deactivated, ClusterQueue stopped) or its Workload deleted while it has
  pods: back to Queued, its ranks stopped as a suspend stops them. A disruption: never counted as a restart.

``workload_writes`` says what the operator tells Kueue in return, from the same observations: the Workload to
create, PodsReady, the eviction acknowledged once every pod is gone, Finished, the ranks that no longer need quota.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import times
from ddpjob_operator.actions import KUEUE_POLL_SECONDS, Plan, soonest
from ddpjob_operator.policies import exit_grace
from ddpjob_operator.queueing import Queueing, StatusApply, eviction_done, finished, pods_ready, reclaimable
from ddpjob_operator.status import PodView
from ddpjob_operator.transitions import Admit, Evict, Queue, Transition
from ddpjob_operator.view import View

KUEUE_DOCS = "docs/operations.md#queueing-with-kueue"
WORKLOAD_OVERDUE_SECONDS = 30.0
"""A queued job whose Workload is still not there this long after it was queued says so, in a Warning Event."""
RECLAIM_AFTER_SECONDS = 5.0
"""How long after the first rank exited 0 the ranks that did are counted in the Workload's reclaimablePods. Ranks
that finish together (a DDP job's usual end: every rank passes the last barrier) give their quota back with the
Workload's Finished condition, in one write, not one per rank; one still exiting after this long (a teardown that
hangs) no longer holds the quota of those that are done."""


class Verdict(Enum):
    QUEUE = "queue"
    ADMIT = "admit"
    EVICT = "evict"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: Reason = Reason.QUEUED
    message: str = ""
    count: int = 0
    """ADMIT: the admitted number of ranks."""


def not_installed(queue: str) -> str:
    return (
        f"the job is labelled kueue.x-k8s.io/queue-name={queue}, but the cluster does not serve Kueue's Workload "
        f"API (kueue.x-k8s.io/v1beta2): install Kueue with DDPJob in integrations.externalFrameworks "
        f"({KUEUE_DOCS}), or remove the label to run the job without a queue; no pod is made until then"
    )


def waiting(q: Queueing, overdue: bool = False) -> str:
    """Why the job waits, in Kueue's words where it has said something. ``overdue``: queued for
    ``WORKLOAD_OVERDUE_SECONDS`` or more."""
    if q.priority_missing:
        return q.priority_missing
    where = f"queued in LocalQueue {q.queue}"
    if q.evicted is not None:
        again = f", not before {q.requeue_at}" if q.requeue_at else ""
        return f"{q.evicted.describe()}; requeued in LocalQueue {q.queue}{again}, to be admitted again"
    if q.deleting:
        return f"its Workload {q.name} is being deleted; {where}, waiting for its pods to stop"
    if q.waiting:
        return f"{where}: {q.waiting}"
    if not q.exists:
        failed = f" (its creation failed: {q.create_failed})" if q.create_failed else ""
        if overdue:
            return (f"{where}: its Workload {q.name} is still not there {WORKLOAD_OVERDUE_SECONDS:.0f} s after the "
                    f"job was queued{failed}; the operator creates it again every few seconds and makes no pod "
                    f"before Kueue admits it")  # fmt: skip
        return f"{where}: creating its Workload{failed}"
    return f"{where}: waiting for Kueue to admit its Workload {q.name}"


def decide(q: Queueing, phase: Phase, said: str, queued_for: float = 0.0) -> Decision | None:
    """``said``: the message the job's Queued condition holds now (a wait is said once, and again when it changes);
    ``queued_for``: seconds since the job was queued (its Queued condition's transition)."""
    if not q.queued or phase.finished or phase is Phase.SUSPENDED:
        return None
    if not q.served:
        message = not_installed(q.queue)
        return None if said == message else Decision(Verdict.QUEUE, Reason.KUEUE_NOT_INSTALLED, message)
    if q.may_run():
        return Decision(Verdict.ADMIT, Reason.ADMITTED, count=q.count) if phase is Phase.QUEUED else None
    overdue = phase is Phase.QUEUED and queued_for >= WORKLOAD_OVERDUE_SECONDS
    message = waiting(q, overdue)
    if phase is Phase.QUEUED:
        reason = Reason.WORKLOAD_MISSING if overdue and not q.exists else Reason.QUEUED
        return None if said == message else Decision(Verdict.QUEUE, reason, message)
    if q.evicted is not None or q.deleting:  # it had pods, or was about to: stop them
        return Decision(Verdict.EVICT, Reason.EVICTED, message)
    return Decision(Verdict.QUEUE, Reason.QUEUED, message)


def workload_writes(
    q: Queueing,
    phase: Phase,
    *,
    pods_left: int,
    all_ready: bool,
    succeeded: int,
    reclaim_left: float | None = None,
    outcome: str,
    now: datetime,
) -> tuple[StatusApply, ...]:
    """What the operator writes to the Workload's status after this reconcile.

    ``pods_left``: the job's pods, terminating ones included; ``all_ready``: every rank of the attempt runs or has
    exited 0; ``succeeded``: ranks that exited 0; ``reclaim_left``: what is left of ``RECLAIM_AFTER_SECONDS`` since the
    first of them (None: none has); ``outcome``: the finished job's message.
    """
    if not (q.queued and q.served and q.exists) or q.finished:
        return ()
    if phase.finished:
        return (finished(q, phase is Phase.SUCCEEDED, outcome, now),)
    writes: list[StatusApply] = []
    if q.evicted is not None and q.quota_reserved and pods_left == 0:
        writes.append(eviction_done(q, now))  # Kueue may admit it again (or another job) only now
    if q.may_run() and phase is not Phase.QUEUED:
        ready = pods_ready(q, all_ready, now)
        if ready is not None:
            writes.append(ready)
        if reclaim_in(q, phase, succeeded, reclaim_left) == 0.0:
            writes.append(reclaimable(q, succeeded))
    return tuple(writes)


def reclaim_in(q: Queueing, phase: Phase, succeeded: int, left: float | None) -> float | None:
    """Seconds until the ranks that exited 0 are counted in reclaimablePods (0: now), from ``left`` of
    ``RECLAIM_AFTER_SECONDS``; None when there is nothing to count or no Workload to count it in (not admitted,
    evicted, finished)."""
    may = q.queued and q.served and q.exists and not q.finished and q.may_run() and not phase.finished
    if not may or phase is Phase.QUEUED or left is None or succeeded <= q.reclaimable:
        return None
    return max(0.0, left)


def create_workload(q: Queueing, phase: Phase) -> bool:
    """A queued job needs its Workload before anything else (none while Kueue is not installed, or its priority
    class is missing: Kueue would refuse it)."""
    return q.queued and q.served and not q.exists and not q.priority_missing and not phase.finished


def release_workload(q: Queueing, pods_left: int) -> bool:
    """Drop Kueue's finalizer: the Workload finished, or is being deleted and the job's pods are gone."""
    return q.exists and q.finalizer and (q.finished or (q.deleting and pods_left == 0))


def rule(v: View) -> Transition | None:
    """Kueue decides when the ranks may have pods."""
    said = v.status.condition(ConditionType.QUEUED)
    queued = said is not None and said.status
    since = said.last_transition_time if said is not None and queued else None
    queued_for = (v.now - since).total_seconds() if since is not None else 0.0
    decision = decide(v.queueing, v.status.phase, said.message if said and queued else "", queued_for)
    if decision is None:
        return None
    match decision.verdict:
        case Verdict.ADMIT:
            return Admit(decision.count, v.requested, v.queueing.cluster_queue)
        case Verdict.EVICT:
            return Evict(decision.message, v.job.spec.run_policy.backoff_limit)
    return Queue(decision.reason, decision.message)


def kueue_writes(q: Queueing, the_plan: Plan, pods: Sequence[PodView], now: datetime) -> dict[str, Any]:
    """The plan's Workload I/O, from what Kueue said and what the plan leaves: fields of ``Plan`` to replace."""
    if not q.queued:
        return {}
    status = the_plan.status
    outcome = [c.message for c in status.conditions if c.type in (ConditionType.SUCCEEDED, ConditionType.FAILED)
               and c.status]  # fmt: skip
    left = len(pods)  # those this plan deletes included: they are gone only once kubelet has stopped them
    ready = status.replicas > 0 and status.running + status.succeeded == status.replicas  # Kueue: ready or succeeded
    first = exit_grace.first_exit(p for p in pods if p.attempt == status.attempt)  # not an old attempt's exit
    reclaim_left = times.seconds_left(first, RECLAIM_AFTER_SECONDS, now)
    writes = workload_writes(q, status.phase, pods_left=left, all_ready=ready, succeeded=status.succeeded,
                             reclaim_left=reclaim_left, outcome=outcome[0] if outcome else "", now=now)  # fmt: skip
    settled = status.phase.finished and not (q.exists and (not q.finished or q.finalizer))
    reclaim = reclaim_in(q, status.phase, status.succeeded, reclaim_left)  # once written, Kueue's echo wakes the job
    return {
        "create_workload": create_workload(q, status.phase),
        "workload_status": writes,
        "release_workload": release_workload(q, left),
        "requeue_after": soonest(the_plan.requeue_after, None if settled else look_again(q), reclaim or None),
    }  # fmt: skip


def look_again(q: Queueing) -> float | None:
    """When to read the Workload again while it may still change: never while the Workload watch delivers Kueue's
    writes (each wakes the job), but every few seconds before it has listed, or while no Workload is there yet
    (being created, or waiting for its priority class)."""
    return None if q.watched and q.exists else KUEUE_POLL_SECONDS
