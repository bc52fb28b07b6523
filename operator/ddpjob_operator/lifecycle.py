"""Pure: from the job, its remembered status and the pods that exist, decide what to do next.

``plan`` observes the pods once, asks the policies in order (``POLICIES``) for a transition, lets
the first one that changes something win, applies it (``transitions.apply``, the one place that
sets phases, conditions and Events), and plans the pods for the status that results. A new
attempt's pods are planned in the same reconcile (its old pods deleted, or its pods created when
none is left).

The caller executes the plan in a crash-safe order: write the status first (it carries the
attempt number), then delete, then create if absent. Replaying a plan after a crash therefore
never double-counts a restart and never duplicates a pod.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import exit_messages, progress, progress_fold, queueing
from ddpjob_operator.api import Job
from ddpjob_operator.events import Event
from ddpjob_operator.policies import (
    admission,
    cleanup,
    deadline,
    exit_grace,
    gang,
    in_place,
    node_loss,
    restart,
    straggler,
    suspend,
    ttl,
)
from ddpjob_operator.progress import Scrape, Target
from ddpjob_operator.status import (
    Condition,
    ExcludedNode,
    Failure,
    JobStatus,
    MachineFault,
    Observation,
    PodView,
    observe,
    with_counts,
)
from ddpjob_operator.transitions import (
    Admit,
    Create,
    Evict,
    Finish,
    FlagStraggler,
    Launch,
    NodeLostUnder,
    Queue,
    Rebuild,
    Rendezvous,
    Restart,
    RestartedInPlace,
    Resume,
    Run,
    StragglerRecovered,
    Suspend,
    Transition,
    Wait,
    apply,
)

RESYNC_SECONDS = 300.0
"""Reconcile a live job at least this often, even when no event arrives."""
KUEUE_POLL_SECONDS = 2.0
"""Read a queued job's Workload this often: Kueue's admission and eviction wake no watch of ours yet."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    status: JobStatus
    create_service: bool = False
    """Create the job's headless Service if absent: planned with the pods of each attempt."""
    gang: bool = False
    """The ranks are placed as one gang: each pod names the attempt's PodGroup."""
    create_pod_group: bool = False
    """Create the attempt's PodGroup if absent (and delete older attempts'): planned with its pods."""
    create_ranks: tuple[int, ...] = ()
    """Ranks of ``status.attempt`` to create if absent."""
    delete_pods: tuple[PodView, ...] = ()
    delete_job: bool = False
    events: tuple[Event, ...] = field(default_factory=tuple)
    requeue_after: float | None = None
    poll: tuple[Target, ...] = ()
    """The ranks' metrics endpoints to poll for progress (none: stop polling this job)."""
    poll_interval: float = progress.WINDOW_SECONDS / 4
    placement: queueing.Placement = field(default_factory=queueing.Placement)
    """What Kueue's admission adds to every pod made (its flavors' node labels and tolerations)."""
    create_workload: bool = False
    """Create the job's Kueue Workload if absent: before any pod."""
    workload_status: tuple[queueing.StatusApply, ...] = ()
    """What to tell Kueue (PodsReady, the eviction acknowledged, Finished), after the job's status is written."""
    release_workload: bool = False
    """Drop Kueue's finalizer from the Workload."""
    adopt_pods: tuple[PodView, ...] = ()
    """Pods of the last attempt that their kubelet restarts in place: moved into ``status.attempt``
    (``policies.in_place``)."""
    force_delete_pods: tuple[PodView, ...] = ()
    """Pods on a lost node, to delete with no grace period: its kubelet cannot confirm (``policies.node_loss``)."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes every pod made is kept off (``status.excludedNodes``)."""


def _deletable(pods: Sequence[PodView]) -> tuple[PodView, ...]:
    return tuple(p for p in pods if not p.terminating)


