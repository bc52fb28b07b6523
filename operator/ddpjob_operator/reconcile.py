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

from ddpjob_operator.api import Job
from ddpjob_operator.events import Event
from ddpjob_operator.policies import cleanup, deadline, restart, suspend, ttl
from ddpjob_operator.status import (
    REASON_ALL_RUNNING,
    REASON_ALL_SUCCEEDED,
    REASON_BACKOFF,
    REASON_CREATED,
    REASON_DEADLINE,
    REASON_INVALID,
    REASON_NON_RETRYABLE,
    REASON_PODS_PENDING,
    REASON_RECOVERED,
    REASON_RESUMED,
    REASON_RETRYABLE,
    REASON_SPEC_CHANGED,
    REASON_SUSPENDED,
    REASON_TTL,
    JobStatus,
    Observation,
    Phase,
    PodView,
    observe,
    summarize,
)

RESYNC_SECONDS = 300.0
"""Reconcile a live job at least this often, even when no event arrives."""
REASON_LAUNCHED = "AttemptLaunched"


@dataclass(frozen=True, kw_only=True)
class Plan:
    status: JobStatus
    create_service: bool = False
    create_ranks: tuple[int, ...] = ()
    """Ranks of ``status.attempt`` to create if absent."""
    delete_pods: tuple[PodView, ...] = ()
    delete_job: bool = False
    events: tuple[Event, ...] = field(default_factory=tuple)
    requeue_after: float | None = None


def _deletable(pods: Sequence[PodView]) -> tuple[PodView, ...]:
    return tuple(p for p in pods if not p.terminating)


