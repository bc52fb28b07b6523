"""One reconcile of one job: read it and its pods, plan (pure), then execute the plan.

The order is what makes a crash harmless: the status (attempt, restarts) is written first and
with the resourceVersion we read, then pods are deleted, then created if absent. Replaying any
prefix of this sequence converges to the same end state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from ddpjob_operator import builders, faults, metrics
from ddpjob_operator.api import Job, SpecError, parse_job
from ddpjob_operator.events import Event, event_body
from ddpjob_operator.kube import Conflict, Kube, KubeError
from ddpjob_operator.progress import Scrape, Target
from ddpjob_operator.reconcile import Plan, plan, plan_invalid
from ddpjob_operator.status import JobStatus, Phase, parse_status, pod_view

log = logging.getLogger("ddpjob_operator")

OWNED_STATUS = frozenset(JobStatus().to_dict())
REASON_POD_CREATE_FAILED = "PodCreateFailed"
REASON_INVALID_POD = "InvalidPodTemplate"


class Progress(Protocol):
    """What a reconcile needs from the poller: the scrapes taken so far, and where to poll next."""

    def scrapes(self, key: tuple[str, str]) -> Sequence[Scrape]: ...

    def track(self, key: tuple[str, str], attempt: int, targets: tuple[Target, ...], interval: float) -> None: ...


def _owned(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k in OWNED_STATUS and v is not None}


def reconcile(
    kube: Kube, namespace: str, name: str, now: datetime | None = None, progress: Progress | None = None
) -> float | None:
    """Reconcile once; returns seconds until the job needs another look (None: only on events)."""
    started = time.perf_counter()
    try:
        return _reconcile(kube, namespace, name, now or datetime.now(UTC), progress)
    finally:
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _reconcile(kube: Kube, namespace: str, name: str, now: datetime, progress: Progress | None) -> float | None:
    key = (namespace, name)
    body = kube.get_job(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        if progress is not None:
            progress.track(key, 0, (), 0.0)
        return None  # gone or going: owner references let the garbage collector take the children
    old = parse_status(body.get("status"))
    try:
        job: Job | None = parse_job(body)
    except SpecError as err:
        job = None
        the_plan = plan_invalid(old, str(err), int(body["metadata"].get("generation") or 0), now)
    else:
        assert job is not None
        pods = [pod_view(p, job.spec.trainer_container) for p in kube.list_pods(namespace, name)]
        the_plan = plan(job, old, pods, now, progress.scrapes(key) if progress is not None else ())
    try:
        if not _write_status(kube, body, old, the_plan.status):
            return 0.0  # someone wrote in between: look again at once
    except KubeError as err:
        if err.status == 404:
            return None  # deleted since we read it
        raise
    _post_events(kube, body, the_plan.status.attempt, the_plan.events, now)
    if progress is not None:
        progress.track(key, the_plan.status.attempt, the_plan.poll, the_plan.poll_interval)
    if job is None:
        return None
    for pod in the_plan.delete_pods:
        kube.delete_pod(namespace, pod.name, pod.uid)
        faults.point("pod-deleted")
    if the_plan.create_service:
        kube.create(builders.service(job))
    try:
        for rank in the_plan.create_ranks:
            kube.create(builders.pod(job, rank, the_plan.status.attempt))
            faults.point("pod-created")
    except KubeError as err:
        return _create_failed(kube, body, job, the_plan, err, now)
    if the_plan.delete_job:
        kube.delete_job(namespace, name, job.uid)
        return None
    return the_plan.requeue_after


def _write_status(kube: Kube, body: dict[str, Any], old: JobStatus, new: JobStatus) -> bool:
    raw = body.get("status") or {}
    wanted = _owned(new.to_dict())
    if _owned(raw) == wanted:
        return True
    updated = {**body, "status": {**{k: v for k, v in raw.items() if k not in OWNED_STATUS}, **wanted}}
    try:
        kube.replace_job_status(updated)
    except Conflict:
        return False
    _count_transition(old, new)
    meta = body["metadata"]
    if old.phase != new.phase or old.attempt != new.attempt:
        log.info("%s/%s: %s -> %s (attempt %d, restarts %d)", meta["namespace"], meta["name"],
                 old.phase.value or "new", new.phase.value, new.attempt, new.restarts)  # fmt: skip
    return True


def _count_transition(old: JobStatus, new: JobStatus) -> None:
    if old.phase is Phase.NEW and new.phase is not Phase.NEW:
        metrics.JOBS_CREATED.inc()
    if new.phase is not old.phase and new.phase is Phase.SUCCEEDED:
        metrics.JOBS_SUCCEEDED.inc()
    if new.phase is not old.phase and new.phase is Phase.FAILED:
        failed = new.condition("Failed")
        metrics.JOBS_FAILED.labels(reason=failed.reason if failed else "").inc()
    if new.restarts > old.restarts:
        metrics.JOBS_RESTARTED.inc(new.restarts - old.restarts)


def _post_events(kube: Kube, body: Mapping[str, Any], attempt: int, events: tuple[Event, ...], now: datetime) -> None:
    meta = body["metadata"]
    for event in events:
        try:
            kube.create(event_body(namespace=meta["namespace"], name=meta["name"], uid=meta.get("uid", ""),
                                   attempt=attempt, event=event, now=now))  # fmt: skip
        except KubeError as err:  # events are best effort
            log.warning("could not post event %s for %s/%s: %s", event.reason, meta["namespace"], meta["name"], err)


def _create_failed(
    kube: Kube, body: dict[str, Any], job: Job, the_plan: Plan, err: KubeError, now: datetime
) -> float | None:
    """A pod the apiserver refuses as invalid fails the job (retrying cannot help); any other
    refusal (quota, admission policy) is reported once per attempt and retried with backoff."""
    if err.status in (400, 422):
        message = f"the apiserver refused a pod built from spec.template: {err}"
        failed = plan_invalid(the_plan.status, message, job.generation, now).status
        failed = failed.with_condition("Failed", True, REASON_INVALID_POD, message, now)
        fresh = kube.get_job(job.namespace, job.name)
        if fresh is not None:
            _write_status(kube, fresh, parse_status(fresh.get("status")), failed)
            _post_events(kube, fresh, failed.attempt, (Event(REASON_INVALID_POD, message, warning=True),), now)
        return 0.0
    _post_events(kube, body, the_plan.status.attempt, (Event(REASON_POD_CREATE_FAILED, str(err), warning=True),), now)
    raise err
