"""Pure: the changes a plan can make to a job's lifecycle, and ``apply``, the one place that makes them.

A policy (``lifecycle.POLICIES``) returns at most one transition; ``apply`` turns it into the new
phase, conditions and Events. Nothing else sets a phase or a condition.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import datetime

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator.events import Event
from ddpjob_operator.progress import ProgressStatus
from ddpjob_operator.status import ExcludedNode, JobStatus, MachineFault


@dataclass(frozen=True)
class Create:
    """A job seen for the first time: Pending (its clock starts unless it is created suspended)."""

    replicas: int
    nproc_per_node: int
    world_size: int
    master: str
    """host:port of rank 0."""
    suspended: bool
    placement: tuple[bool, Reason, str] | None = None
    """The GangScheduling condition (status, reason, message), said once at creation."""
    queue: str = ""
    """The Kueue LocalQueue it waits in (its ``kueue.x-k8s.io/queue-name`` label); empty: not queued."""

    def message(self) -> str:
        """What was decided: the gang's shape, and, when no pod follows at once, why not."""
        gang = (f"{self.replicas} pods x {self.nproc_per_node} processes (world size {self.world_size}), "
                f"master {self.master}")  # fmt: skip
        if self.suspended:
            return f"planned {gang}; created suspended: no pod until spec.runPolicy.suspend is false"
        if self.queue:
            return f"planned {gang}; queued in LocalQueue {self.queue}: no pod until Kueue admits its Workload"
        return gang


@dataclass(frozen=True)
class Finish:
    """Succeeded or Failed, for good."""

    succeeded: bool
    reason: Reason
    message: str


@dataclass(frozen=True)
class Restart:
    """The next attempt: counted as a restart (a retryable failure, or no progress) unless ``counted`` is
    False (a disruption: preemption, eviction)."""

    reason: Reason
    cause: str
    backoff_limit: int
    counted: bool = True
    exclude: ExcludedNode | None = None
    """A node the next attempts avoid (its rank was lost there, or the node is sick: ``policies.node_loss``)."""
    machine_fault: MachineFault | None = None
    """This restart's cause when it pointed at the machine (kept, to see the same again in a row); None clears it."""


@dataclass(frozen=True)
class NodeLostUnder:
    """The restart under way was caused by a node lost under the last attempt (``policies.node_loss``): said as
    such, and the node excluded; not counted again."""

    message: str
    exclude: ExcludedNode


@dataclass(frozen=True)
class RestartedInPlace:
    """The ranks' supervisors restarted the gang's processes in place (``--max-restarts``, which the operator sets),
    ``count`` more times, ``seen`` in this attempt in all, the last because ``why``, as polled at ``at``: counted as
    restarts; the pods, and the attempt, stay."""

    count: int
    seen: int
    why: str
    backoff_limit: int
    at: datetime


@dataclass(frozen=True)
class Rebuild:
    """The next attempt, not counted as a restart: the pods were built from an older spec."""


@dataclass(frozen=True)
class Suspend:
    pass


@dataclass(frozen=True)
class Resume:
    """A new attempt, with the deadline's clock started afresh."""


@dataclass(frozen=True)
class Queue:
    """Waiting for Kueue (or for Kueue to be installed), without pods; ``message`` in Kueue's words."""

    reason: Reason
    message: str


@dataclass(frozen=True)
class Evict:
    """Kueue took the job's quota back (or its Workload is being deleted): stop the ranks and queue again.
    A disruption: not counted as a restart."""

    message: str
    backoff_limit: int


@dataclass(frozen=True)
class Admit:
    """Kueue admitted the job: a new attempt, at ``count`` of ``replicas`` ranks."""

    count: int
    replicas: int
    cluster_queue: str


@dataclass(frozen=True)
class Launch:
    """Every pod of the attempt exists: a rank missing from now on was deleted."""

    replicas: int


@dataclass(frozen=True)
class Rendezvous:
    """Every rank runs, but only ``joined`` of ``world_size`` processes have joined the process group."""

    joined: int
    world_size: int


@dataclass(frozen=True)
class Run:
    """Every rank joined the process group and runs."""

    replicas: int
    requested: int = 0
    """spec.replicas, when Kueue admitted fewer."""


@dataclass(frozen=True)
class Wait:
    """No rank has started yet. ``blocked``: why a rank cannot start (its image cannot be pulled, a
    ConfigMap it needs is missing, the scheduler cannot place it...), said with ``reason``;
    ``unblocked``: the one that could not got past it; ``warning``: its Event is a Warning (False: a wait that is
    no fault, such as Kueue's topology assignment)."""

    blocked: str = ""
    reason: Reason = Reason.CANNOT_START
    unblocked: bool = False
    warning: bool = True


