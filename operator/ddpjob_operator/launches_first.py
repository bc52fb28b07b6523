"""The reconciles' threads, launches first: a reconcile that only reports (the first status of pods made a moment
before, ``Controller.reports_only``) waits while other reconciles are queued, for at most ``max_wait`` seconds.

Under a burst of new jobs the apiserver's time then goes to their pods before their statuses: each job's pods
come sooner, and every status still follows within the bound. With nothing else queued a report runs at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class _Item:
    queued: float
    future: Future[Any]
    call: Callable[[], Any] = field(repr=False)


class LaunchesFirst(Executor):
    """``workers`` threads taking ``submit``'s calls before ``submit_report``'s, save a report queued for
    ``max_wait`` seconds, which goes next."""

    def __init__(
        self, workers: int, *, max_wait: float, thread_name_prefix: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_wait = max_wait
        self._clock = clock
        self._others: deque[_Item] = deque()
        self._reports: deque[_Item] = deque()
        self._lock = threading.Condition()
        self._shut = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{thread_name_prefix}_{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self._queue(self._others, lambda: fn(*args, **kwargs))

    def submit_report(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self._queue(self._reports, lambda: fn(*args, **kwargs))

    def _queue(self, queue: deque[_Item], call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            queue.append(_Item(self._clock(), future, call))
            self._lock.notify()
        return future

    def _next(self) -> _Item | None:
        """Under the lock: the oldest report if nothing else waits or it has waited its most, else the oldest other."""
        if self._reports and (not self._others or self._clock() - self._reports[0].queued >= self.max_wait):
            return self._reports.popleft()
        return self._others.popleft() if self._others else None

    def _work(self) -> None:
        while True:
            with self._lock:
                item = self._next()
                while item is None:
                    if self._shut:
                        return
                    self._lock.wait()
                    item = self._next()
            if not item.future.set_running_or_notify_cancel():
                continue
            try:
                result = item.call()
            except BaseException as err:  # as ThreadPoolExecutor: the caller's future carries it
                item.future.set_exception(err)
            else:
                item.future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                for queue in (self._others, self._reports):
                    while queue:
                        queue.popleft().future.cancel()
            self._lock.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()
