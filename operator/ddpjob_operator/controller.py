"""One reconcile of one job: read it and its pods, plan (pure), then execute the plan.

The order is what makes a crash harmless: the status (attempt, restarts) is written first and
with the resourceVersion we read, then pods are deleted, then created if absent. Replaying any
prefix of this sequence converges to the same end state.

The pods come from the watch-fed ``PodCache`` when there is one. It may lag: creating a pod it
does not show yet is harmless (create-if-absent), but a plan that would end an attempt, delete
pods or finish the job is made again from a LIST before anything is written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future, wait
from datetime import UTC, datetime
from typing import Any, Protocol

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import builders, faults, metrics
from ddpjob_operator.api import Job, Key, SpecError, parse_job
from ddpjob_operator.events import Event, event_body
from ddpjob_operator.kube import Conflict, Kube, KubeError
from ddpjob_operator.podcache import PodCache, PodIndex
from ddpjob_operator.progress import Scrape, Target
from ddpjob_operator.reconcile import Plan, plan, plan_invalid
from ddpjob_operator.status import JobStatus, parse_status, pod_view

log = logging.getLogger("ddpjob_operator")

OWNED_STATUS = frozenset(JobStatus().to_dict())
CREATE_PARALLELISM = 8
"""Pods of one job created at once. A crash mid-wave leaves at most one wave's pods: harmless, as
creates are create-if-absent and the status (written first) says which attempt they belong to."""


class Progress(Protocol):
    """What a reconcile needs from the poller: the scrapes taken so far, and where to poll next."""

    def scrapes(self, key: Key) -> Sequence[Scrape]: ...

    def track(self, key: Key, attempt: int, targets: tuple[Target, ...], interval: float) -> None: ...


class Bodies:
    """The newest body of each job seen (watch events, our own status writes): saves a GET per reconcile.

    It may lag, never lead: watch events arrive in order, each wakes the job's worker, and our own
    write is kept only if no event came in since the body it was based on. A lagging body is
    harmless: the status write carries its resourceVersion and fails, and a plan that would act
    without writing the status reads the job again first.
    """

    def __init__(self) -> None:
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Key) -> dict[str, Any] | None:
        return self._bodies.get(key)

    def put(self, key: Key, body: dict[str, Any]) -> bool:
        """From the watch: the newest by definition. False when it is the echo of the body we hold
        (our own status write coming back): the reconcile that wrote it has already acted on it."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            held = self._bodies.get(key)
            self._bodies[key] = body
        return version is None or held is None or (held.get("metadata") or {}).get("resourceVersion") != version

    def wrote(self, key: Key, seen: dict[str, Any] | None, written: dict[str, Any]) -> None:
        """Our write of ``seen`` (None: read with a GET) answered ``written``."""
        with self._lock:
            if self._bodies.get(key) is seen:
                self._bodies[key] = written

    def drop(self, key: Key) -> None:
        with self._lock:
            self._bodies.pop(key, None)

    def __len__(self) -> int:
        return len(self._bodies)


def _owned(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k in OWNED_STATUS and v is not None}


def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    now: datetime | None = None,
    progress: Progress | None = None,
    *,
    bodies: Bodies | None = None,
    pods: PodCache | None = None,
    creates: Executor | None = None,
    events: Executor | None = None,
) -> float | None:
    """Reconcile once; returns seconds until the job needs another look (None: only on events).

    ``pods``: the watch-fed pods (else a LIST each time); ``creates``: threads to create a job's
    pods in parallel (else one after another); ``events``: threads to post Events without waiting
    for them (else inline).
    """
    started = time.perf_counter()
    try:
        return _reconcile(kube, namespace, name, now or datetime.now(UTC), progress, bodies, pods, creates, events)
    finally:
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _acts(the_plan: Plan) -> bool:
    return bool(the_plan.create_ranks or the_plan.delete_pods or the_plan.delete_job or the_plan.events
                or the_plan.create_service)  # fmt: skip


def _ends_something(old: JobStatus, the_plan: Plan) -> bool:
    """Whether the plan deletes pods, starts a new attempt or finishes the job: not to be done on a lagging view."""
    new = the_plan.status
    return bool(the_plan.delete_pods or the_plan.delete_job or new.attempt != old.attempt
                or new.restarts != old.restarts or (new.phase is not old.phase and new.phase.finished))  # fmt: skip


