"""The ``Controller``: one reconcile of one job: read it and its pods, plan (pure), then execute the plan.

The order is what makes a crash harmless: the status (attempt, restarts) is written first and
with the resourceVersion we read, then pods are deleted, then created if absent. Replaying any
prefix of this sequence converges to the same end state. A new job's first pods are the one
exception: they go out before its first status, whose one write then says the job is Pending and
launched (a crash in between leaves no status to honour, and the next plan finds the pods).

The pods come from the watch-fed pod cache (a LIST until it has synced). It may lag: creating a
pod it does not show yet is harmless (create-if-absent), but a plan that would end an attempt,
delete pods or finish the job is made again from a LIST before anything is written.

Its collaborators are required and typed as Protocols (``Api``, ``Pods``, ``Progress``, ``Clock``):
production passes ``kube.Kube``, ``podcache.PodCache``, ``poller.Poller`` and the wall clock, tests
pass fakes, and both run the same code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from datetime import datetime
from functools import partial
from typing import Any, Protocol

from ddpjob_contract import faults
from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import actions, builders, metrics, queueing, write_pace
from ddpjob_operator.actions import Plan
from ddpjob_operator.api import InPlaceRestart, Job, Key, SpecError, parse_job
from ddpjob_operator.events import Event, event_body
from ddpjob_operator.kube import Conflict, KubeError, NamespaceTerminating, NotServed
from ddpjob_operator.lifecycle import as_admitted, plan, plan_invalid
from ddpjob_operator.node_health import NodeHealth
from ddpjob_operator.policies import in_place
from ddpjob_operator.progress import Scrape, Target
from ddpjob_operator.queueing import NOT_QUEUED, Placement, Queueing, workload_name
from ddpjob_operator.remembered import Bodies, Remembered, resource_version
from ddpjob_operator.status import JobStatus, parse_status, pod_view
from ddpjob_operator.times import to_time

log = logging.getLogger("ddpjob_operator")

OWNED_STATUS = frozenset(JobStatus().to_dict())
CREATE_PARALLELISM = 8
"""Pods of one job created at once. A crash mid-wave leaves at most one wave's pods: harmless, as
creates are create-if-absent and the status (written first) says which attempt they belong to."""


Clock = Callable[[], datetime]
"""The reconcile's notion of now (aware, UTC)."""