def _min(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _finish(status: JobStatus, *, succeeded: bool, reason: str, message: str, now: datetime) -> JobStatus:
    status = replace(status, phase=Phase.SUCCEEDED if succeeded else Phase.FAILED, completion_time=now)
    status = status.with_condition("Succeeded" if succeeded else "Failed", True, reason, message, now)
    status = status.with_condition("Running", False, reason, message, now)
    restarting = status.condition("Restarting")
    if restarting and restarting.status:
        status = status.with_condition("Restarting", False, reason, message, now)
    return status


def _finished_plan(job: Job, status: JobStatus, obs: Observation, now: datetime, events: list[Event]) -> Plan:
    """A finished job: honour cleanPodPolicy, delete stale pods, and delete the job once its TTL is up."""
    rp = job.spec.run_policy
    failed = status.condition("Failed")
    by_deadline = bool(failed and failed.status and failed.reason == REASON_DEADLINE)
    keep = cleanup.pods_to_delete(rp.clean_pod_policy, obs.current.values(), deadline_exceeded=by_deadline)
    deletes = _deletable([*obs.stale, *(p for p in obs.current.values() if p.name in keep)])
    left = ttl.seconds_left(status.completion_time, rp.ttl_seconds_after_finished, now)
    expired = left is not None and left <= 0
    if expired:
        events.append(Event(REASON_TTL, f"deleting the job {rp.ttl_seconds_after_finished}s after it finished"))
    return Plan(
        status=summarize(status, obs, job.spec.replicas),
        delete_pods=deletes,
        delete_job=expired,
        events=tuple(events),
        requeue_after=None if expired else left,
    )


def plan(job: Job, old: JobStatus, pods: Sequence[PodView], now: datetime) -> Plan:
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
        status = status.with_condition("Created", True, REASON_CREATED, message, now)
        events.append(Event(REASON_CREATED, message))

    obs = look()
    if status.phase.finished:
        return _finished_plan(job, status, obs, now, events)

    transition = suspend.transition(rp.suspend, status.phase)
    if transition is suspend.Transition.SUSPEND:
        message = f"attempt {status.attempt} stopped: pods deleted; clear spec.runPolicy.suspend to resume"
        status = replace(status, phase=Phase.SUSPENDED, start_time=None)
        status = status.with_condition("Suspended", True, REASON_SUSPENDED, message, now)
        status = status.with_condition("Running", False, REASON_SUSPENDED, message, now)
        events.append(Event(REASON_SUSPENDED, message))
    elif transition is suspend.Transition.RESUME:
        status = replace(status, phase=Phase.PENDING, attempt=status.attempt + 1, start_time=now)
        message = f"resumed as attempt {status.attempt}"
        status = status.with_condition("Suspended", False, REASON_RESUMED, message, now)
        events.append(Event(REASON_RESUMED, message))
        obs = look()
    if status.phase is Phase.SUSPENDED:
        return Plan(
            status=summarize(status, obs, spec.replicas),
            delete_pods=_deletable([*obs.stale, *obs.current.values()]),
            events=tuple(events),
        )

    if deadline.exceeded(status.start_time, rp.active_deadline_seconds, now):
        message = f"ran longer than spec.runPolicy.activeDeadlineSeconds={rp.active_deadline_seconds}"
        status = _finish(status, succeeded=False, reason=REASON_DEADLINE, message=message, now=now)
        events.append(Event(REASON_DEADLINE, message, warning=True))
        return _finished_plan(job, status, obs, now, events)

    if obs.outdated:
        # The spec was edited while suspended and resumed before we saw it: start afresh.
        status = replace(status, phase=Phase.PENDING, attempt=status.attempt + 1)
        message = f"the pods were built from an older spec; starting attempt {status.attempt}"
        events.append(Event(REASON_SPEC_CHANGED, message))
        obs = look()

    decision = restart.decide(obs.failures, rp, status.restarts)
    if decision is not None and decision.restart:
        status = replace(status, phase=Phase.RESTARTING, attempt=status.attempt + 1, restarts=status.restarts + 1)
        message = (
            f"{decision.cause.describe()}; restarting the gang as attempt {status.attempt} "
            f"(restart {status.restarts} of {rp.backoff_limit})"
        )
        status = status.with_condition("Restarting", True, REASON_RETRYABLE, message, now)
        status = status.with_condition("Running", False, REASON_RETRYABLE, message, now)
        events.append(Event(REASON_RETRYABLE, message, warning=True))
        obs = look()
    elif decision is not None:
        if decision.backoff_exceeded:
            reason = REASON_BACKOFF
            message = f"{decision.cause.describe()}; no restarts left (spec.runPolicy.backoffLimit={rp.backoff_limit})"
        else:
            reason = REASON_NON_RETRYABLE
            message = f"{decision.cause.describe()}: not retryable under restartPolicy {rp.restart_policy.value}"
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
            events.append(Event(REASON_LAUNCHED, message))
            launched = True

    if launched and obs.all_succeeded(spec.replicas):
        message = f"all {spec.replicas} ranks exited 0 (attempt {status.attempt})"
        status = _finish(status, succeeded=True, reason=REASON_ALL_SUCCEEDED, message=message, now=now)
        events.append(Event(REASON_ALL_SUCCEEDED, message))
        return _finished_plan(job, status, obs, now, events)
    if launched and obs.all_started(spec.replicas):
        if status.phase is not Phase.RUNNING:
            status = replace(status, phase=Phase.RUNNING)
            message = f"all {spec.replicas} ranks are running (attempt {status.attempt})"
            status = status.with_condition("Running", True, REASON_ALL_RUNNING, message, now)
            restarting = status.condition("Restarting")
            if restarting and restarting.status:
                status = status.with_condition("Restarting", False, REASON_RECOVERED, message, now)
            events.append(Event(REASON_ALL_RUNNING, message))
    elif status.phase not in (Phase.RESTARTING, Phase.RUNNING):  # within an attempt, Running stays Running
        status = replace(status, phase=Phase.PENDING)
        if status.condition("Running") is None:
            status = status.with_condition("Running", False, REASON_PODS_PENDING, "no rank has started yet", now)

    left = deadline.seconds_left(status.start_time, rp.active_deadline_seconds, now)
    return Plan(
        status=summarize(status, obs, spec.replicas),
        create_service=True,
        create_ranks=creates,
        delete_pods=_deletable(obs.stale),
        events=tuple(events),
        requeue_after=_min(left, RESYNC_SECONDS),
    )


def plan_invalid(old: JobStatus, error: str, generation: int, now: datetime) -> Plan:
    """A spec the apiserver accepted but the operator cannot run (an old or missing CRD): fail once."""
    status = replace(old, observed_generation=generation)
    if status.phase.finished:
        return Plan(status=status)
    status = _finish(status, succeeded=False, reason=REASON_INVALID, message=error, now=now)
    return Plan(status=status, events=(Event(REASON_INVALID, error, warning=True),))
