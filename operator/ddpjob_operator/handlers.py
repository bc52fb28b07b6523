"""Kopf glue: events for DDPJobs and their pods wake the job's worker, which reconciles.

No on.delete handler and no timers or daemons, hence no finalizers: deleting a DDPJob never
waits for the operator, and owner references let the garbage collector remove the children.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from ddpjob_operator import api, metrics
from ddpjob_operator.controller import reconcile
from ddpjob_operator.kube import Kube
from ddpjob_operator.poller import Poller
from ddpjob_operator.workqueue import Key, WorkQueue


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # our own Events describe transitions
    kube = Kube()

    async def run(key: Key) -> float | None:
        try:
            return await asyncio.to_thread(reconcile, kube, *key, progress=poller)
        except Exception:
            metrics.RECONCILE_ERRORS.inc()
            raise  # the work queue logs it and retries with backoff

    memo.kube = kube
    memo.queue = WorkQueue(run)
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
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.poller.stop()  # first: each poll wakes a worker
    await memo.queue.stop()
    memo.kube.close()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def job_event(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo.queue.enqueue((namespace or "", name))


@kopf.on.event("", "v1", "pods", labels={api.LABEL_MANAGED_BY: api.MANAGED_BY, api.LABEL_JOB_NAME: kopf.PRESENT})
async def pod_event(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    memo.queue.enqueue((namespace or "", labels[api.LABEL_JOB_NAME]))
