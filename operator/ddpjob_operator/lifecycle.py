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

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import exit_messages, progress
from ddpjob_operator.api import Job
from ddpjob_operator.events import Event
from ddpjob_operator.policies import (
    cleanup,
    deadline,
    exit_grace,
    gang,
    progress_deadline,
    restart,
    straggler,
    suspend,
    ttl,
)
from ddpjob_operator.progress import ProgressStatus, Scrape, Straggler, Summary, Target
from ddpjob_operator.status import (
    JobStatus,
    Observation,
    PodView,
    observe,
    with_counts,
)
from ddpjob_operator.transitions import (
    Create,
    Finish,
    FlagStraggler,
    Launch,
    Rebuild,
    Rendezvous,
    Restart,
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
RENDEZVOUS_POLL_SECONDS = 2.0
"""Poll this often while ranks are joining: the wait for Running is short and worth seeing soon."""


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
    """A succeeded run's figures, from its ranks' exit messages (once: they are final)."""
    if status.phase is not Phase.SUCCEEDED or (status.progress is not None and status.progress.final):
        return status
    old = progress.fresh(status.progress, status.attempt, job.spec.world_size)
    final = exit_messages.final_progress(old, obs.current, job.spec.nproc_per_node, status.completion_time)
    return replace(status, progress=final) if final else status


@dataclass(frozen=True, kw_only=True)
class View:
    """What the policies read: the job, its status with this attempt's polls folded in, its pods observed once."""

    job: Job
    status: JobStatus
    obs: Observation
    now: datetime
    scrapes: Sequence[Scrape]
    fold: Fold | None
    """The newest polls of this attempt, if there are new ones."""
    refused: str
    placement: gang.Placement


def plan(
    job: Job,
    old: JobStatus,
    pods: Sequence[PodView],
    now: datetime,
    scrapes: Sequence[Scrape] = (),
    *,
    refused: str = "",
    pod_groups: bool = False,
) -> Plan:
    """Observe once, let the first policy that changes something decide the transition, apply it, and
    plan the pods for the status that results.

    ``scrapes``: the poller's recent polls of the ranks' metrics (oldest first); others' attempts are
    ignored. ``refused``: why the apiserver refused a pod of this job as invalid, if it did.
    ``pod_groups``: whether the cluster serves PodGroups (gang scheduling).
    """
    status = replace(old, observed_generation=job.generation)
    events: tuple[Event, ...] = ()
    if status.phase is Phase.NEW:
        status, events = apply(status, _create(job, pod_groups), now)
    obs = _observe(job, status, pods)
    if status.phase.finished:
        return _finished_plan(job, status, obs, now, events)
    placement = gang.placement(job.spec.gang_scheduling, pod_groups)
    view = _view(job, status, obs, now, scrapes, refused, placement)
    status = view.status
    for policy in SUSPENDED_POLICIES if status.phase is Phase.SUSPENDED else POLICIES:
        transition = policy(view)
        if transition is None:
            continue
        new, told = apply(status, transition, now)
        if new != status or told:
            status, events = new, events + told
            break
    if status.attempt != view.status.attempt:
        obs = _observe(job, status, pods)  # a new attempt: its pods, none yet
    return _plan_for(job, status, obs, now, events, placement is gang.Placement.GANG)


def _create(job: Job, pod_groups: bool) -> Transition:
    spec = job.spec
    master = f"{job.name}-0.{job.name}:{spec.port}"
    placement = gang.condition(spec.gang_scheduling, pod_groups, spec.replicas)
    return Create(spec.replicas, spec.nproc_per_node, spec.world_size, master, suspended=spec.run_policy.suspend,
                  placement=placement)  # fmt: skip


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
    refused: str,
    placement: gang.Placement,
) -> View:
    """Fold this attempt's new polls into status.progress (not while restarting or suspended)."""
    fold = None
    if status.phase not in (Phase.RESTARTING, Phase.SUSPENDED):
        fresh = progress.fresh(status.progress, status.attempt, job.spec.world_size)
        fold = _fold(job, fresh, [s for s in scrapes if s.attempt == status.attempt])
        status = replace(status, progress=fold.progress if fold else fresh)
    return View(job=job, status=status, obs=obs, now=now, scrapes=scrapes, fold=fold, refused=refused,
                placement=placement)  # fmt: skip


