"""The per-job work queue: one reconcile at a time per job, events coalesce, requeues and backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from ddpjob_operator.api import Key
from ddpjob_operator.kube import Unreachable
from ddpjob_operator.workqueue import WorkQueue


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_events_for_a_busy_job_coalesce_into_one_more_reconcile_and_never_overlap() -> None:
    calls: list[Key] = []
    active = 0
    overlap = False
    release = asyncio.Event

    async def scenario() -> None:
        nonlocal active, overlap
        gate = release()

        async def reconcile(key: Key) -> float | None:
            nonlocal active, overlap
            active += 1
            overlap = overlap or active > 1
            calls.append(key)
            if len(calls) == 1:
                await gate.wait()
            active -= 1
            return None

        queue = WorkQueue(reconcile)
        queue.enqueue(("ns", "a"))
        await asyncio.sleep(0.01)
        for _ in range(5):
            queue.enqueue(("ns", "a"))
        gate.set()
        while len(queue):
            await asyncio.sleep(0.01)

    run(scenario)
    assert calls == [("ns", "a"), ("ns", "a")]
    assert not overlap


def test_different_jobs_reconcile_independently() -> None:
    seen: set[Key] = set()

    async def scenario() -> None:
        async def reconcile(key: Key) -> float | None:
            seen.add(key)
            return None

        queue = WorkQueue(reconcile)
        for name in "abc":
            queue.enqueue(("ns", name))
        while len(queue):
            await asyncio.sleep(0.01)

    run(scenario)
    assert seen == {("ns", "a"), ("ns", "b"), ("ns", "c")}


def test_a_requeue_delay_brings_the_job_back_without_an_event() -> None:
    calls = 0

    async def scenario() -> None:
        async def reconcile(key: Key) -> float | None:
            nonlocal calls
            calls += 1
            return 0.01 if calls < 3 else None

        queue = WorkQueue(reconcile)
        queue.enqueue(("ns", "a"))
        while len(queue):
            await asyncio.sleep(0.01)

    run(scenario)
    assert calls == 3


def test_an_error_is_retried_and_does_not_stop_the_worker() -> None:
    calls = 0

    async def scenario() -> None:
        async def reconcile(key: Key) -> float | None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("apiserver hiccup")
            return None

        queue = WorkQueue(reconcile)
        queue.enqueue(("ns", "a"))
        while len(queue):
            await asyncio.sleep(0.05)

    run(scenario)
    assert calls == 2


def test_stop_cancels_waiting_workers() -> None:
    async def scenario() -> None:
        async def reconcile(key: Key) -> float | None:
            return 3600.0

        queue = WorkQueue(reconcile)
        queue.enqueue(("ns", "a"))
        await asyncio.sleep(0.01)
        assert len(queue) == 1
        await queue.stop()
        assert len(queue) == 0

    run(scenario)


def test_a_stopped_queue_starts_no_more_reconciles() -> None:
    calls: list[Key] = []

    async def scenario() -> None:
        async def reconcile(key: Key) -> float | None:
            calls.append(key)
            return None

        queue = WorkQueue(reconcile)
        await queue.stop()
        queue.enqueue(("ns", "a"))
        await asyncio.sleep(0.01)
        assert len(queue) == 0

    run(scenario)
    assert calls == []


def test_an_apiserver_that_does_not_answer_is_one_warning_line_and_a_bug_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[Exception] = [Unreachable(0, "PUT /x: the apiserver did not answer (refused)"), KeyError("bug")]

    async def scenario() -> None:
        async def reconcile(key: Key) -> float | None:
            if failures:
                raise failures.pop(0)
            return None

        queue = WorkQueue(reconcile)
        queue.enqueue(("ns", "a"))
        while len(queue):
            await asyncio.sleep(0.05)

    caplog.set_level(logging.WARNING, logger="ddpjob_operator")
    run(scenario)
    unreachable, bug = [r for r in caplog.records if "reconciling ns/a failed" in r.getMessage()]
    assert unreachable.levelno == logging.WARNING and unreachable.exc_info is None
    assert "the apiserver did not answer" in unreachable.getMessage()
    assert bug.levelno == logging.ERROR and bug.exc_info is not None, "a bug is shown whole"
