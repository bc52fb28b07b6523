"""The reconciles' pool: launches go before reports, a report waits at most its bound, and it behaves as an
Executor otherwise (results, errors, a shutdown that cancels what is queued)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ddpjob_operator.launches_first import LaunchesFirst


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pool(clock: Clock) -> Iterator[LaunchesFirst]:
    one = LaunchesFirst(1, max_wait=10.0, thread_name_prefix="test", clock=clock)
    yield one
    one.shutdown(cancel_futures=True)


def busy(pool: LaunchesFirst) -> threading.Event:
    """Hold the pool's one thread until the event is set, so that what is submitted next queues."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    pool.submit(hold)
    assert started.wait(10)
    return release


def test_queued_launches_go_before_a_report_queued_earlier(pool: LaunchesFirst) -> None:
    ran: list[str] = []
    release = busy(pool)
    report = pool.submit_report(ran.append, "report")
    launches = [pool.submit(ran.append, f"launch {i}") for i in range(2)]
    release.set()
    report.result(10)
    assert all(f.done() for f in launches) and ran == ["launch 0", "launch 1", "report"]


def test_a_report_that_waited_its_bound_goes_before_launches(pool: LaunchesFirst, clock: Clock) -> None:
    ran: list[str] = []
    release = busy(pool)
    report = pool.submit_report(ran.append, "report")
    clock.now = 5.0
    launch = pool.submit(ran.append, "launch")
    clock.now = 10.0  # the report has waited 10 s: its most
    release.set()
    launch.result(10)
    assert report.done() and ran == ["report", "launch"]


def test_with_nothing_else_queued_a_report_runs_at_once(pool: LaunchesFirst) -> None:
    assert pool.submit_report(lambda: "written").result(10) == "written"


def test_errors_reach_the_caller_and_the_thread_goes_on(pool: LaunchesFirst) -> None:
    def fail() -> None:
        raise ValueError("the apiserver said no")

    with pytest.raises(ValueError, match="said no"):
        pool.submit(fail).result(10)
    assert pool.submit(lambda: 1).result(10) == 1


def test_a_shutdown_cancels_what_is_queued_and_refuses_more(pool: LaunchesFirst) -> None:
    release = busy(pool)
    queued = [pool.submit(lambda: None), pool.submit_report(lambda: None)]
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    release.set()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