def _plan_for(
    job: Job, status: JobStatus, obs: Observation, now: datetime, events: tuple[Event, ...], as_gang: bool
) -> Plan:
    """What to do with the pods, given the status the transition left."""
    spec = job.spec
    if status.phase.finished:
        return _finished_plan(job, status, obs, now, events)
    if status.phase is Phase.SUSPENDED:
        deletes = _deletable([*obs.stale, *obs.current.values()])
        return Plan(status=with_counts(status, obs, spec.replicas), delete_pods=deletes, events=events)
    launched = status.launched_attempt >= status.attempt
    creates = obs.missing if not launched and not obs.stale else ()  # names are per rank: old pods go first
    left = deadline.seconds_left(status.start_time, spec.run_policy.active_deadline_seconds, now)
    exiting = _exit_grace_left(job, status, obs, now)  # woken when it is up (never in the past)
    return Plan(
        status=with_counts(status, obs, spec.replicas),
        create_service=bool(creates),  # with each attempt's pods: once per attempt, not per reconcile
        gang=as_gang,
        create_pod_group=as_gang and bool(creates),
        create_ranks=creates,
        delete_pods=_deletable(obs.stale),
        events=events,
        requeue_after=_min(left, None if exiting is None else max(exiting, 1.0), RESYNC_SECONDS),
        poll=poll_targets(job, obs, _silent(status)) if status.phase is not Phase.RESTARTING else (),
        poll_interval=_poll_interval(job, status.phase),
    )


# ---------------------------------------------------------------------------------------------
# The policies, in order: the first that changes something wins.


def _refused(v: View) -> Transition | None:
    return Finish(False, Reason.INVALID_POD, v.refused) if v.refused else None


def _gang_unavailable(v: View) -> Transition | None:
    if v.placement is not gang.Placement.UNAVAILABLE:
        return None
    return Finish(False, Reason.GANG_UNAVAILABLE, gang.unavailable())


def _suspension(v: View) -> Transition | None:
    change = suspend.transition(v.job.spec.run_policy.suspend, v.status.phase)
    return {suspend.Transition.SUSPEND: Suspend(), suspend.Transition.RESUME: Resume(), None: None}[change]


def _deadline(v: View) -> Transition | None:
    limit = v.job.spec.run_policy.active_deadline_seconds
    if not deadline.exceeded(v.status.start_time, limit, v.now):
        return None
    return Finish(False, Reason.DEADLINE, f"ran longer than spec.runPolicy.activeDeadlineSeconds={limit}")


def _spec_changed(v: View) -> Transition | None:
    """The spec was edited while suspended and resumed before we saw it: start afresh."""
    return Rebuild() if v.obs.outdated else None


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
        return Restart(Reason.RETRYABLE, cause, rp.backoff_limit)
    if decision.backoff_exceeded:
        return Finish(False, Reason.BACKOFF, f"{cause}; {_no_restarts_left(rp.backoff_limit)}")
    return Finish(False, Reason.NON_RETRYABLE, f"{cause}: not retryable under restartPolicy {rp.restart_policy.value}")


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
    stuck = _stuck(v.job, v.status, v.fold.summary)
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
        return None if said and said.message == message else Wait(blocked=message, reason=reason)  # said once
    stuck = (Reason.CANNOT_START, Reason.UNSCHEDULABLE)
    unblocked = said and said.reason in stuck and v.status.phase is not Phase.RESTARTING
    return Wait(unblocked=True) if unblocked else None


def _why_not_started(v: View) -> tuple[Reason, str] | None:
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
        return Reason.UNSCHEDULABLE, gang.unplaced(replicas, [p.unschedulable for _, p in waiting])
    placed = sum(bool(p.node) for _, p in current)
    return Reason.UNSCHEDULABLE, (
        f"{placed} of {replicas} pods are placed (one by one, holding their resources); rank {rank} (pod {pod.name}) "
        f"cannot be: {pod.unschedulable}"
    )


def _phase(v: View) -> Transition | None:
    """Within the attempt: launched once every pod exists, then Rendezvous, then Running."""
    spec, status, obs = v.job.spec, v.status, v.obs
    launched = status.launched_attempt >= status.attempt
    if not launched and not obs.stale and not obs.missing:
        return Launch(spec.replicas)
    started = launched and obs.all_started(spec.replicas)
    if started and status.phase is not Phase.RUNNING:
        joined = _joined(v.job, status, obs, v.scrapes)
        return Rendezvous(joined, spec.world_size) if joined < spec.world_size else Run(spec.replicas)
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
        return FlagStraggler(state.rank, _straggler_message(v.job, fold, state.rank), state.since, fold.summary.at)
    if not flagged and current and current.status and fold.known:
        message = f"every rank works within {spec.straggler.factor:g}x the median of the others"
        if fold.previous is not None:
            message = f"{_rank(fold, fold.previous.rank)} recovered: {message}"
        return StragglerRecovered(message, current.last_transition_time, fold.summary.at)
    return None