class Api(Protocol):
    """What a reconcile asks of the apiserver (``kube.Kube``)."""

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]: ...

    def replace_job_status(self, job: Mapping[str, Any]) -> dict[str, Any]: ...

    def create(self, obj: Mapping[str, Any]) -> bool: ...

    def create_pod(self, pod: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def delete_pod(self, namespace: str, name: str, uid: str = "", *, force: bool = False) -> None: ...

    def delete_job(self, namespace: str, name: str, uid: str) -> None: ...

    def get_namespace(self, name: str) -> dict[str, Any] | None: ...

    def delete_pod_groups(self, namespace: str, job_name: str, keep_attempt: int) -> None: ...

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...

    def restarts_in_place(self, namespace: str) -> bool: ...


class Pods(Protocol):
    """The watch-fed pods (``podcache.PodCache``)."""

    def pods(self, key: Key) -> list[dict[str, Any]] | None:
        """The job's pods as last seen; None until the cache has synced (the controller then lists them)."""
        ...

    def created(self, pod: dict[str, Any]) -> None:
        """The answer to our own write of a pod (its create, its adoption): taken in unless the watch holds newer."""
        ...

    def stopped(self, key: Key) -> list[dict[str, Any]]:
        """The final state of the job's newest deleted pod that stopped after saving a checkpoint ([]: none)."""
        ...

    def forget(self, key: Key) -> None: ...


class Nodes(Protocol):
    """The watch-fed nodes (``nodewatch.NodeWatch``)."""

    def health(self) -> NodeHealth:
        """The nodes known to be lost or sick now."""
        ...


class Kueue(Protocol):
    """Kueue's API (``workloads.Kueue``): a job's Workload, the objects its admission names, and the writes."""

    def watched(self, namespace: str) -> bool: ...

    def workload(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def flavor(self, name: str) -> dict[str, Any] | None: ...

    def priority_class(self, name: str) -> dict[str, Any] | None: ...

    def create(self, workload: Mapping[str, Any]) -> bool: ...

    def apply_status(self, manager: str, body: Mapping[str, Any]) -> None: ...

    def release(self, namespace: str, name: str) -> None: ...


class Progress(Protocol):
    """What a reconcile needs from the poller: the scrapes taken so far, and where to poll next."""

    def scrapes(self, key: Key) -> Sequence[Scrape]: ...

    def track(self, key: Key, attempt: int, targets: tuple[Target, ...], interval: float) -> None: ...


def _owned(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k in OWNED_STATUS and v is not None}


def _acts(the_plan: Plan) -> bool:
    return bool(the_plan.create_ranks or the_plan.delete_pods or the_plan.force_delete_pods
                or the_plan.delete_job or the_plan.events
                or the_plan.create_service or the_plan.create_workload or the_plan.workload_status
                or the_plan.release_workload or the_plan.adopt_pods)  # fmt: skip


def _ends_something(old: JobStatus, the_plan: Plan) -> bool:
    """Whether the plan deletes pods, starts a new attempt or finishes the job: not to be done on a lagging view."""
    new = the_plan.status
    return bool(the_plan.delete_pods or the_plan.force_delete_pods or the_plan.delete_job or new.attempt != old.attempt
                or new.restarts != old.restarts or (new.phase is not old.phase and new.phase.finished))  # fmt: skip


class Controller:
    """Reconciles one job at a time (the work queue keeps one worker per job); thread-safe across jobs.

    ``creates``: threads to create a job's pods in parallel; ``events``: threads to post Events
    without waiting for them; ``pod_groups``: whether the cluster serves PodGroups (gang scheduling).
    """

    def __init__(
        self,
        api: Api,
        pods: Pods,
        progress: Progress,
        clock: Clock,
        *,
        nodes: Nodes,
        kueue: Kueue,
        creates: Executor,
        events: Executor,
        pod_groups: bool,
    ) -> None:
        self.pod_groups = pod_groups
        self.remembered = Remembered()
        self._api = api
        self._pods = pods
        self._nodes = nodes
        self._kueue = kueue
        self._progress = progress
        self._clock = clock
        self._creates = creates
        self._events = events

    @property
    def bodies(self) -> Bodies:
        return self.remembered.bodies

    def reconcile(self, key: Key) -> float | None:
        """Reconcile once; returns seconds until the job needs another look (None: only on events)."""
        started = time.perf_counter()
        try:
            return self._reconcile(key, self._clock())
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    def _reconcile(self, key: Key, now: datetime) -> float | None:
        cached = self.bodies.get(key)
        body = cached if cached is not None else self._api.get_job(*key)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            self._gone(key)
            return None
        if self._in_terminating_namespace(key, body):
            return None
        old = parse_status(body.get("status"))
        job, the_plan = self._plan(key, body, old, now)
        if _ends_something(old, the_plan) and self._namespace_deleted(key, now, refused=False):
            return None  # its pods went with the namespace: not a failure, and nothing is to be made there
        if self._launches_unwritten(key, old, the_plan):
            return self._launch_before_status(key, cached, body, job, the_plan, now)
        self.remembered.launching.discard(key)
        paced = self._paced(key, old, the_plan, now)
        if paced:
            self._progress.track(key, the_plan.status.attempt, the_plan.poll, the_plan.poll_interval)
            return paced if the_plan.requeue_after is None else min(paced, the_plan.requeue_after)
        try:
            written = _write_status(self._api, body, old, the_plan.status)
        except KubeError as err:
            self._write_failed(key, err)
            return None
        if written is None or (written is cached and _acts(the_plan)):
            self.bodies.drop(key)  # stale, or not known to be current: act only on a body just read or written
            return 0.0
        if written is not body:
            self.remembered.written[key] = now
        self._written(key, cached, body, written, the_plan, now)
        return None if job is None else self._execute(key, body, job, the_plan, now)

    def _paced(self, key: Key, old: JobStatus, the_plan: Plan, now: datetime) -> float:
        """Seconds a status change that decides nothing waits for the job's next write (``write_pace``); 0: write
        now. A plan that acts writes first, at once."""
        if _acts(the_plan) or old == the_plan.status or not write_pace.observed_only(old, the_plan.status):
            return 0.0
        return write_pace.wait(self.remembered.written.get(key), now)

    def _gone(self, key: Key) -> None:
        """The job is gone or going: owner references let the garbage collector take its children. Kueue holds the
        quota until its Workload's finalizer goes (the collector then deletes it): released here, and forgotten
        only once released, so a failed release is retried with the next reconcile."""
        self.forget(key)
        workload = self.remembered.workloads.get(key)
        if workload is not None:
            self._kueue.release(key[0], workload)
            self.remembered.workloads.pop(key, None)

    def _launch_before_status(
        self, key: Key, cached: dict[str, Any] | None, body: dict[str, Any], job: Job | None, the_plan: Plan,
        now: datetime,
    ) -> float | None:  # fmt: skip
        """A new job's first pods, before its first status write (``_launches_unwritten``)."""
        if cached is not None and not self._still_current(key, cached):
            return 0.0  # changed (or gone) since the watch delivered it: plan again from what was read
        self.remembered.launching.add(key)
        if cached is None:
            self.bodies.read(key, body)
        return None if job is None else self._execute(key, body, job, the_plan, now)

    def _write_failed(self, key: Key, err: KubeError) -> None:
        """A status write failed: a job deleted since it was read is dropped; anything else is raised again."""
        if err.status == 404 and not isinstance(err, NotServed):
            self.bodies.drop(key)  # deleted since we read it
            return
        raise err  # NotServed: the apiserver does not serve DDPJobs just now, which says nothing of this job

    def _written(
        self, key: Key, cached: dict[str, Any] | None, body: dict[str, Any], written: dict[str, Any], the_plan: Plan,
        now: datetime,
    ) -> None:  # fmt: skip
        """The status is written: keep the body it answered, post the plan's Events, poll as it says."""
        if written is not body:
            self.bodies.wrote(key, cached, written)
        self.remembered.refused.pop(key, None)  # the status now says so
        if the_plan.events:
            self._events.submit(_post_events, self._api, body, the_plan.status.attempt, the_plan.events, now)
        self._progress.track(key, the_plan.status.attempt, the_plan.poll, the_plan.poll_interval)

    def reports_only(self, key: Key) -> bool:
        """Whether the job's next reconcile is to write the first status of the pods its last one made
        (``_launches_unwritten``): a report, which may wait while other jobs' pods are to be made."""
        return key in self.remembered.launching

    def _still_current(self, key: Key, cached: dict[str, Any]) -> bool:
        """Whether the job is still as the watch delivered it (a GET answers its resourceVersion), as a status write
        would have proved before pods are made: a job deleted and made again under its name since then must not get
        pods owned by the old one. Otherwise the body read (or its absence) replaces it."""
        fresh = self._api.get_job(*key)
        if fresh is None:
            self.bodies.drop(key)
            return False
        if resource_version(fresh) == resource_version(cached):
            return True
        self.bodies.wrote(key, cached, fresh)
        return False

    def _launches_unwritten(self, key: Key, old: JobStatus, the_plan: Plan) -> bool:
        """Whether this is a new job's first try at its first pods: they go out before its first status write, and
        that write, in the reconcile their creation starts at once, says both that the job is Pending and that its
        attempt launched. One status write per new job, not two, and no Event before it (the next plan makes the
        same Created Event). Only once: a retry, or a create that failed, writes first, so the status says why."""
        tried = (
            key in self.remembered.launching or key in self.remembered.failed_creates or key in self.remembered.refused
        )
        first = old.phase is Phase.NEW and the_plan.status.phase is Phase.PENDING
        return first and bool(the_plan.create_ranks) and not tried

    def _in_terminating_namespace(self, key: Key, body: Mapping[str, Any]) -> bool:
        since = self.remembered.terminating.get(key[0])
        if since is None:
            return False
        created = to_time(body["metadata"].get("creationTimestamp"))
        if created is not None and created > since:
            del self.remembered.terminating[key[0]]  # made after that deletion began: the namespace was made anew
            return False
        self._leave(key)
        return True

    def _namespace_deleted(self, key: Key, now: datetime, *, refused: bool) -> bool:
        """Whether the job's namespace is being deleted (or is gone); if so, leave the job, in one line.

        ``refused``: a create was refused because it is (the deletion's start is then read, or
        taken as now where the operator may not read namespaces).
        """
        since: datetime | None = None
        try:
            namespace = self._api.get_namespace(key[0])
        except KubeError as err:  # a namespaced install may not read namespaces: its creates will tell
            if not refused:
                log.debug("could not read namespace %s: %s", key[0], err)
                return False
            since = now  # being deleted, since when unknown
        else:
            if namespace is not None:  # None: gone already
                since = to_time((namespace.get("metadata") or {}).get("deletionTimestamp"))
                if since is None:
                    return False
        if since is not None:
            self.remembered.terminating[key[0]] = since
        log.info("%s/%s: its namespace is being deleted; leaving the job to it", *key)
        self._leave(key)
        return True

    def _leave(self, key: Key) -> None:
        """Stop working on a job of a namespace being deleted. Its body is kept: the pods' deletions
        wake it again, and with the body at hand each such reconcile asks the apiserver nothing."""
        self.remembered.refused.pop(key, None)
        self._progress.track(key, 0, (), 0.0)

    def forget(self, key: Key) -> None:
        """The job is gone: drop what we held of it and stop polling it."""
        self.remembered.forget(key)
        self._progress.track(key, 0, (), 0.0)
        self._pods.forget(key)

    def _plan(self, key: Key, body: dict[str, Any], old: JobStatus, now: datetime) -> tuple[Job | None, Plan]:
        try:
            job = parse_job(body)
        except SpecError as err:
            return None, plan_invalid(old, str(err), int(body["metadata"].get("generation") or 0), now)
        scrapes = self._progress.scrapes(key)
        refused = self.remembered.refused.get(key, "")
        failed_create = self.remembered.failed_creates.get(key, "")
        queued = self._queueing(key, job)
        stopped = [pod_view(p, job.spec.trainer_container) for p in self._pods.stopped(key)]
        health = self._nodes.health()

        def plan_from(raw_pods: list[dict[str, Any]]) -> Plan:
            views = [pod_view(p, job.spec.trainer_container) for p in raw_pods]
            return plan(job, old, views, now, scrapes, refused=refused, failed_create=failed_create,
                        pod_groups=self.pod_groups, queued=queued, stopped=stopped, nodes=health)  # fmt: skip

        watched = self._pods.pods(key)
        the_plan = plan_from(watched if watched is not None else self._api.list_pods(*key))
        if watched is not None and _ends_something(old, the_plan):
            the_plan = plan_from(self._api.list_pods(*key))
        return job, the_plan

    def _queueing(self, key: Key, job: Job) -> Queueing:
        """What Kueue says of a job labelled with a queue: its Workload, and the flavors its admission names."""
        if not job.queue:
            return NOT_QUEUED
        name = workload_name(job.name, job.uid)
        self.remembered.workloads[key] = name
        try:
            workload = self._kueue.workload(job.namespace, name)
        except NotServed:
            return queueing.read(job.queue, None, {}, name=name, served=False)
        flavors = {flavor: self._kueue.flavor(flavor) or {} for flavor in queueing.assigned_flavors(workload or {})}
        missing = ""
        if workload is None and job.priority_class and self._priority(job) is None:
            missing = (f"its label kueue.x-k8s.io/priority-class names WorkloadPriorityClass {job.priority_class}, "
                       f"which does not exist: create it, or fix the label")  # fmt: skip
        return queueing.read(
            job.queue,
            workload,
            flavors,
            name=name,
            watched=self._kueue.watched(job.namespace),
            priority_missing=missing,
            create_failed=self.remembered.workload_failures.get(key, "") if workload is None else "",
        )

    def _priority(self, job: Job) -> builders.Priority | None:
        if not job.priority_class:
            return None
        found = self._kueue.priority_class(job.priority_class)
        return None if found is None else builders.Priority(job.priority_class, int(found.get("value") or 0))

    def _tell_kueue(self, job: Job, the_plan: Plan) -> None:
        """Write what the plan tells Kueue and drop its finalizer: each idempotent, after the pods are made (a
        Kueue that does not answer now delays what it is told, never the pods it admitted)."""
        for write in the_plan.workload_status:
            self._kueue.apply_status(write.manager, write.body)
        if the_plan.release_workload:
            self._kueue.release(job.namespace, workload_name(job.name, job.uid))

    def _execute(self, key: Key, body: dict[str, Any], job: Job, the_plan: Plan, now: datetime) -> float | None:
        """Delete, then create if absent, then delete the job: the plan's status is already written."""
        self._delete_and_adopt_pods(key, job, the_plan)
        attempt = the_plan.status.attempt
        try:
            if the_plan.create_workload:  # before any pod: none is made until Kueue admits it
                self._create_workload(key, job)
            job = as_admitted(job, the_plan.status)  # the ranks Kueue admitted: the gang, its PodGroup, WORLD_SIZE
            self._create_before_pods(job, attempt, service=the_plan.create_service,
                                     pod_group=the_plan.create_pod_group)  # fmt: skip
        except NamespaceTerminating:
            if not self._namespace_deleted(key, now, refused=True):
                raise  # refused, yet the namespace is not being deleted: retried with backoff, and logged
            return None
        try:
            self._create_ranks(job, attempt, the_plan)
        except NamespaceTerminating:
            if not self._namespace_deleted(key, now, refused=True):
                raise
            return None
        except KubeError as err:
            if err.status not in (400, 422):  # quota, an admission policy: reported, retried with backoff
                self.remembered.failed_creates[key] = str(err)
                event = Event(Reason.POD_CREATE_FAILED, str(err), warning=True)
                self._events.submit(_post_events, self._api, body, the_plan.status.attempt, (event,), now)
                raise
            # Invalid: retrying cannot help. The next plan fails the job, in its one status write.
            self.remembered.refused[key] = f"the apiserver refused a pod built from spec.template: {err}"
            return 0.0
        if the_plan.create_ranks:
            self.remembered.failed_creates.pop(key, None)  # they exist now: the next status says so
        self._tell_kueue(job, the_plan)
        if the_plan.delete_job:
            self._api.delete_job(job.namespace, job.name, job.uid)
            return None
        return actions.next_look(the_plan)

    def _delete_and_adopt_pods(self, key: Key, job: Job, the_plan: Plan) -> None:
        """The plan's pods deleted, those on a lost node first and at once; then those restarted in place by their
        kubelet moved into the plan's attempt."""
        for pod in the_plan.force_delete_pods:  # on a lost node, whose kubelet cannot confirm: policies.node_loss
            log.info("%s/%s: deleting pod %s at once: its node %s is lost", *key, pod.name, pod.node)
            self._api.delete_pod(job.namespace, pod.name, pod.uid, force=True)
            faults.point("pod-deleted")
        for pod in the_plan.delete_pods:
            self._api.delete_pod(job.namespace, pod.name, pod.uid)
            faults.point("pod-deleted")
        attempt = the_plan.status.attempt
        for pod in the_plan.adopt_pods:  # restarted in place by its kubelet: into this attempt
            self._pods.created(self._api.patch_pod(job.namespace, pod.name, builders.adoption(pod, attempt)))

    def _create_ranks(self, job: Job, attempt: int, the_plan: Plan) -> None:
        """The plan's rank pods (``job`` as admitted), with the grace period their stop needs, restarting in place
        when their kubelet may."""
        grace = builders.termination_grace(job, *_measured_stop(the_plan.status))
        restarts = the_plan.status.restarts
        by_kubelet = bool(the_plan.create_ranks) and self._in_place(job, restarts)
        self._create_pods(job, attempt, the_plan.create_ranks, gang=the_plan.gang, placement=the_plan.placement,
                          avoid=the_plan.avoid_nodes, grace=grace, in_place=by_kubelet,
                          restarts_left=in_place.in_process(job.spec.run_policy, restarts))  # fmt: skip

    def _create_workload(self, key: Key, job: Job) -> None:
        """The job's Workload, which a GET has just found absent. A failure is kept for the next status to say, and
        raised, so the work queue logs it and tries again with backoff."""
        try:
            created = self._kueue.create(builders.workload(job, self._priority(job)))
        except NamespaceTerminating:
            raise
        except KubeError as err:
            self.remembered.workload_failures[key] = str(err)
            raise
        self.remembered.workload_failures.pop(key, None)
        if not created:  # a GET has just answered that it does not exist: the next look says which was right
            log.warning("%s/%s: creating its Workload %s answered that it exists, which a GET had just denied; "
                        "looking again", *key, workload_name(job.name, job.uid))  # fmt: skip

    def _in_place(self, job: Job, restarts: int) -> bool:
        """Whether the job's new pods restart in place on a retryable exit: its policy allows it, the attempt is not
        its last (``in_place.for_attempt``) and the cluster can."""
        rp = job.spec.run_policy
        if rp.in_place_restart is not InPlaceRestart.AUTO or not builders.restart_rules(rp):
            return False
        if not in_place.for_attempt(rp, restarts):
            return False
        return self._api.restarts_in_place(job.namespace)

    def _create_before_pods(self, job: Job, attempt: int, *, service: bool, pod_group: bool) -> None:
        """The attempt's Service and PodGroup, side by side: both exist before any pod, so a crash never leaves
        pods without their DNS name or their gang."""

        def create_pod_group() -> None:
            self._api.create(builders.pod_group(job, attempt))
            if attempt > 0:  # attempts only grow: before the first restart, no older PodGroup can exist
                self._api.delete_pod_groups(job.namespace, job.name, keep_attempt=attempt)

        def create_service() -> None:
            self._api.create(builders.service(job))

        _all(self._creates, [*([create_service] if service else []), *([create_pod_group] if pod_group else [])])

    def _create_pods(
        self,
        job: Job,
        attempt: int,
        ranks: tuple[int, ...],
        *,
        gang: bool,
        placement: Placement,
        avoid: tuple[str, ...],
        grace: int,
        in_place: bool,
        restarts_left: int,
    ) -> None:
        """Create if absent, in waves of CREATE_PARALLELISM; raises the lowest rank's error.

        Each pod created goes into the pod cache at once, so a reconcile before the watch sees it
        does not create it again.
        """

        def create(rank: int) -> None:
            built = builders.pod(job, rank, attempt, gang=gang, grace=grace, in_place=in_place,
                                 restarts_left=restarts_left)  # fmt: skip
            created = self._api.create_pod(builders.avoiding(placement.apply(built), placement.keeps_off(avoid)))
            if created is not None:
                self._pods.created(created)
            faults.point("pod-created")

        for start in range(0, len(ranks), CREATE_PARALLELISM):
            _all(self._creates, [partial(create, r) for r in ranks[start : start + CREATE_PARALLELISM]])


def _all(pool: Executor, calls: Sequence[Callable[[], None]]) -> None:
    """Run the calls on the pool side by side and wait for all of them; raises the first one's error, in order."""
    if len(calls) == 1:
        calls[0]()  # no hop to the pool for one call
        return
    futures: list[Future[None]] = [pool.submit(call) for call in calls]
    # Not concurrent.futures.wait: a future that the operator's stop cancels in the queue
    # (shutdown(cancel_futures=True)) never wakes wait(), and this thread then blocks the
    # interpreter's exit forever. exception() wakes on the cancel (it raises CancelledError).
    for future in futures:
        future.exception()
    for future in futures:
        future.result()


def _measured_stop(status: JobStatus) -> tuple[float | None, float | None]:
    """What a stop costs, as last measured: a save's seconds and a step's."""
    saved, prog = status.last_checkpoint, status.progress
    return (saved.save_seconds if saved else None), (prog.step_time_p50 if prog else None)


def _write_status(api: Api, body: dict[str, Any], old: JobStatus, new: JobStatus) -> dict[str, Any] | None:
    """The job as it now stands (``body`` itself when nothing changed); None when someone wrote in between."""
    raw = body.get("status") or {}
    wanted = _owned(new.to_dict())
    if _owned(raw) == wanted:
        return body
    updated = {**body, "status": {**{k: v for k, v in raw.items() if k not in OWNED_STATUS}, **wanted}}
    try:
        written = api.replace_job_status(updated)
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


def _post_events(api: Api, body: Mapping[str, Any], attempt: int, events: tuple[Event, ...], now: datetime) -> None:
    meta = body["metadata"]
    for event in events:
        try:
            api.create(event_body(namespace=meta["namespace"], name=meta["name"], uid=meta.get("uid", ""),
                                  attempt=attempt, event=event, now=now))  # fmt: skip
        except NamespaceTerminating:
            return  # the job goes with its namespace
        except KubeError as err:  # events are best effort
            log.warning("could not post event %s for %s/%s: %s", event.reason, meta["namespace"], meta["name"], err)
