"""cleanPodPolicy once the job has finished.

``All`` deletes every pod. ``Running`` (the default) deletes the pods still running, keeping the
finished ones for their logs. A pod whose trainer has exited is finished unless a sidecar in it still
runs, though kubelet reports its phase as Running until it has torn the pod down, seconds later.
``None`` deletes nothing: after a failure the surviving ranks stay up, to be inspected (py-spy, exec).
A job that ran past its deadline loses its running pods whatever the policy (the deadline is a limit
on resources), and so does one whose ranks were stuck exiting after the training was done
(``stop_running``; policies.exit_grace).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from ddpjob_contract.status import ConditionType, Reason
from ddpjob_operator import progress_fold
from ddpjob_operator.actions import Plan, deletable
from ddpjob_operator.api import CleanPodPolicy, Job
from ddpjob_operator.events import Event
from ddpjob_operator.policies import ttl
from ddpjob_operator.status import JobStatus, Observation, PodView, with_counts


def pods_to_delete(policy: CleanPodPolicy, pods: Iterable[PodView], *, stop_running: bool = False) -> list[str]:
    chosen = []
    for pod in pods:
        if pod.terminating:
            continue
        if policy is CleanPodPolicy.ALL or ((policy is CleanPodPolicy.RUNNING or stop_running) and not pod.finished):
            chosen.append(pod.name)
    return chosen


def finished_plan(job: Job, status: JobStatus, obs: Observation, now: datetime, events: tuple[Event, ...]) -> Plan:
    """A finished job: its progress holds its outcome, not its last poll (``progress_fold.outcome``); honour
    cleanPodPolicy, delete stale pods, and delete the job once its TTL is up."""
    rp = job.spec.run_policy
    status = replace(status, progress=progress_fold.outcome(job, status, obs))
    failed = status.condition(ConditionType.FAILED)
    succeeded = status.condition(ConditionType.SUCCEEDED)
    stop_running = bool(failed and failed.status and failed.reason == Reason.DEADLINE) or bool(
        succeeded and succeeded.status and succeeded.reason == Reason.STUCK_EXITING
    )
    keep = pods_to_delete(rp.clean_pod_policy, obs.current.values(), stop_running=stop_running)
    deletes = deletable([*obs.stale, *(p for p in obs.current.values() if p.name in keep)])
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
