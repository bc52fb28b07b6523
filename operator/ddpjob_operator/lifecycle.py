"""Pure: from the job, its remembered status and the pods that exist, decide what to do next.

``plan`` is the whole lifecycle as one function of data. The caller executes the plan in a
crash-safe order: write the status first (it carries the attempt number), then delete, then
create if absent. Replaying a plan after a crash therefore never double-counts a restart and
never duplicates a pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import progress
from ddpjob_operator.api import Job, RestartPolicy
from ddpjob_operator.events import Event
from ddpjob_operator.policies import cleanup, deadline, progress_deadline, restart, straggler, suspend, ttl
from ddpjob_operator.progress import Scrape, Summary, Target
from ddpjob_operator.status import (
    JobStatus,
    Observation,
    PodView,
    observe,
    with_counts,
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


def _finish(status: JobStatus, *, succeeded: bool, reason: str, message: str, now: datetime) -> JobStatus:
    status = replace(status, phase=Phase.SUCCEEDED if succeeded else Phase.FAILED, completion_time=now)
    status = status.with_condition(
        ConditionType.SUCCEEDED if succeeded else ConditionType.FAILED, True, reason, message, now
    )
    status = status.with_condition(ConditionType.RUNNING, False, reason, message, now)
    restarting = status.condition(ConditionType.RESTARTING)
    if restarting and restarting.status:
        status = status.with_condition(ConditionType.RESTARTING, False, reason, message, now)
    flagged = status.condition(ConditionType.STRAGGLER_DETECTED)
    if flagged and flagged.status:
        status = status.with_condition(
            ConditionType.STRAGGLER_DETECTED, False, Reason.STRAGGLER_RECOVERED, "the job finished", now
        )
    return status


def _restart_gang(
    status: JobStatus, cause: str, reason: str, backoff_limit: int, now: datetime, events: list[Event]
) -> JobStatus:
    """The next attempt, counted as a restart: Restarting, not Running, and a Warning Event saying why."""
    status = replace(status, phase=Phase.RESTARTING, attempt=status.attempt + 1, restarts=status.restarts + 1)
    message = f"{cause}; restarting the gang as attempt {status.attempt} (restart {status.restarts} of {backoff_limit})"
    status = status.with_condition(ConditionType.RESTARTING, True, reason, message, now)
    status = status.with_condition(ConditionType.RUNNING, False, reason, message, now)
    events.append(Event(reason, message, warning=True))
    return status


def _finished_plan(job: Job, status: JobStatus, obs: Observation, now: datetime, events: list[Event]) -> Plan:
    """A finished job: honour cleanPodPolicy, delete stale pods, and delete the job once its TTL is up."""
    rp = job.spec.run_policy
    failed = status.condition(ConditionType.FAILED)
    by_deadline = bool(failed and failed.status and failed.reason == Reason.DEADLINE)
    keep = cleanup.pods_to_delete(rp.clean_pod_policy, obs.current.values(), deadline_exceeded=by_deadline)
    deletes = _deletable([*obs.stale, *(p for p in obs.current.values() if p.name in keep)])
    left = ttl.seconds_left(status.completion_time, rp.ttl_seconds_after_finished, now)
    expired = ttl.expired(status.completion_time, rp.ttl_seconds_after_finished, now)
    if expired:
        events.append(Event(Reason.TTL, f"deleting the job {rp.ttl_seconds_after_finished}s after it finished"))
    return Plan(
        status=with_counts(status, obs, job.spec.replicas),
        delete_pods=deletes,
        delete_job=expired,
        events=tuple(events),
        requeue_after=None if expired else left,
    )


def plan(
    job: Job,
    old: JobStatus,
    pods: Sequence[PodView],
    now: datetime,
    scrapes: Sequence[Scrape] = (),
    *,
    refused: str = "",
) -> Plan:
    """``scrapes``: the poller's recent polls of the ranks' metrics (oldest first); others' attempts are ignored.
    ``refused``: why the apiserver refused a pod of this job as invalid (retrying cannot help), if it did."""
    spec = job.spec
    rp = spec.run_policy
    events: list[Event] = []
    status = replace(old, observed_generation=job.generation)

    def look() -> Observation:
        return observe(
            pods,
            job_name=job.name,
            attempt=status.attempt,
            replicas=spec.replicas,
            spec_hash=spec.spec_hash,
            launched=status.launched_attempt >= status.attempt,
        )

    if status.phase is Phase.NEW:
        message = (
            f"{spec.replicas} pods x {spec.nproc_per_node} processes (world size {spec.world_size}), "
            f"master {job.name}-0.{job.name}:{spec.port}"
        )
        status = replace(status, phase=Phase.PENDING, start_time=None if rp.suspend else now)
        status = status.with_condition(ConditionType.CREATED, True, Reason.CREATED, message, now)
        events.append(Event(Reason.CREATED, message))

    obs = look()
    if status.phase.finished:
        return _finished_plan(job, status, obs, now, events)
    if refused:
        status = _finish(status, succeeded=False, reason=Reason.INVALID_POD, message=refused, now=now)
        events.append(Event(Reason.INVALID_POD, refused, warning=True))
        return _finished_plan(job, status, obs, now, events)

    transition = suspend.transition(rp.suspend, status.phase)
    if transition is suspend.Transition.SUSPEND:
        message = f"attempt {status.attempt} stopped: pods deleted; clear spec.runPolicy.suspend to resume"
        status = replace(status, phase=Phase.SUSPENDED, start_time=None)
        status = status.with_condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, message, now)
        status = status.with_condition(ConditionType.RUNNING, False, Reason.SUSPENDED, message, now)
        events.append(Event(Reason.SUSPENDED, message))
    elif transition is suspend.Transition.RESUME:
        status = replace(status, phase=Phase.PENDING, attempt=status.attempt + 1, start_time=now)
        message = f"resumed as attempt {status.attempt}"
        status = status.with_condition(ConditionType.SUSPENDED, False, Reason.RESUMED, message, now)
        events.append(Event(Reason.RESUMED, message))
        obs = look()
    if status.phase is Phase.SUSPENDED:
        return Plan(
            status=with_counts(status, obs, spec.replicas),
            delete_pods=_deletable([*obs.stale, *obs.current.values()]),
            events=tuple(events),
        )

    if deadline.exceeded(status.start_time, rp.active_deadline_seconds, now):
        message = f"ran longer than spec.runPolicy.activeDeadlineSeconds={rp.active_deadline_seconds}"
        status = _finish(status, succeeded=False, reason=Reason.DEADLINE, message=message, now=now)
        events.append(Event(Reason.DEADLINE, message, warning=True))
        return _finished_plan(job, status, obs, now, events)

    if obs.outdated:
        # The spec was edited while suspended and resumed before we saw it: start afresh.
        status = replace(status, phase=Phase.PENDING, attempt=status.attempt + 1)
        message = f"the pods were built from an older spec; starting attempt {status.attempt}"
        events.append(Event(Reason.SPEC_CHANGED, message))
        obs = look()

    decision = restart.decide(obs.failures, rp, status.restarts)
    if decision is not None and decision.restart:
        status = _restart_gang(status, decision.cause.describe(), Reason.RETRYABLE, rp.backoff_limit, now, events)
        obs = look()
    elif decision is not None:
        if decision.backoff_exceeded:
            reason = Reason.BACKOFF
            message = f"{decision.cause.describe()}; no restarts left (spec.runPolicy.backoffLimit={rp.backoff_limit})"
        else:
            reason = Reason.NON_RETRYABLE
            message = f"{decision.cause.describe()}: not retryable under restartPolicy {rp.restart_policy.value}"
        status = _finish(status, succeeded=False, reason=reason, message=message, now=now)
        events.append(Event(reason, message, warning=True))
        return _finished_plan(job, status, obs, now, events)

    summary: Summary | None = None
    if status.phase not in (Phase.RESTARTING, Phase.SUSPENDED):
        status, summary = _fold_progress(job, status, scrapes, events)
    if decision is None and summary is not None and status.phase is Phase.RUNNING:
        stuck = _no_progress(job, status, summary)
        if stuck and rp.restart_policy is not RestartPolicy.NEVER and status.restarts < rp.backoff_limit:
            status = _restart_gang(status, stuck, Reason.NO_PROGRESS, rp.backoff_limit, now, events)
            obs = look()
        elif stuck:
            never = rp.restart_policy is RestartPolicy.NEVER
            reason = Reason.NO_PROGRESS if never else Reason.BACKOFF
            message = f"{stuck}; " + (
                "not retried under restartPolicy Never" if never
                else f"no restarts left (spec.runPolicy.backoffLimit={rp.backoff_limit})"
            )  # fmt: skip
            status = _finish(status, succeeded=False, reason=reason, message=message, now=now)
            events.append(Event(reason, message, warning=True))
            return _finished_plan(job, status, obs, now, events)

    creates: tuple[int, ...] = ()
    launched = status.launched_attempt >= status.attempt
    if not launched:
        if obs.stale:
            pass  # names are per rank, not per attempt: wait until the old pods are gone
        elif obs.missing:
            creates = obs.missing
        else:
            status = replace(status, launched_attempt=status.attempt)
            if status.phase is Phase.RESTARTING:
                status = replace(status, phase=Phase.PENDING)
            message = f"all {spec.replicas} pods of attempt {status.attempt} exist"
            events.append(Event(Reason.LAUNCHED, message))
            launched = True

    if launched and obs.all_succeeded(spec.replicas):
        message = f"all {spec.replicas} ranks exited 0 (attempt {status.attempt})"
        status = _finish(status, succeeded=True, reason=Reason.ALL_SUCCEEDED, message=message, now=now)
        events.append(Event(Reason.ALL_SUCCEEDED, message))
        return _finished_plan(job, status, obs, now, events)
    joined = _joined(job, status, obs, scrapes)
    if launched and obs.all_started(spec.replicas) and status.phase is not Phase.RUNNING and joined < spec.world_size:
        status = replace(status, phase=Phase.RENDEZVOUS)
        message = f"{joined} of {spec.world_size} ranks joined the process group"
        status = status.with_condition(ConditionType.RUNNING, False, Reason.RENDEZVOUS, message, now)
    elif launched and obs.all_started(spec.replicas):
        if status.phase is not Phase.RUNNING:
            status = replace(status, phase=Phase.RUNNING)
            message = f"all {spec.replicas} ranks are running (attempt {status.attempt})"
            status = status.with_condition(ConditionType.RUNNING, True, Reason.ALL_RUNNING, message, now)
            restarting = status.condition(ConditionType.RESTARTING)
            if restarting and restarting.status:
                status = status.with_condition(ConditionType.RESTARTING, False, Reason.RECOVERED, message, now)
            events.append(Event(Reason.ALL_RUNNING, message))
    elif status.phase not in (Phase.RESTARTING, Phase.RUNNING):  # within an attempt, Running stays Running
        status = replace(status, phase=Phase.PENDING)
        if status.condition(ConditionType.RUNNING) is None:
            status = status.with_condition(
                ConditionType.RUNNING, False, Reason.PODS_PENDING, "no rank has started yet", now
            )

    left = deadline.seconds_left(status.start_time, rp.active_deadline_seconds, now)
    return Plan(
        status=with_counts(status, obs, spec.replicas),
        create_service=bool(creates),  # with each attempt's pods: once per attempt, not per reconcile
        create_ranks=creates,
        delete_pods=_deletable(obs.stale),
        events=tuple(events),
        requeue_after=_min(left, RESYNC_SECONDS),
        poll=poll_targets(job, obs) if status.phase is not Phase.RESTARTING else (),
        poll_interval=_poll_interval(job, status.phase),
    )


def poll_targets(job: Job, obs: Observation) -> tuple[Target, ...]:
    """Every process of every running pod of this attempt: pod i, process j is rank i * nproc + j."""
    spec = job.spec
    found: list[Target] = []
    for rank, pod in sorted(obs.current.items()):
        if not (pod.running and pod.ip):
            continue
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        for local in range(spec.nproc_per_node):
            url = f"http://{host}:{spec.metrics_port + local}/metrics"
            found.append(Target(rank=rank * spec.nproc_per_node + local, pod=pod.name, node=pod.node, url=url))
    return tuple(found)


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
    return min(job.spec.world_size, max(remembered, len(seen | done)))


def _fold_progress(
    job: Job, status: JobStatus, scrapes: Sequence[Scrape], events: list[Event]
) -> tuple[JobStatus, Summary | None]:
    """Fold the new polls of this attempt into status.progress and the StragglerDetected condition."""
    spec = job.spec
    old = progress.fresh(status.progress, status.attempt, spec.world_size)
    summary = progress.summarize([s for s in scrapes if s.attempt == status.attempt])
    if summary is None or (old.observed_time is not None and summary.at < old.observed_time):
        return replace(status, progress=old), None
    advanced = summary.step is not None and summary.step > (old.step or 0)
    ranks = {r.rank for r in summary.ranks}
    known = len(ranks) > 1 and ranks <= set(summary.recent_work)
    candidate = progress.straggler_candidate(summary.recent_work, spec.straggler.factor) if known else None
    state = straggler.track(old.straggler, candidate[0] if candidate else None, known=known, now=summary.at)
    new = replace(
        old,
        joined=min(spec.world_size, max(old.joined, len(summary.joined))),
        step=summary.step if summary.step is not None else old.step,
        samples_per_second=summary.samples_per_second,
        step_time_p50=summary.step_time_p50,
        window_seconds=summary.window_seconds,
        slowest_rank=summary.slowest_rank,
        last_progress_time=summary.at if advanced else old.last_progress_time,
        observed_time=summary.at,
        ranks=summary.ranks,
        straggler=state,
    )
    status = replace(status, progress=new)
    flagged = straggler.flagged(state, spec.straggler.window_seconds, summary.at)
    current = status.condition(ConditionType.STRAGGLER_DETECTED)
    if flagged and candidate and state and not (current and current.status):
        rank = next(r for r in summary.ranks if r.rank == state.rank)
        message = (
            f"rank {rank.rank} (pod {rank.pod} on node {rank.node or 'unknown'}) works {candidate[1]:.3g}s per step, "
            f"{candidate[1] / candidate[2] if candidate[2] else float('inf'):.1f}x the median of the others "
            f"({candidate[2]:.3g}s), for {spec.straggler.window_seconds}s "
            f"(spec.straggler factor {spec.straggler.factor:g}, window {spec.straggler.window_seconds}s)"
        )
        status = status.with_condition(ConditionType.STRAGGLER_DETECTED, True, Reason.STRAGGLER, message, summary.at)
        events.append(
            Event(Reason.STRAGGLER, message, warning=True, key=f"{state.rank}.{int(state.since.timestamp())}")
        )
    elif not flagged and current and current.status and known:
        message = f"every rank works within {spec.straggler.factor:g}x the median of the others"
        if current.message.startswith("rank "):
            message = current.message.split(")")[0] + f") recovered: {message}"
        status = status.with_condition(
            ConditionType.STRAGGLER_DETECTED, False, Reason.STRAGGLER_RECOVERED, message, summary.at
        )
        since = int(current.last_transition_time.timestamp()) if current.last_transition_time else 0
        events.append(Event(Reason.STRAGGLER_RECOVERED, message, key=str(since)))
    return status, summary


def _no_progress(job: Job, status: JobStatus, summary: Summary) -> str:
    """Why the progress deadline has passed (naming the ranks that did not answer), or "" if it has not."""
    prog = status.progress
    running = status.condition(ConditionType.RUNNING)
    running_since = running.last_transition_time if running and running.status else None
    last = prog.last_progress_time if prog else None
    limit = job.spec.progress_deadline_seconds
    if not progress_deadline.exceeded(limit, running_since=running_since, last_progress=last, observed=summary.at):
        return ""
    step = prog.step if prog and prog.step is not None else 0
    why = f"no rank advanced its step for {limit}s (spec.progressDeadlineSeconds={limit}); stuck at step {step}"
    silent = [f"rank {r.rank} (pod {r.pod} on node {r.node or 'unknown'})" for r in summary.ranks if r.error]
    return why + (f"; not answering: {', '.join(silent)}" if silent else "")


def plan_invalid(old: JobStatus, error: str, generation: int, now: datetime) -> Plan:
    """A spec the apiserver accepted but the operator cannot run (an old or missing CRD): fail once."""
    status = replace(old, observed_generation=generation)
    if status.phase.finished:
        return Plan(status=status)
    status = _finish(status, succeeded=False, reason=Reason.INVALID, message=error, now=now)
    return Plan(status=status, events=(Event(Reason.INVALID, error, warning=True),))