POLICIES: tuple[Callable[[View], Transition | None], ...] = (
    _refused, _gang_unavailable, _suspension, _deadline, _spec_changed, _failures, _stuck_exiting, _no_progress,
    _succeeded,
    _cannot_start, _phase, _straggler,
)  # fmt: skip
"""In order; the first that changes something wins."""
SUSPENDED_POLICIES: tuple[Callable[[View], Transition | None], ...] = (_suspension,)
"""A suspended job has no pods: only resuming it changes anything."""


def poll_targets(job: Job, obs: Observation, silent: frozenset[int] = frozenset()) -> tuple[Target, ...]:
    """Every process of every running pod of this attempt (pod i, process j is rank i * nproc + j), but
    the ``silent`` ranks, whose program serves no metrics."""
    spec = job.spec
    found: list[Target] = []
    for rank, pod in sorted(obs.current.items()):
        if not (pod.running and pod.ip):
            continue
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        for local in range(spec.nproc_per_node):
            url = f"http://{host}:{spec.metrics_port + local}/metrics"
            target = Target(rank=rank * spec.nproc_per_node + local, pod=pod.name, node=pod.node, url=url)
            if target.rank not in silent:
                found.append(target)
    return tuple(found)


def _silent(status: JobStatus) -> frozenset[int]:
    p = status.progress
    return frozenset(p.silent) if p is not None and p.attempt == status.attempt else frozenset()


def silent_note(job: Job, silent: Sequence[int]) -> str:
    """'rank 1 serves no metrics on port 9090: progress is not shown for it', or '' for none."""
    nproc, port = job.spec.nproc_per_node, job.spec.metrics_port
    said = [f"rank {r} serves no metrics on port {port + r % nproc}" for r in silent]
    return f"{', '.join(said)}: progress is not shown for {'it' if len(said) == 1 else 'them'}" if said else ""


def _poll_interval(job: Job, phase: Phase) -> float:
    """Often enough to see a window four times over, never more than once a second."""
    if phase is not Phase.RUNNING:
        return RENDEZVOUS_POLL_SECONDS
    spec = job.spec
    windows = [progress.WINDOW_SECONDS, float(spec.straggler.window_seconds)]
    if spec.progress_deadline_seconds is not None:
        windows.append(float(spec.progress_deadline_seconds))
    return max(1.0, min(windows) / 4)


def _joined(job: Job, status: JobStatus, obs: Observation, scrapes: Sequence[Scrape]) -> int:
    """Ranks that joined the process group: as the polls saw them, plus the ranks that already exited 0."""
    nproc = job.spec.nproc_per_node
    seen = progress.joined_ranks(s for s in scrapes if s.attempt == status.attempt)
    done = {rank * nproc + i for rank, p in obs.current.items() if p.succeeded for i in range(nproc)}
    remembered = status.progress.joined if status.progress and status.progress.attempt == status.attempt else 0
    silent = _silent(status)  # serve no metrics: their running pods are all we can know
    return min(job.spec.world_size, max(remembered, len(seen | done | silent)))


@dataclass(frozen=True, kw_only=True)
class Fold:
    """New polls of this attempt folded into status.progress, with what the straggler rule reads."""

    progress: ProgressStatus
    summary: Summary
    candidate: tuple[int, float, float] | None
    """(rank, its work seconds per step, the others' median), from the newest poll."""
    known: bool
    """Whether the newest poll timed every rank (else the straggler rule changes nothing)."""
    previous: Straggler | None
    """The straggler the status remembered before these polls."""