@dataclass(frozen=True)
class FlagStraggler:
    """``rank`` has stayed the straggler candidate since ``since``, for the whole window; seen at ``at``."""

    rank: int
    message: str
    since: datetime
    at: datetime


@dataclass(frozen=True)
class StragglerRecovered:
    """The flagged rank (flagged at ``flagged_since``) works within the factor again; seen at ``at``."""

    message: str
    flagged_since: datetime | None
    at: datetime


Transition = (
    Create | Finish | Restart | NodeLostUnder | RestartedInPlace | Rebuild | Suspend | Resume | Queue | Evict | Admit
    | Launch | Rendezvous | Run | Wait | FlagStraggler | StragglerRecovered
)  # fmt: skip


Applied = tuple[JobStatus, tuple[Event, ...]]
"""A job's status after a transition, and the Events that tell of it."""


def apply(status: JobStatus, transition: Transition, now: datetime) -> Applied:
    """The status after ``transition``, and the Events that tell of it: between attempts here (a job made,
    finished, restarted, suspended, queued, admitted...), within one in ``_within_attempt``."""
    match transition:
        case Create():
            return _create(status, transition, now)
        case Finish():
            return _finish(status, transition, now), (Event(transition.reason, transition.message,
                                                            warning=not transition.succeeded),)  # fmt: skip
        case Restart():
            return _restart(status, transition, now)
        case NodeLostUnder():
            return _node_lost_under(status, transition, now)
        case RestartedInPlace():
            return _restarted_in_place(status, transition)
        case Rebuild():
            return _rebuild(status)
        case Suspend():
            return _suspend(status, now)
        case Resume():
            return _resume(status, now)
        case Queue():
            return _queue(status, transition, now)
        case Evict():
            return _evict(status, transition, now)
        case Admit():
            return _admit(status, transition, now)
        case _:
            return _within_attempt(status, transition, now)


def _within_attempt(status: JobStatus, transition: Transition, now: datetime) -> Applied:
    """The status after a transition within an attempt: its pods made, its ranks joining, running, waiting,
    a straggler flagged or recovered."""
    match transition:
        case Launch():
            return _launch(status, transition)
        case Rendezvous(joined=joined, world_size=world_size):
            message = f"{joined} of {world_size} ranks joined the process group"
            return _not_running(replace(status, phase=Phase.RENDEZVOUS), Reason.RENDEZVOUS, message, now), ()
        case Run():
            return _run(status, transition, now)
        case Wait():
            return _wait(status, transition, now)
        case FlagStraggler(rank=rank, message=message, since=since, at=at):
            status = status.with_condition(ConditionType.STRAGGLER_DETECTED, True, Reason.STRAGGLER, message, at)
            key = f"{rank}.{int(since.timestamp())}"
            return status, (Event(Reason.STRAGGLER, message, warning=True, key=key),)
        case StragglerRecovered(message=message, flagged_since=flagged, at=at):
            reason = Reason.STRAGGLER_RECOVERED
            status = status.with_condition(ConditionType.STRAGGLER_DETECTED, False, reason, message, at)
            return status, (Event(reason, message, key=str(int(flagged.timestamp()) if flagged else 0)),)
    raise AssertionError(f"unknown transition {transition!r}")


def _create(status: JobStatus, create: Create, now: datetime) -> Applied:
    """Pending, its clock started unless it is created suspended; Created said, and the gang's placement."""
    message = create.message()
    status = replace(status, phase=Phase.PENDING, start_time=None if create.suspended else now)
    status = status.with_condition(ConditionType.CREATED, True, Reason.CREATED, message, now)
    status = _not_running(status, Reason.PODS_PENDING, "no rank has started yet", now)
    if create.placement is not None:
        status = status.with_condition(ConditionType.GANG_SCHEDULING, *create.placement, now)
    return status, (Event(Reason.CREATED, message),)


def _restart(status: JobStatus, restart: Restart, now: datetime) -> Applied:
    """Restarting, as the next attempt: counted unless a disruption; the node it names excluded."""
    reason, limit, counted = restart.reason, restart.backoff_limit, restart.counted
    restarts = status.restarts + 1 if counted else status.restarts
    status = replace(status, phase=Phase.RESTARTING, attempt=status.attempt + 1, restarts=restarts,
                     machine_fault=restart.machine_fault)  # fmt: skip
    if restart.exclude is not None:
        status = _excluding(status, restart.exclude)
    count = f"restart {restarts} of {limit}" if counted else f"not counted: restarts stay {restarts} of {limit}"
    message = f"{restart.cause}; restarting the gang as attempt {status.attempt} ({count})"
    status = status.with_condition(ConditionType.RESTARTING, True, reason, message, now)
    return _not_running(status, reason, message, now), (Event(reason, message, warning=True),)