def _reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    now: datetime,
    progress: Progress | None,
    bodies: Bodies | None,
    cache: PodCache | None,
    creates: Executor | None,
    events: Executor | None,
) -> float | None:
    key = (namespace, name)
    cached = bodies.get(key) if bodies is not None else None
    body = cached if cached is not None else kube.get_job(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        if bodies is not None:
            bodies.drop(key)
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
        scrapes = progress.scrapes(key) if progress is not None else ()

        def plan_from(raw_pods: list[dict[str, Any]]) -> Plan:
            assert job is not None
            return plan(job, old, [pod_view(p, job.spec.trainer_container) for p in raw_pods], now, scrapes)

        watched = cache.pods(key) if cache is not None else None
        the_plan = plan_from(watched if watched is not None else kube.list_pods(namespace, name))
        if watched is not None and _ends_something(old, the_plan):
            the_plan = plan_from(kube.list_pods(namespace, name))
    try:
        written = _write_status(kube, body, old, the_plan.status)
    except KubeError as err:
        if err.status == 404:
            if bodies is not None:
                bodies.drop(key)
            return None  # deleted since we read it
        raise
    if bodies is not None:
        if written is None or (written is cached and _acts(the_plan)):
            bodies.drop(key)  # stale, or not known to be current: act only on a body just read or written
            return 0.0
        if written is not body:
            bodies.wrote(key, cached, written)
    if written is None:
        return 0.0  # someone wrote in between: look again at once
    if events is not None and the_plan.events:
        events.submit(_post_events, kube, body, the_plan.status.attempt, the_plan.events, now)
    else:
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
        _create_pods(kube, job, the_plan.status.attempt, the_plan.create_ranks, creates,
                     cache.index if cache is not None else None)  # fmt: skip
    except KubeError as err:
        return _create_failed(kube, body, job, the_plan, err, now)
    if the_plan.delete_job:
        kube.delete_job(namespace, name, job.uid)
        return None
    if the_plan.create_ranks:
        return 0.0  # look again at once: with the pods now there, the status says the attempt launched
    return the_plan.requeue_after


def _create_pods(
    kube: Kube, job: Job, attempt: int, ranks: tuple[int, ...], pool: Executor | None, index: PodIndex | None
) -> None:
    """Create if absent, in waves of CREATE_PARALLELISM on ``pool``; raises the lowest rank's error.

    Each pod created goes into ``index`` at once, so a reconcile before the watch sees it does not
    create it again.
    """

    def create(rank: int) -> None:
        created = kube.create(builders.pod(job, rank, attempt))
        if created is not None and index is not None:
            index.created(created)
        faults.point("pod-created")

    if pool is None:
        for rank in ranks:
            create(rank)
        return
    for start in range(0, len(ranks), CREATE_PARALLELISM):
        wave: list[Future[None]] = [pool.submit(create, r) for r in ranks[start : start + CREATE_PARALLELISM]]
        wait(wave)
        for future in wave:
            future.result()


def _write_status(kube: Kube, body: dict[str, Any], old: JobStatus, new: JobStatus) -> dict[str, Any] | None:
    """The job as it now stands (``body`` itself when nothing changed); None when someone wrote in between."""
    raw = body.get("status") or {}
    wanted = _owned(new.to_dict())
    if _owned(raw) == wanted:
        return body
    updated = {**body, "status": {**{k: v for k, v in raw.items() if k not in OWNED_STATUS}, **wanted}}
    try:
        written = kube.replace_job_status(updated)
    except Conflict:
        return None
    _count_transition(old, new)
    meta = body["metadata"]
    if old.phase != new.phase or old.attempt != new.attempt:
        log.info("%s/%s: %s -> %s (attempt %d, restarts %d)", meta["namespace"], meta["name"],
                 old.phase.value or "new", new.phase.value, new.attempt, new.restarts)  # fmt: skip
    return written or updated


def _count_transition(old: JobStatus, new: JobStatus) -> None:
    if old.phase is Phase.NEW and new.phase is not Phase.NEW:
        metrics.JOBS_CREATED.inc()
    if new.phase is not old.phase and new.phase is Phase.SUCCEEDED:
        metrics.JOBS_SUCCEEDED.inc()
    if new.phase is not old.phase and new.phase is Phase.FAILED:
        failed = new.condition(ConditionType.FAILED)
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
        failed = failed.with_condition(ConditionType.FAILED, True, Reason.INVALID_POD, message, now)
        fresh = kube.get_job(job.namespace, job.name)
        if fresh is not None:
            _write_status(kube, fresh, parse_status(fresh.get("status")), failed)
            _post_events(kube, fresh, failed.attempt, (Event(Reason.INVALID_POD, message, warning=True),), now)
        return 0.0
    _post_events(kube, body, the_plan.status.attempt, (Event(Reason.POD_CREATE_FAILED, str(err), warning=True),), now)
    raise err