def _fold(job: Job, old: ProgressStatus, scrapes: Sequence[Scrape]) -> Fold | None:
    """None when there is no poll newer than what status.progress already holds."""
    spec = job.spec
    summary = progress.summarize(scrapes)
    if summary is None or (old.observed_time is not None and summary.at < old.observed_time):
        return None
    advanced = summary.step is not None and summary.step > (old.step or 0)
    ranks = {r.rank for r in summary.ranks}
    known = len(ranks) > 1 and ranks <= set(summary.recent_work)
    candidate = progress.straggler_candidate(summary.recent_work, spec.straggler.factor) if known else None
    # A rank keeps the last step it answered with while it does not answer (a hung rank, once its answers have
    # left the poller's window): it is known, so it is never taken for one that serves no metrics.
    last_step = {r.rank: r.step for r in old.ranks if r.step is not None}
    silent = tuple(sorted(set(old.silent) | progress.silent_ranks(scrapes, last_step)))
    kept = tuple(
        replace(r, step=last_step[r.rank]) if r.step is None and r.rank in last_step else r
        for r in summary.ranks
        if r.rank not in silent
    )
    new = replace(
        old,
        silent=silent,
        note=silent_note(job, silent),
        joined=min(spec.world_size, max(old.joined, len(summary.joined))),
        step=summary.step if summary.step is not None else old.step,
        samples_per_second=summary.samples_per_second,
        step_time_p50=summary.step_time_p50,
        window_seconds=summary.window_seconds,
        slowest_rank=summary.slowest_rank,
        last_progress_time=summary.at if advanced else old.last_progress_time,
        observed_time=summary.at,
        ranks=kept,
        straggler=straggler.track(old.straggler, candidate[0] if candidate else None, known=known, now=summary.at),
    )
    return Fold(progress=new, summary=summary, candidate=candidate, known=known, previous=old.straggler)


def _rank(fold: Fold, rank: int) -> str:
    """rank 3 (pod train-1 on node a), from the polls, else from what the status remembered."""
    found = next((r for r in (*fold.summary.ranks, *fold.progress.ranks) if r.rank == rank), None)
    return f"rank {rank} (pod {found.pod} on node {found.node or 'unknown'})" if found else f"rank {rank}"


def _straggler_message(job: Job, fold: Fold, rank: int) -> str:
    assert fold.candidate is not None
    _, work, median = fold.candidate
    factor, window = job.spec.straggler.factor, job.spec.straggler.window_seconds
    return (
        f"{_rank(fold, rank)} works {work:.3g}s per step, "
        f"{work / median if median else float('inf'):.1f}x the median of the others ({median:.3g}s), for {window}s "
        f"(spec.straggler factor {factor:g}, window {window}s)"
    )


def _stuck(job: Job, status: JobStatus, summary: Summary) -> str:
    """Why the progress deadline has passed (naming the ranks that did not answer), or "" if it has not."""
    prog = status.progress
    running = status.condition(ConditionType.RUNNING)
    running_since = running.last_transition_time if running and running.status else None
    last = prog.last_progress_time if prog else None
    limit = job.spec.progress_deadline_seconds
    # Every rank went quiet at once: a rank blocked in a collective behind a hung peer still answers (its
    # metrics are served by a thread of their own), so a gang that is all quiet is most likely gone: ranks
    # that exited, in pods kubelet tore down before it could say so (late while it or the apiserver
    # restarts). Their exits decide; a gang truly wedged as a whole (every process stopped, or stuck holding
    # the GIL) restarts one deadline later.
    quiet = bool(summary.ranks) and all(r.error for r in summary.ranks)
    waited = 2 * limit if quiet and limit is not None else limit
    if not progress_deadline.exceeded(waited, running_since=running_since, last_progress=last, observed=summary.at):
        return ""
    if any(r.error == progress.REFUSED for r in summary.ranks):
        # A rank whose program is gone is not hung: kubelet reports its exit (a kubelet that is restarting
        # reports it late), and that exit, a success or a failure, decides. A hung rank still times out.
        return ""
    step = prog.step if prog and prog.step is not None else 0
    twice = ", twice over: every rank went quiet" if waited != limit else ""
    why = f"no rank advanced its step for {waited}s (spec.progressDeadlineSeconds={limit}{twice}); stuck at step {step}"
    silent = [f"rank {r.rank} (pod {r.pod} on node {r.node or 'unknown'}: {r.error})" for r in summary.ranks if r.error]
    return why + (f"; not answering: {', '.join(silent)}" if silent else "")


def plan_invalid(old: JobStatus, error: str, generation: int, now: datetime) -> Plan:
    """A spec the apiserver accepted but the operator cannot run (an old or missing CRD): fail once."""
    status = replace(old, observed_generation=generation)
    if status.phase.finished:
        return Plan(status=status)
    status, events = apply(status, Finish(False, Reason.INVALID, error), now)
    return Plan(status=status, events=events)
