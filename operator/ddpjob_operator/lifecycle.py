"""Pure: from the job, its remembered status and the pods that exist, decide what to do next.

``plan`` observes the pods once, builds what the policies read (``view.View``), asks the policies in order
(``POLICIES``: each a ``policies.<module>.rule``) for a transition, lets the first one that changes something
win, applies it (``transitions.apply``, the one place that sets phases, conditions and Events), and plans the
pods for the status that results. A new attempt's pods are planned in the same reconcile (its old pods
deleted, or its pods created when none is left).

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
from ddpjob_operator.node_health import ALL_HEALTHY, NodeHealth
from ddpjob_operator.policies import (
    admission,
    all_succeeded,
    attempt_phase,
    cannot_start,
    cleanup,
    deadline,
    exclusions_cleared,
    exit_grace,
    failures,
    gang,
    in_place,
    invalid_pod,
    no_progress,
    node_loss,
    spec_change,
    straggler_condition,
    suspend,
    ttl,
)
from ddpjob_operator.progress import Scrape, Target
from ddpjob_operator.status import JobStatus, Observation, PodView, observe, with_counts
from ddpjob_operator.transitions import Create, Finish, Transition, apply
from ddpjob_operator.view import CreateErrors, Placement, View

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
    nodes: NodeHealth = ALL_HEALTHY,
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


def _leave_bad_nodes(the_plan: Plan, pods: Sequence[PodView], nodes: NodeHealth) -> dict[str, Any]:
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
    nodes: NodeHealth,
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
    the_plan = _plan_for(job, status, obs, now, events, placement is Placement.GANG)
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
    placement: Placement,
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
    exiting = exit_grace.grace_left(job, status, obs, now)  # woken when it is up (never in the past)
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


Policy = Callable[[View], Transition | None]
POLICIES: tuple[Policy, ...] = (
    invalid_pod.rule, gang.rule, suspend.rule, admission.rule, deadline.rule, spec_change.rule, node_loss.rule,
    exclusions_cleared.rule,
    failures.rule,
    in_place.rule,
    exit_grace.rule, no_progress.rule, all_succeeded.rule,
    cannot_start.rule, attempt_phase.rule, straggler_condition.rule,
)  # fmt: skip
"""In order; the first that changes something wins."""
_POLICIES_IN: dict[Phase, tuple[Policy, ...]] = {
    Phase.SUSPENDED: (suspend.rule,),
    Phase.QUEUED: (suspend.rule, admission.rule),
}
"""A suspended job has no pods: only resuming it changes anything; a queued one waits for Kueue too."""


def plan_invalid(old: JobStatus, error: str, generation: int, now: datetime) -> Plan:
    """A spec the apiserver accepted but the operator cannot run (an old or missing CRD): fail once."""
    status = replace(old, observed_generation=generation)
    if status.phase.finished:
        return Plan(status=status)
    status, events = apply(status, Finish(False, Reason.INVALID, error), now)
    return Plan(status=status, events=events)
