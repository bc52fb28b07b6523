"""One worker per job: reconciles run one at a time per job, events coalesce, requeues wait.

Kopf delivers events for jobs and pods; each just wakes the job's worker. The worker runs the
reconcile, then sleeps until the next event or until the reconcile's requeue delay. A worker with
nothing scheduled ends; the next event starts a new one. Errors back off exponentially.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ddpjob_operator.api import Key
from ddpjob_operator.kube import KubeError

Reconcile = Callable[[Key], Awaitable[float | None]]

log = logging.getLogger(__name__)

MAX_ERROR_BACKOFF = 60.0


@dataclass
class _Worker:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class WorkQueue:
    def __init__(self, reconcile: Reconcile) -> None:
        self._reconcile = reconcile
        self._workers: dict[Key, _Worker] = {}
        self._stopped = False

    def enqueue(self, key: Key) -> None:
        if self._stopped:
            return  # shutting down: nothing new starts
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker()
            worker.task = asyncio.get_running_loop().create_task(self._run(key, worker), name=f"ddpjob {key}")
        worker.wake.set()

    def __len__(self) -> int:
        return len(self._workers)

    async def stop(self) -> None:
        self._stopped = True
        tasks = [w.task for w in self._workers.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._workers.clear()

    async def _run(self, key: Key, worker: _Worker) -> None:
        errors = 0
        delay: float | None = 0.0
        try:
            while True:
                if delay is None and not worker.wake.is_set():
                    return
                if not worker.wake.is_set():
                    try:
                        await asyncio.wait_for(worker.wake.wait(), timeout=delay)
                    except TimeoutError:
                        pass
                worker.wake.clear()
                try:
                    delay = await self._reconcile(key)
                    errors = 0
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    errors += 1
                    delay = min(MAX_ERROR_BACKOFF, 0.5 * 2**errors)
                    if isinstance(err, KubeError):  # the apiserver's answer, or none: not a bug, no traceback
                        log.warning("reconciling %s/%s failed: %s; retrying in %.1fs", *key, err, delay)
                    else:
                        log.exception("reconciling %s/%s failed; retrying in %.1fs", *key, delay)
        finally:
            if self._workers.get(key) is worker:
                del self._workers[key]