def _node_lost_under(status: JobStatus, lost: NodeLostUnder, now: datetime) -> Applied:
    """The node excluded; the restart under way, if any, said as caused by it."""
    status = _excluding(status, lost.exclude)
    restarting = status.condition(ConditionType.RESTARTING)
    if restarting is not None and restarting.status:
        status = status.with_condition(ConditionType.RESTARTING, True, Reason.NODE_LOST, lost.message, now)
    return status, (Event(Reason.NODE_LOST, lost.message, warning=True),)


def _excluding(status: JobStatus, exclude: ExcludedNode) -> JobStatus:
    """``exclude`` among the nodes the next attempts avoid, in place of what was said of that node before."""
    kept = tuple(e for e in status.excluded_nodes if e.name != exclude.name)
    return replace(status, excluded_nodes=(*kept, exclude))


def _restarted_in_place(status: JobStatus, restarted: RestartedInPlace) -> Applied:
    """The in-place restarts counted; the attempt and its pods kept, its progress back at the checkpoint's."""
    seen, limit = restarted.seen, restarted.backoff_limit
    restarts = status.restarts + restarted.count
    # The step went back to the checkpoint's: the progress deadline counts from the restart.
    progress = replace(status.progress or ProgressStatus(attempt=status.attempt), restarts_in_place=seen,
                       step=None, last_progress_time=restarted.at)  # fmt: skip
    status = replace(status, restarts=restarts, progress=progress)
    message = (f"{restarted.why or 'a rank failed'}; the ranks' supervisors restarted the gang's processes in place "
               f"(restart {restarts} of {limit}; attempt {status.attempt} and its pods kept)")  # fmt: skip
    return status, (Event(Reason.RETRYABLE, message, warning=True, key=f"{status.attempt}.{seen}"),)


def _rebuild(status: JobStatus) -> Applied:
    """Pending, as the next attempt, not counted as a restart."""
    status = replace(status, phase=Phase.PENDING, attempt=status.attempt + 1)
    message = f"the pods were built from an older spec; starting attempt {status.attempt}"
    return status, (Event(Reason.SPEC_CHANGED, message),)


def _suspend(status: JobStatus, now: datetime) -> Applied:
    """Suspended, its clock stopped."""
    message = f"attempt {status.attempt} stopped: pods deleted; clear spec.runPolicy.suspend to resume"
    status = replace(status, phase=Phase.SUSPENDED, start_time=None)
    status = status.with_condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, message, now)
    return _not_running(status, Reason.SUSPENDED, message, now), (Event(Reason.SUSPENDED, message),)


def _resume(status: JobStatus, now: datetime) -> Applied:
    """Pending, as the next attempt, its clock started afresh."""
    status = replace(status, phase=Phase.PENDING, attempt=status.attempt + 1, start_time=now)
    message = f"resumed as attempt {status.attempt}"
    status = status.with_condition(ConditionType.SUSPENDED, False, Reason.RESUMED, message, now)
    return status, (Event(Reason.RESUMED, message),)


def _queue(status: JobStatus, queue: Queue, now: datetime) -> Applied:
    """Queued, its clock stopped; a warning when Kueue or the Workload is missing. Kueue's words changing while the
    reason stays (waiting, then "couldn't assign flavors...") are the status's to say: the attempt's Event of that
    reason is already there (its name is the attempt's and the reason's: another POST is refused, 409)."""
    reason, message = queue.reason, queue.message
    said = status.condition(ConditionType.QUEUED)
    again = said is not None and said.status and said.reason == reason
    status = replace(status, phase=Phase.QUEUED, start_time=None)
    status = status.with_condition(ConditionType.QUEUED, True, reason, message, now)
    warning = reason in (Reason.KUEUE_NOT_INSTALLED, Reason.WORKLOAD_MISSING)
    events = () if again else (Event(reason, message, warning=warning),)
    return _not_running(status, reason, message, now), events


