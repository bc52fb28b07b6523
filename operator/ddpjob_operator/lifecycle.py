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
from dataclasses import replace
from datetime import datetime

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import exit_messages, progress, progress_fold, queueing, topology
from ddpjob_operator.actions import RESYNC_SECONDS, Plan, deletable, soonest
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
)
from ddpjob_operator.progress import Scrape
from ddpjob_operator.status import JobStatus, Observation, PodView, observe, with_counts
from ddpjob_operator.transitions import Create, Finish, Transition, apply
from ddpjob_operator.view import CreateErrors, Placement, View


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
    return replace(
        the_plan,
        **admission.kueue_writes(queued, the_plan, pods, now),
        **node_loss.leave_bad_nodes(the_plan, pods, nodes),
    )


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
        return cleanup.finished_plan(job, status, obs, now, events)
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
    spans = topology.spanned(job.spec.template, the_plan.status.nodes, nodes.labels) or the_plan.status.spans
    the_plan = replace(the_plan, status=replace(the_plan.status, spans=spans))  # kept once the pods go
    if not queued.may_run():
        return the_plan
    tolerations = (job.spec.template.get("spec") or {}).get("tolerations") or ()
    return node_loss.awaiting_replacement(replace(the_plan, placement=queued.placement), nodes, tolerations)


def as_admitted(job: Job, status: JobStatus) -> Job:
    """The job as Kueue admitted it: fewer ranks under partial admission (the pods, the PodGroup and WORLD_SIZE
    follow), else as written."""
    count = status.admitted_replicas
    if not count or count >= job.spec.replicas:
        return job
    return replace(job, spec=replace(job.spec, replicas=count))


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
        return cleanup.finished_plan(job, status, obs, now, events)
    if status.phase in (Phase.SUSPENDED, Phase.QUEUED):
        deletes = deletable([*obs.stale, *obs.current.values()])
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
        delete_pods=deletable(kept.delete),
        adopt_pods=kept.adopt,
        events=events,
        requeue_after=soonest(left, None if exiting is None else max(exiting, 1.0), kept.wait_left, RESYNC_SECONDS),
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
    attempt_phase.launch, cannot_start.rule, attempt_phase.rule, straggler_condition.rule,
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
