"""The operator's long-lived parts, made once at startup and stopped at cleanup.

A job's worker (``WorkQueue``) runs the ``Controller``'s reconcile in a thread. Five things wake
it: the job watch's events for the job (``jobwatch``), the pod cache's watch (a pod of the job changed), the
Workload watch (Kueue wrote its Workload: ``workloads``), the node watch (a node it runs on was lost or turned sick)
and the poller (a new scrape of the job's ranks). Every part is made in ``__init__``, before anything can wake a
worker: the watch threads start in ``start``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from ddpjob_operator import api, metrics, node_health
from ddpjob_operator.api import Key
from ddpjob_operator.controller import Controller
from ddpjob_operator.inbox import Inbox
from ddpjob_operator.jobwatch import JobWatch
from ddpjob_operator.kube import Kube, KubeError, user_agent
from ddpjob_operator.launches_first import LaunchesFirst
from ddpjob_operator.leadership import ALONE, Leadership
from ddpjob_operator.loopwatch import LoopWatch
from ddpjob_operator.nodewatch import NodeWatch, Unwatched
from ddpjob_operator.podcache import PodCache
from ddpjob_operator.policies import node_loss
from ddpjob_operator.poller import Poller
from ddpjob_operator.workloads import Kueue, WorkloadWatch
from ddpjob_operator.workqueue import WorkQueue

log = logging.getLogger("ddpjob_operator")

WORKLOAD_SWEEP_SECONDS = 30.0
"""How often Kueue Workloads being deleted without their job are looked for."""
REPORT_MAX_WAIT_SECONDS = 10.0
"""The longest a new job's first status waits while other jobs' pods are to be made (``LaunchesFirst``)."""


class DDPJobsNotServed(Exception):
    """The apiserver answers but does not list DDPJobs: it has just started, or the CRD is not installed."""


def _now() -> datetime:
    return datetime.now(UTC)


def _served(kube: Kube) -> bool:
    """Whether the cluster serves PodGroups, once it serves DDPJobs. Asked once, first (kube.Unreachable while the
    apiserver is down, DDPJobsNotServed while it cannot say yet), before anything is made: serving PodGroups takes
    an apiserver restart, and ours are cheap. The client is closed if either is not known."""
    try:
        if not kube.serves(api.API_VERSION, api.PLURAL):
            raise DDPJobsNotServed(
                f"the apiserver does not serve {api.PLURAL}.{api.API_VERSION} yet (it lists a custom resource "
                f"a moment after it starts; if this goes on, install the CRD: the chart's, or manifests/crd.yaml)"
            )
        pod_groups = kube.serves_pod_groups()
    except BaseException:
        kube.close()
        raise
    log.info("gang scheduling: the cluster %s PodGroups", "serves" if pod_groups else "does not serve")
    return pod_groups


class Runtime:
    """``namespaces``: the operator's (empty: all); ``workers``: reconciles in flight at once."""

    def __init__(
        self,
        namespaces: Sequence[str],
        *,
        workers: int = 16,
        progress_interval: float = 15.0,
        progress_timeout: float = 2.0,
        progress_concurrency: int = 32,
        unhealthy_taints: Sequence[str] = node_loss.UNHEALTHY_TAINTS,
        node_exclusion_seconds: float = node_health.EXCLUSION_SECONDS,
        node_watch: bool = True,
        leader: Leadership = ALONE,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.leader = leader
        agent = user_agent(leader.identity)  # every request of this replica names it, in the audit log too
        self.kube = Kube(connections=workers + 2 * workers + max(2, workers // 4), fence=leader, user_agent=agent)
        pod_groups = _served(self.kube)
        # A reconcile mostly waits on the apiserver, so threads, not CPUs, bound how many run at once.
        self._reconciles = LaunchesFirst(workers, max_wait=REPORT_MAX_WAIT_SECONDS, thread_name_prefix="reconcile")
        creates = ThreadPoolExecutor(2 * workers, thread_name_prefix="create")
        events = ThreadPoolExecutor(max(2, workers // 4), thread_name_prefix="event")
        self._pools = (self._reconciles, creates, events)
        self.queue = WorkQueue(self._reconcile)
        self._inbox = Inbox(self._loop)
        self.served: set[Key] = set()
        """Jobs the job watch delivered, so in a namespace we serve: only they are woken by their pods."""
        self.poller = Poller(self.queue.enqueue, max_interval=progress_interval, timeout=progress_timeout,
                             concurrency=progress_concurrency)  # fmt: skip

        def watching() -> Kube:  # each watch on connections of its own
            return Kube(connections=2, user_agent=agent)

        self.pods = PodCache(watching(), namespaces, self._pods_changed)
        self.jobs = JobWatch(watching(), namespaces, self._job_changed)
        self.nodes = (NodeWatch(watching(), self._node_changed, unhealthy_taints=unhealthy_taints,
                                exclusion_seconds=node_exclusion_seconds)
                      if node_watch else Unwatched())  # fmt: skip
        self.kueue = Kueue(self.kube)
        self.workloads = WorkloadWatch(watching(), namespaces, self.kueue, self._pods_changed)
        self._stopped = threading.Event()
        self._loop_watch = LoopWatch(self._loop)
        self._sweeper = threading.Thread(target=self._sweep_workloads, daemon=True, name="workload-sweep")
        self.controller = Controller(self.kube, self.pods, self.poller, _now, nodes=self.nodes, kueue=self.kueue,
                                     creates=creates, events=events, pod_groups=pod_groups)  # fmt: skip

    def start(self) -> None:
        self.pods.start()
        self.jobs.start()
        self.nodes.start()
        self.workloads.start()
        self._sweeper.start()
        self._loop_watch.start()
        self.leader.start(self._started_leading)

    async def stop(self) -> None:
        self._stopped.set()
        self._loop_watch.stop()
        self.jobs.stop()
        self.nodes.stop()
        self.workloads.stop()
        self.pods.stop()
        await self.poller.stop()  # first: each poll wakes a worker
        await self.queue.stop()
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.leader.stop)  # the Lease released last: a standby takes over at once
        self.kube.close()

    def job_event(self, key: Key, kind: str | None, body: Mapping[str, Any] | None) -> None:
        """The job watch's event for a DDPJob (kind None: listed), on the event loop: its body saves the reconcile
        a GET."""
        if kind == "DELETED":
            self.controller.bodies.drop(key)
            self.served.discard(key)
        else:
            self.served.add(key)
            # The echo of our own status write brings nothing new: the reconcile that wrote it has
            # already said when to look again.
            if isinstance(body, dict) and not self.controller.bodies.put(key, body):
                return
        self.queue.enqueue(key)

    def _sweep_workloads(self) -> None:
        """Kueue keeps a Workload's quota until its finalizer goes. A job deleted unfinished has it dropped at once
        (``Controller``); one deleted while no operator ran is found here, as the garbage collector deletes its
        Workload, within a sweep of what the Workload watch holds (no request). A failure is said once, until it
        changes."""
        said = ""
        while not self._stopped.wait(WORKLOAD_SWEEP_SECONDS):
            if not self.leader.leads():
                continue  # a standby writes nothing
            try:
                for ns, name, job in self.kueue.orphans():
                    if job not in self.served:
                        self.kueue.release(ns, name)
                said = ""
            except KubeError as err:  # the apiserver restarting: the next sweep tries again
                if str(err) != said:
                    log.warning("releasing a deleted job's Workload failed (%s); trying again every %.0fs", err,
                                WORKLOAD_SWEEP_SECONDS)  # fmt: skip
                said = str(err)

    async def _reconcile(self, key: Key) -> float | None:
        if not self.leader.leads():
            return None  # a standby keeps its watches warm; the leader reconciles (all of them when it takes over)
        try:
            reports = self.controller.reports_only(key)
            submit = self._reconciles.submit_report if reports else self._reconciles.submit
            return await asyncio.wrap_future(submit(self.controller.reconcile, key))
        except Exception:
            metrics.RECONCILE_ERRORS.inc()
            raise  # the work queue logs it and retries with backoff

    def _job_changed(self, key: Key, kind: str | None, body: dict[str, Any] | None) -> None:
        """From the job watch's threads: hand the event to the event loop."""
        self._inbox.post(functools.partial(self.job_event, key, kind, body))

    def _pods_changed(self, key: Key) -> None:
        """From the pod cache's and the Workload watch's threads: wake the job's worker, on the event loop."""
        self._inbox.post(functools.partial(self._wake, key))

    def _node_changed(self, node: str) -> None:
        """From the node watch's thread: a node's health changed; wake the jobs with a pod on it, and those whose
        topology assignment names it (held while it was lost)."""
        for key in self.pods.jobs_on(node) | self.kueue.jobs_assigned(node):
            self._inbox.post(functools.partial(self._wake, key))

    def _started_leading(self) -> None:
        """From the election's thread: this replica took the Lease; every job it has heard of is reconciled."""
        self._inbox.post(self._reconcile_all)

    def _reconcile_all(self) -> None:
        for key in list(self.served):
            self.queue.enqueue(key)

    def _wake(self, key: Key) -> None:
        if key in self.served:
            self.queue.enqueue(key)