def _min(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _finished_plan(job: Job, status: JobStatus, obs: Observation, now: datetime, events: tuple[Event, ...]) -> Plan:
    """A finished job: honour cleanPodPolicy, delete stale pods, and delete the job once its TTL is up."""
    rp = job.spec.run_policy
    status = _final_progress(job, status, obs)
    failed = status.condition(ConditionType.FAILED)
    succeeded = status.condition(ConditionType.SUCCEEDED)
    stop_running = bool(failed and failed.status and failed.reason == Reason.DEADLINE) or bool(
        succeeded and succeeded.status and succeeded.reason == Reason.STUCK_EXITING
    )
    keep = cleanup.pods_to_delete(rp.clean_pod_policy, obs.current.values(), stop_running=stop_running)
    deletes = _deletable([*obs.stale, *(p for p in obs.current.values() if p.name in keep)])
    left = ttl.seconds_left(status.completion_time, rp.ttl_seconds_after_finished, now)
    expired = ttl.expired(status.completion_time, rp.ttl_seconds_after_finished, now)
    if expired:
        events += (Event(Reason.TTL, f"deleting the job {rp.ttl_seconds_after_finished}s after it finished"),)
    return Plan(
        status=with_counts(status, obs, job.spec.replicas),
        delete_pods=deletes,
        delete_job=expired,
        events=events,
        requeue_after=None if expired else left,
    )


def _final_progress(job: Job, status: JobStatus, obs: Observation) -> JobStatus:
    """A finished run's progress: its outcome, not its last poll (``progress_fold.outcome``)."""
    return replace(status, progress=progress_fold.outcome(job, status, obs))


@dataclass(frozen=True, kw_only=True)
class CreateErrors:
    """What went wrong the last time this job's pods were created, as the controller remembers it (empty: nothing)."""

    refused: str = ""
    """Why the apiserver refused a pod of this job as invalid: the job fails."""
    failed: str = ""
    """Why the last creation failed otherwise (a webhook down, a quota): retried, and said."""


@dataclass(frozen=True, kw_only=True)
class View:
    """What the policies read: the job, its status with this attempt's polls folded in, its pods observed once."""

    job: Job
    status: JobStatus
    obs: Observation
    now: datetime
    scrapes: Sequence[Scrape]
    fold: progress_fold.Fold | None
    """The newest polls of this attempt, if there are new ones."""
    creates: CreateErrors
    placement: gang.Placement
    queueing: queueing.Queueing
    requested: int
    """spec.replicas as written (``job`` holds the admitted number under Kueue's partial admission)."""
    nodes: node_loss.NodeHealth = node_loss.ALL_HEALTHY
    """The nodes known to be lost or sick."""


def plan(
    job: Job,
    old: JobStatus,
    pods: Sequence[PodView],
    now: datetime,
    scrapes: Sequence[Scrape] = (),
    *,
    refused: str = "",
    failed_create: str = "",
    pod_groups: bool = False,
    queued: queueing.Queueing = queueing.NOT_QUEUED,
    stopped: Sequence[PodView] = (),
    nodes: node_loss.NodeHealth = node_loss.ALL_HEALTHY,
) -> Plan:
    """Observe once, let the first policy that changes something decide the transition, apply it, and
    plan the pods for the status that results.

    ``scrapes``: the poller's recent polls of the ranks' metrics (oldest first); others' attempts are
    ignored. ``refused``: why the apiserver refused a pod of this job as invalid, if it did; ``failed_create``:
    why creating one failed otherwise (it is retried).
    ``pod_groups``: whether the cluster serves PodGroups (gang scheduling). ``queued``: what Kueue says of the
    job's Workload (``queueing.NOT_QUEUED`` for a job without the queue-name label). ``stopped``: the final
    state of deleted pods that stopped after saving a checkpoint (``podcache.PodIndex.stopped``). ``nodes``: the
    nodes known to be lost or sick (``policies.node_loss``).
    """
    saved = exit_messages.saved_checkpoint([*pods, *stopped], old.last_checkpoint)
    old = replace(old, last_checkpoint=saved)
    excluded = tuple(e for e in old.excluded_nodes if node_loss.still_excluded(e.since, now, nodes.exclusion_seconds))
    old = replace(old, excluded_nodes=excluded)
    creates = CreateErrors(refused=refused, failed=failed_create)
    the_plan = _plan(job, old, pods, now, scrapes, creates, pod_groups, queued, nodes)
    return replace(the_plan, **_kueue_writes(queued, the_plan, pods, now), **_leave_bad_nodes(the_plan, pods, nodes))


def _leave_bad_nodes(the_plan: Plan, pods: Sequence[PodView], nodes: node_loss.NodeHealth) -> dict[str, Any]:
    """Pods on a lost node go with no grace period: those this plan deletes, those deleted before and stuck there,
    and those of an earlier attempt that would wait to be restarted in place (their kubelet cannot). Every pod made
    avoids the nodes the job excludes."""
    attempt = the_plan.status.attempt
    earlier = (p for p in pods if p.terminating or (p.attempt is not None and p.attempt < attempt))
    forced = node_loss.force_delete(dict.fromkeys([*the_plan.delete_pods, *earlier]), nodes)
    names = {p.name for p in forced}
    return {
        "delete_pods": tuple(p for p in the_plan.delete_pods if p.name not in names),
        "adopt_pods": tuple(p for p in the_plan.adopt_pods if p.name not in names),
        "force_delete_pods": forced,
        "avoid_nodes": the_plan.status.excluded_names,
    }


def _plan(
    job: Job,
    old: JobStatus,
    pods: Sequence[PodView],
    now: datetime,
    scrapes: Sequence[Scrape],
    creates: CreateErrors,
    pod_groups: bool,
    queued: queueing.Queueing,
    nodes: node_loss.NodeHealth,
) -> Plan:
    requested = job.spec.replicas
    status = replace(old, observed_generation=job.generation)
    events: tuple[Event, ...] = ()
    if status.phase is Phase.NEW:
        status, events = apply(status, _create(job, pod_groups), now)
    job = as_admitted(job, status)
    obs = _observe(job, status, pods)
    if status.phase.finished:
        return _finished_plan(job, status, obs, now, events)
    placement = gang.placement(job.spec.gang_scheduling, pod_groups)
    view = replace(_view(job, status, obs, now, scrapes, creates, placement, queued, requested), nodes=nodes)
    status = view.status
    for policy in _POLICIES_IN.get(status.phase, POLICIES):
        transition = policy(view)
        if transition is None:
            continue
        new, told = apply(status, transition, now)
        if new != status or told:
            status, events = new, events + told
            break
    job = as_admitted(job, status)
    if status.attempt != view.status.attempt or job.spec.replicas != view.job.spec.replicas:
        obs = _observe(job, status, pods)  # a new attempt: its pods, none yet
    the_plan = _plan_for(job, status, obs, now, events, placement is gang.Placement.GANG)
    return replace(the_plan, placement=queued.placement) if queued.may_run() else the_plan


def as_admitted(job: Job, status: JobStatus) -> Job:
    """The job as Kueue admitted it: fewer ranks under partial admission (the pods, the PodGroup and WORLD_SIZE
    follow), else as written."""
    count = status.admitted_replicas
    if not count or count >= job.spec.replicas:
        return job
    return replace(job, spec=replace(job.spec, replicas=count))


def _kueue_writes(q: queueing.Queueing, the_plan: Plan, pods: Sequence[PodView], now: datetime) -> dict[str, Any]:
    """The plan's Workload I/O, from what Kueue said and what the plan leaves (policies.admission)."""
    if not q.queued:
        return {}
    status = the_plan.status
    outcome = [c.message for c in status.conditions if c.type in (ConditionType.SUCCEEDED, ConditionType.FAILED)
               and c.status]  # fmt: skip
    left = len(pods)  # those this plan deletes included: they are gone only once kubelet has stopped them
    ready = status.replicas > 0 and status.running + status.succeeded == status.replicas  # Kueue: ready or succeeded
    writes = admission.workload_writes(q, status.phase, pods_left=left, all_ready=ready, succeeded=status.succeeded,
                                       outcome=outcome[0] if outcome else "", now=now)  # fmt: skip
    settled = status.phase.finished and not (q.exists and (not q.finished or q.finalizer))
    return {
        "create_workload": admission.create_workload(q, status.phase),
        "workload_status": writes,
        "release_workload": admission.release_workload(q, left),
        # Kueue's decisions wake no watch of ours: look again soon while the Workload may still change
        "requeue_after": _min(the_plan.requeue_after, None if settled else KUEUE_POLL_SECONDS),
    }


def _create(job: Job, pod_groups: bool) -> Transition:
    spec = job.spec
    master = f"{job.name}-0.{job.name}:{spec.port}"
    placement = gang.condition(spec.gang_scheduling, pod_groups, spec.replicas)
    return Create(spec.replicas, spec.nproc_per_node, spec.world_size, master, suspended=spec.run_policy.suspend,
                  placement=placement, queue=job.queue)  # fmt: skip


def _observe(job: Job, status: JobStatus, pods: Sequence[PodView]) -> Observation:
    spec = job.spec
    return observe(pods, job_name=job.name, attempt=status.attempt, replicas=spec.replicas, spec_hash=spec.spec_hash,
                   launched=status.launched_attempt >= status.attempt)  # fmt: skip


def _view(
    job: Job,
    status: JobStatus,
    obs: Observation,
    now: datetime,
    scrapes: Sequence[Scrape],
    creates: CreateErrors,
    placement: gang.Placement,
    queued: queueing.Queueing,
    requested: int,
) -> View:
    """Fold this attempt's new polls into status.progress (not while restarting, suspended or queued)."""
    fold = None
    if status.phase not in (Phase.RESTARTING, Phase.SUSPENDED, Phase.QUEUED):
        fresh = progress.fresh(status.progress, status.attempt, job.spec.world_size)
        fold = progress_fold.fold(job, fresh, [s for s in scrapes if s.attempt == status.attempt])
        status = replace(status, progress=fold.progress if fold else fresh)
        if fold is not None:
            status = replace(status, last_checkpoint=progress.newest_checkpoint(fold.summary.latest,
                                                                                status.last_checkpoint))  # fmt: skip
    return View(job=job, status=status, obs=obs, now=now, scrapes=scrapes, fold=fold, creates=creates,
                placement=placement, queueing=queued, requested=requested)  # fmt: skip


def _plan_for(
    job: Job, status: JobStatus, obs: Observation, now: datetime, events: tuple[Event, ...], as_gang: bool
) -> Plan:
    """What to do with the pods, given the status the transition left."""
    spec = job.spec
    if status.phase.finished:
        return _finished_plan(job, status, obs, now, events)
    if status.phase in (Phase.SUSPENDED, Phase.QUEUED):
        deletes = _deletable([*obs.stale, *obs.current.values()])
        return Plan(status=with_counts(status, obs, spec.replicas), delete_pods=deletes, events=events)
    launched = status.launched_attempt >= status.attempt
    creates = obs.missing if not launched and not obs.stale else ()  # names are per rank: old pods go first
    left = deadline.seconds_left(status.start_time, spec.run_policy.active_deadline_seconds, now)
    exiting = _exit_grace_left(job, status, obs, now)  # woken when it is up (never in the past)
    restarting = status.condition(ConditionType.RESTARTING)
    since = restarting.last_transition_time if restarting and restarting.status else None
    wait = in_place.wait_seconds(restarting.reason if restarting else "")
    kept = in_place.sort(
        obs.stale, spec.run_policy, spec.spec_hash, spec.replicas, since, now, status.restarts, wait,
        status.excluded_names,
    )  # fmt: skip
    # Ranks made again beside ranks restarted in place join the gang already placed: no PodGroup of their own.
    gang_placed = as_gang and not any(p.adopted for p in obs.current.values())
    return Plan(
        status=with_counts(status, obs, spec.replicas),
        create_service=bool(creates),  # with each attempt's pods: once per attempt, not per reconcile
        gang=gang_placed,
        create_pod_group=gang_placed and bool(creates),
        create_ranks=creates,
        delete_pods=_deletable(kept.delete),
        adopt_pods=kept.adopt,
        events=events,
        requeue_after=_min(left, None if exiting is None else max(exiting, 1.0), kept.wait_left, RESYNC_SECONDS),
        poll=progress_fold.poll_targets(job, obs, progress_fold.silent_in_attempt(status))
        if status.phase is not Phase.RESTARTING
        else (),
        poll_interval=progress_fold.poll_interval(job, status.phase),
    )


# ---------------------------------------------------------------------------------------------
# The policies, in order: the first that changes something wins.


def _refused(v: View) -> Transition | None:
    return Finish(False, Reason.INVALID_POD, v.creates.refused) if v.creates.refused else None


def _gang_unavailable(v: View) -> Transition | None:
    if v.placement is not gang.Placement.UNAVAILABLE:
        return None
    return Finish(False, Reason.GANG_UNAVAILABLE, gang.unavailable())


def _suspension(v: View) -> Transition | None:
    change = suspend.transition(v.job.spec.run_policy.suspend, v.status.phase)
    return {suspend.Transition.SUSPEND: Suspend(), suspend.Transition.RESUME: Resume(), None: None}[change]


def _admission(v: View) -> Transition | None:
    """policies.admission: Kueue decides when the ranks may have pods."""
    said = v.status.condition(ConditionType.QUEUED)
    queued = said is not None and said.status
    since = said.last_transition_time if said is not None and queued else None
    queued_for = (v.now - since).total_seconds() if since is not None else 0.0
    decision = admission.decide(v.queueing, v.status.phase, said.message if said and queued else "", queued_for)
    if decision is None:
        return None
    match decision.verdict:
        case admission.Verdict.ADMIT:
            return Admit(decision.count, v.requested, v.queueing.cluster_queue)
        case admission.Verdict.EVICT:
            return Evict(decision.message, v.job.spec.run_policy.backoff_limit)
    return Queue(decision.reason, decision.message)


def _deadline(v: View) -> Transition | None:
    limit = v.job.spec.run_policy.active_deadline_seconds
    if not deadline.exceeded(v.status.start_time, limit, v.now):
        return None
    return Finish(False, Reason.DEADLINE, f"ran longer than spec.runPolicy.activeDeadlineSeconds={limit}")


def _spec_changed(v: View) -> Transition | None:
    """The spec was edited while suspended and resumed before we saw it: start afresh."""
    return Rebuild() if v.obs.outdated else None


def _node_lost(v: View) -> Transition | None:
    """policies.node_loss: a rank of the attempt on a lost or sick node restarts the gang off it at once."""
    left = node_loss.decide(tuple(v.obs.current.values()), v.nodes)
    if left is None:
        return _node_lost_under_last_attempt(v)
    reason = Reason.NODE_LOST if left.lost else Reason.NODE_UNHEALTHY
    state = "is lost" if left.lost else "is unhealthy"
    cause = f"node {left.node} {state} ({left.why}): rank {left.pod.rank}'s pod {left.pod.name} ran there"
    rp = v.job.spec.run_policy
    if v.status.restarts >= rp.backoff_limit:
        return Finish(False, Reason.BACKOFF, f"{cause}; {_no_restarts_left(rp.backoff_limit)}")
    excluded = ExcludedNode(left.node, reason.value, left.why, v.now)
    return Restart(reason, f"{cause}; the next attempt avoids the node", rp.backoff_limit, exclude=excluded)


def _exclusions_cleared(v: View) -> Transition | None:
    """A rank not yet placed avoids a node the job no longer excludes (``status.excludedNodes`` cleared by the user,
    or expired): its pod's affinity cannot change, so the gang restarts, uncounted, with pods built for the list as
    it is now. Without this, a gang that had nowhere left to run waited on, whatever was cleared."""
    excluded = set(v.status.excluded_names)
    for pod in v.obs.current.values():
        freed = set(pod.avoids) - excluded
        if freed and not pod.node and not pod.terminating:
            cause = (f"rank {pod.rank}'s pod {pod.name}, not placed, was built to avoid {', '.join(sorted(freed))}, "
                     f"which the job no longer excludes: the gang is made again without it")  # fmt: skip
            return Restart(Reason.EXCLUSIONS_CLEARED, cause, v.job.spec.run_policy.backoff_limit, counted=False)
    return None


def _node_lost_under_last_attempt(v: View) -> Transition | None:
    """The restart under way came from a node lost under the last attempt (policies.node_loss.under_last_attempt)."""
    left = node_loss.under_last_attempt(v.obs.stale, v.status.attempt, v.nodes, v.status.excluded_names)
    if left is None:
        return None
    message = (f"node {left.node} is lost ({left.why}): rank {left.pod.rank}'s pod {left.pod.name} ran there, and the "
               f"gang's restart as attempt {v.status.attempt} (restart {v.status.restarts}, already counted) came from "
               f"it; the next attempts avoid the node")  # fmt: skip
    return NodeLostUnder(message, ExcludedNode(left.node, Reason.NODE_LOST.value, left.why, v.now))


def _failures(v: View) -> Transition | None:
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
    if decision.restart:
        return _restart_for(v, decision.cause, cause)
    if decision.backoff_exceeded:
        return Finish(False, Reason.BACKOFF, f"{cause}; {_no_restarts_left(rp.backoff_limit)}")
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


def _restarted_in_place(v: View) -> Transition | None:
    """The ranks' supervisors restarted the gang's processes in place (``policies.in_place.in_process``), as their
    polls say: each restart is counted, as the operator's own are; past backoffLimit (possible only when a pod
    restarted in place by its kubelet kept the env of an earlier attempt), the job has failed."""
    counted = v.status.progress.restarts_in_place if v.status.progress else 0
    polled = v.fold.summary.restart_count if v.fold else 0
    seen = max(polled, exit_messages.restarts_in_place(v.obs.current.values()))  # those the polls missed at the end
    if seen <= counted:
        return None
    rp = v.job.spec.run_policy
    why = v.fold.summary.restart_reason if v.fold and polled == seen else ""
    if v.status.restarts + seen - counted > rp.backoff_limit:
        return Finish(False, Reason.BACKOFF, f"{why or 'a rank failed'}, and its processes restarted in place; "
                                             f"{_no_restarts_left(rp.backoff_limit)}")  # fmt: skip
    at = v.fold.summary.at if v.fold else v.now
    return RestartedInPlace(seen - counted, seen, why, rp.backoff_limit, at)


def _exiting(job: Job, status: JobStatus, obs: Observation) -> bool:
    """A rank of the attempt has exited 0 and others have not yet: the gang is leaving (policies.exit_grace)."""
    return (
        status.phase in (Phase.RUNNING, Phase.RENDEZVOUS)
        and bool(obs.succeeded)
        and not obs.all_succeeded(job.spec.replicas)
    )


def _exit_grace_left(job: Job, status: JobStatus, obs: Observation, now: datetime) -> float | None:
    """What is left of the exiting ranks' wait (policies.exit_grace); None when there is none to bound."""
    if not _exiting(job, status, obs):
        return None
    return exit_grace.seconds_left(job.spec.progress_deadline_seconds, exit_grace.first_exit(obs.current.values()), now)


def _stuck_exiting(v: View) -> Transition | None:
    """Ranks that have not exited within spec.progressDeadlineSeconds of a peer's exit 0: the training is done
    (that peer passed the last barrier), so the job has Succeeded, and the stuck ranks are stopped."""
    left = _exit_grace_left(v.job, v.status, v.obs, v.now)
    if left is None or left > 0:
        return None
    limit = v.job.spec.progress_deadline_seconds
    done = [r for r, p in sorted(v.obs.current.items()) if p.succeeded]
    stuck = [f"rank {r} (pod {p.name})" for r, p in sorted(v.obs.current.items()) if not p.succeeded]
    exited = ", ".join(f"rank {r}" for r in done)
    return Finish(
        True,
        Reason.STUCK_EXITING,
        f"{exited} exited 0, so every rank finished training; not exited {limit}s after that "
        f"(spec.progressDeadlineSeconds={limit}), so stopped: {', '.join(stuck)}",
    )


def _no_progress(v: View) -> Transition | None:
    """spec.progressDeadlineSeconds, judged by the newest polls: restarted like a failure."""
    if v.fold is None or v.status.phase is not Phase.RUNNING:
        return None
    if v.obs.succeeded:
        # A rank that exited 0 passed the last barrier, so every rank has finished training and the rest are
        # exiting, not hung (kubelet reports their exits late while it or the apiserver restarts, after it tore
        # their pods down, and their polls then time out like a hung rank's): _stuck_exiting bounds the wait.
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
    return Finish(False, Reason.BACKOFF, f"{stuck}; {_no_restarts_left(rp.backoff_limit)}")


def _no_restarts_left(backoff_limit: int) -> str:
    return f"no restarts left (spec.runPolicy.backoffLimit={backoff_limit})"


def _succeeded(v: View) -> Transition | None:
    replicas = v.job.spec.replicas
    if v.status.launched_attempt < v.status.attempt or not v.obs.all_succeeded(replicas):
        return None
    return Finish(True, Reason.ALL_SUCCEEDED, f"all {replicas} ranks exited 0 (attempt {v.status.attempt})")


def _cannot_start(v: View) -> Transition | None:
    """A rank is stuck before it starts (its container cannot start, or the scheduler cannot place it):
    say which, and why, instead of a silent Pending."""
    if v.status.phase is Phase.RUNNING:
        return None
    said = v.status.condition(ConditionType.RUNNING)
    why = _why_not_started(v)
    if why is not None:
        reason, message = why
        return None if said and _said_already(said, reason, message) else Wait(blocked=message, reason=reason)
    stuck = (Reason.CANNOT_START, Reason.UNSCHEDULABLE, Reason.POD_CREATE_FAILED)
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
        return None
    replicas = v.job.spec.replicas
    rank, pod = waiting[0]
    if v.placement is gang.Placement.GANG:
        return Reason.UNSCHEDULABLE, gang.unplaced(replicas, [p.unschedulable for _, p in waiting]) + _excluding(v)
    placed = sum(bool(p.node) for _, p in current)
    return Reason.UNSCHEDULABLE, (
        f"{placed} of {replicas} pods are placed (one by one, holding their resources); rank {rank} (pod {pod.name}) "
        f"cannot be: {pod.unschedulable}{_excluding(v)}"
    )


def _excluding(v: View) -> str:
    """What an unplaced gang's line adds when the job keeps its pods off some nodes (``status.excludedNodes``)."""
    excluded = v.status.excluded_nodes
    if not excluded:
        return ""
    nodes = ", ".join(f"{e.name} ({e.reason})" for e in excluded)
    return f"; this job excludes {nodes} until they expire or are removed from status.excludedNodes"


def _phase(v: View) -> Transition | None:
    """Within the attempt: launched once every pod exists, then Rendezvous, then Running."""
    spec, status, obs = v.job.spec, v.status, v.obs
    launched = status.launched_attempt >= status.attempt
    if not launched and not obs.stale and not obs.missing:
        return Launch(spec.replicas)
    started = launched and obs.all_started(spec.replicas)
    if started and status.phase is not Phase.RUNNING:
        joined = progress_fold.joined(v.job, status, obs, v.scrapes)
        return Rendezvous(joined, spec.world_size) if joined < spec.world_size else Run(spec.replicas, v.requested)
    if not started and status.phase not in (Phase.RESTARTING, Phase.RUNNING):  # within an attempt, Running stays
        return Wait()
    return None


def _straggler(v: View) -> Transition | None:
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


POLICIES: tuple[Callable[[View], Transition | None], ...] = (
    _refused, _gang_unavailable, _suspension, _admission, _deadline, _spec_changed, _node_lost, _exclusions_cleared,
    _failures,
    _restarted_in_place,
    _stuck_exiting, _no_progress, _succeeded,
    _cannot_start, _phase, _straggler,
)  # fmt: skip
"""In order; the first that changes something wins."""
_POLICIES_IN: dict[Phase, tuple[Callable[[View], Transition | None], ...]] = {
    Phase.SUSPENDED: (_suspension,),
    Phase.QUEUED: (_suspension, _admission),
}
"""A suspended job has no pods: only resuming it changes anything; a queued one waits for Kueue too."""


def plan_invalid(old: JobStatus, error: str, generation: int, now: datetime) -> Plan:
    """A spec the apiserver accepted but the operator cannot run (an old or missing CRD): fail once."""
    status = replace(old, observed_generation=generation)
    if status.phase.finished:
        return Plan(status=status)
    status, events = apply(status, Finish(False, Reason.INVALID, error), now)
    return Plan(status=status, events=events)
