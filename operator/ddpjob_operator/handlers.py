"""Kopf glue: events for DDPJobs, and changes of their pods, wake the job's worker, which reconciles.

DDPJobs come through Kopf. Pods come through our own ``PodCache`` (one list-and-watch, filtered
by our label on the server), which reconciles read instead of listing pods each time.

No on.delete handler and no timers or daemons, hence no finalizers: deleting a DDPJob never
waits for the operator, and owner references let the garbage collector remove the children.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from ddpjob_operator import api, metrics, namespaces
from ddpjob_operator.api import Key
from ddpjob_operator.controller import Bodies, reconcile
from ddpjob_operator.kube import Kube, in_cluster
from ddpjob_operator.podcache import PodCache
from ddpjob_operator.poller import Poller
from ddpjob_operator.workqueue import WorkQueue


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # our own Events describe transitions
    # Kopf scans namespaces and CRDs to expand globs; a plain list needs no scan, and the namespaced
    # chart grants no cluster-wide list rights (it would log Forbidden on every try).
    scope = list(memo.get("namespaces") or [])
    settings.scanning.disabled = bool(scope) and not namespaces.any_pattern(scope)
    # A reconcile mostly waits on the apiserver, so threads, not CPUs, bound how many run at once.
    workers = int(memo.get("workers") or 16)
    sizes = {"reconcile": workers, "create": 2 * workers, "event": max(2, workers // 4)}
    reconciles, creates, events = memo.pools = [ThreadPoolExecutor(n, thread_name_prefix=k) for k, n in sizes.items()]
    kube = Kube(connections=sum(sizes.values()))
    bodies = memo.bodies = Bodies()
    loop = asyncio.get_running_loop()

    async def run(key: Key) -> float | None:
        call = functools.partial(reconcile, kube, *key, progress=poller, bodies=bodies, pods=pods, creates=creates,
                                 events=events)  # fmt: skip
        try:
            return await loop.run_in_executor(reconciles, call)
        except Exception:
            metrics.RECONCILE_ERRORS.inc()
            raise  # the work queue logs it and retries with backoff

    memo.kube = kube
    memo.queue = WorkQueue(run)

    # A pod change wakes its job's worker, on the event loop, if the job is one Kopf delivered (so in
    # a namespace we serve); the cache's watch threads get connections of their own.
    served: set[Key] = set()
    memo.served = served

    def wake(key: Key) -> None:
        if key in served:
            memo.queue.enqueue(key)

    def changed(key: Key) -> None:
        loop.call_soon_threadsafe(wake, key)

    pods = memo.pods = PodCache(Kube(connections=2), scope, changed)
    pods.start()
    # Each poll wakes the job's worker, which folds the scrapes into the status.
    poller = memo.poller = Poller(
        memo.queue.enqueue,
        max_interval=float(memo.get("progress_interval") or 15.0),
        timeout=float(memo.get("progress_timeout") or 2.0),
        concurrency=int(memo.get("progress_concurrency") or 32),
    )
    if memo.get("metrics_port"):
        metrics.serve(int(memo["metrics_port"]))


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same credentials as kube.py: KUBECONFIG as it is now, else the pod's service account.

    (Kopf's default reads KUBECONFIG as it was when the kubernetes package was imported.)
    """
    if in_cluster():
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.pods.stop()
    await memo.poller.stop()  # first: each poll wakes a worker
    await memo.queue.stop()
    for pool in memo.pools:
        pool.shutdown(wait=False, cancel_futures=True)
    memo.kube.close()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def job_event(namespace: str | None, name: str, event: Mapping[str, Any], memo: Any, **_: Any) -> None:
    key = (namespace or "", name)
    if event.get("type") == "DELETED":
        memo.bodies.drop(key)
        memo.served.discard(key)
    else:
        memo.served.add(key)
        # The reconcile starts from this body instead of a GET. The echo of our own status write
        # brings nothing new: the reconcile that wrote it has already said when to look again.
        if isinstance(event.get("object"), dict) and not memo.bodies.put(key, event["object"]):
            return
    memo.queue.enqueue(key)