def _evict(status: JobStatus, evict: Evict, now: datetime) -> Applied:
    """Queued again, its clock stopped; not counted as a restart."""
    message = evict.message
    told = f"{message}; stopping the ranks (not counted: restarts stay {status.restarts} of {evict.backoff_limit})"
    status = replace(status, phase=Phase.QUEUED, start_time=None)
    status = status.with_condition(ConditionType.QUEUED, True, Reason.EVICTED, message, now)
    return _not_running(status, Reason.EVICTED, message, now), (Event(Reason.EVICTED, told, warning=True),)


def _admit(status: JobStatus, admit: Admit, now: datetime) -> Applied:
    """Pending, its clock started: a new attempt if the last one made pods; the ranks admitted kept if fewer."""
    count, replicas = admit.count, admit.replicas
    # A new attempt only if the last one made pods: the first admission runs attempt 0
    attempt = status.attempt + 1 if status.launched_attempt >= status.attempt else status.attempt
    partial = count < replicas
    status = replace(status, phase=Phase.PENDING, attempt=attempt, start_time=now,
                     admitted_replicas=count if partial else 0)  # fmt: skip
    message = f"admitted by Kueue in ClusterQueue {admit.cluster_queue}" + (
        f": running {count} of {replicas} ranks (partial quota; spec.minReplicas allows it)" if partial else ""
    )
    status = status.with_condition(ConditionType.QUEUED, False, Reason.ADMITTED, message, now)
    return status, (Event(Reason.ADMITTED, f"{message}; starting attempt {attempt}"),)


def _launch(status: JobStatus, launch: Launch) -> Applied:
    """Every pod of the attempt made: Pending again after a restart; said, but for attempt 0."""
    phase = Phase.PENDING if status.phase is Phase.RESTARTING else status.phase
    status = replace(status, launched_attempt=status.attempt, phase=phase)
    if status.attempt == 0:  # its pods follow the Created (or Admitted) Event at once: no Event of its own
        return status, ()
    return status, (Event(Reason.LAUNCHED, f"all {launch.replicas} pods of attempt {status.attempt} exist"),)


def _run(status: JobStatus, run: Run, now: datetime) -> Applied:
    """Running; a restart under way said to be over."""
    message = f"all {run.replicas} ranks are running (attempt {status.attempt})"
    if status.admitted_replicas:
        message = (f"running {run.replicas} of {run.requested} ranks: admitted by Kueue with partial quota "
                   f"(attempt {status.attempt})")  # fmt: skip
    status = replace(status, phase=Phase.RUNNING)
    status = status.with_condition(ConditionType.RUNNING, True, Reason.ALL_RUNNING, message, now)
    restarting = status.condition(ConditionType.RESTARTING)
    if restarting and restarting.status:
        status = status.with_condition(ConditionType.RESTARTING, False, Reason.RECOVERED, message, now)
    return status, (Event(Reason.ALL_RUNNING, message),)


def _wait(status: JobStatus, wait: Wait, now: datetime) -> Applied:
    """No rank started: why one cannot, said once per distinct cause; else Pending, and said so when new."""
    if wait.blocked:
        status = _not_running(status, wait.reason, wait.blocked, now)
        key = hashlib.sha256(wait.blocked.encode()).hexdigest()[:10]  # one Event per distinct cause
        return status, (Event(wait.reason, wait.blocked, warning=wait.warning, key=key),)
    status = replace(status, phase=Phase.PENDING)
    if wait.unblocked or status.condition(ConditionType.RUNNING) is None:
        status = _not_running(status, Reason.PODS_PENDING, "no rank has started yet", now)
    return status, ()


def _not_running(status: JobStatus, reason: str, message: str, now: datetime) -> JobStatus:
    return status.with_condition(ConditionType.RUNNING, False, reason, message, now)


def _finish(status: JobStatus, finish: Finish, now: datetime) -> JobStatus:
    reason, message = finish.reason, finish.message
    status = replace(status, phase=Phase.SUCCEEDED if finish.succeeded else Phase.FAILED, completion_time=now)
    outcome = ConditionType.SUCCEEDED if finish.succeeded else ConditionType.FAILED
    status = _not_running(status.with_condition(outcome, True, reason, message, now), reason, message, now)
    restarting = status.condition(ConditionType.RESTARTING)
    if restarting and restarting.status:
        status = status.with_condition(ConditionType.RESTARTING, False, reason, message, now)
    flagged = status.condition(ConditionType.STRAGGLER_DETECTED)
    if flagged and flagged.status:
        status = status.with_condition(
            ConditionType.STRAGGLER_DETECTED, False, Reason.STRAGGLER_RECOVERED, "the job finished", now
        )
    return status
