"""The poller: bounded in time and in concurrency, and a rank that does not answer stalls no reconcile."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import generate_latest

from ddp_trainer.metrics import Metrics
from ddpjob_operator.api import Key
from ddpjob_operator.controller import Controller
from ddpjob_operator.poller import Poller
from ddpjob_operator.progress import REFUSED, Target
from ddpjob_operator.workloads import Kueue
from ddpjob_operator.workqueue import WorkQueue

from .factories import count_wakes
from .test_controller import T0, FakeCache, FakeKube, Inline, Nodes

KEY = ("ns", "train")


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=20))


@contextmanager
def rank_endpoint() -> Iterator[str]:
    """A real trainer registry served over HTTP: a rank that has joined."""
    metrics = Metrics()
    metrics.pg_ready.set(1)
    body = generate_latest(metrics.registry)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def black_hole() -> Iterator[str]:
    """A rank that accepts the connection and never answers (a SIGSTOPped process)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
    finally:
        sock.close()


def target(rank: int, url: str) -> Target:
    return Target(rank=rank, pod=f"train-{rank}", node="node-a", url=url)


def test_a_rank_that_does_not_answer_is_reported_after_the_timeout_and_the_others_are_read() -> None:
    async def scenario() -> None:
        poller = Poller(lambda key: None, timeout=0.5)
        try:
            with rank_endpoint() as alive, black_hole() as silent:
                scrape = await poller.poll_once(3, (target(0, alive), target(1, silent)))
        finally:
            await poller.stop()
        assert scrape.attempt == 3
        assert scrape.ranks[0].ready
        assert scrape.errors == {1: "no answer within 0.5s"}

    run(scenario)


def test_a_refused_connection_is_reported_with_the_reason() -> None:
    async def scenario() -> None:
        poller = Poller(lambda key: None, timeout=5)
        with black_hole() as url:
            pass  # closed: nothing listens there any more
        try:
            scrape = await poller.poll_once(0, (target(0, url),))
        finally:
            await poller.stop()
        assert scrape.errors[0] == REFUSED  # its program is gone, not hung: lifecycle does not call it stuck

    run(scenario)


def test_no_more_scrapes_than_the_concurrency_limit_are_in_flight_at_once() -> None:
    in_flight = 0
    most = 0

    async def fetch(url: str) -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return "ddp_process_group_ready 1\n"

    async def scenario() -> None:
        poller = Poller(lambda key: None, concurrency=3, fetch=fetch)
        scrape = await poller.poll_once(0, tuple(target(r, f"http://x/{r}") for r in range(20)))
        await poller.stop()
        assert len(scrape.ranks) == 20

    run(scenario)
    assert most == 3


def test_a_reconcile_runs_to_the_end_while_a_poll_of_the_same_job_waits_on_a_silent_rank() -> None:
    woken: list[Key] = []

    async def scenario() -> None:
        poller = Poller(woken.append, timeout=60)  # the poll below would wait a minute
        reconciled = asyncio.Event()
        kube = FakeKube(replicas=1)
        controller = Controller(kube, FakeCache(), poller, lambda: T0, nodes=Nodes(), kueue=Kueue(kube),
                                creates=Inline(), events=Inline(), pod_groups=False)  # fmt: skip

        async def run_reconcile(key: Key) -> float | None:
            result = await asyncio.to_thread(controller.reconcile, key)
            reconciled.set()
            return result

        queue = WorkQueue(run_reconcile)
        with black_hole() as silent:
            poller.track_now(KEY, 0, (target(0, silent),), 5.0)
            await asyncio.sleep(0.1)  # the poll is now waiting on the silent rank
            queue.enqueue(KEY)
            await asyncio.wait_for(reconciled.wait(), timeout=10)
            assert kube.calls.count("POST Pod") == 1, "the reconcile planned and made the pod"
            assert woken == [], "while the poll is still waiting"
        await queue.stop()
        await poller.stop()

    run(scenario)


def test_each_poll_wakes_the_jobs_worker_and_keeps_the_scrapes_for_the_reconcile() -> None:
    woken: list[Key] = []

    async def scenario() -> None:
        poller = Poller(woken.append, timeout=2)
        with rank_endpoint() as alive:
            poller.track_now(KEY, 0, (target(0, alive),), 0.05)
            while len(woken) < 2:
                await asyncio.sleep(0.01)
            assert [s.ranks[0].ready for s in poller.scrapes(KEY)][:2] == [True, True]
            poller.track_now(KEY, 0, (), 0.05)
            assert poller.scrapes(KEY) == () and len(poller) == 0, "a finished job is forgotten"
        await poller.stop()

    run(scenario)


def test_no_targets_for_a_job_not_polled_asks_nothing_of_the_event_loop() -> None:
    async def scenario() -> None:
        poller = Poller(lambda key: None, timeout=2)
        calls = count_wakes(asyncio.get_running_loop())
        poller.track(KEY, 0, (), 0.05)
        assert calls == [], "nothing polled, nothing to stop"
        with rank_endpoint() as alive:
            poller.track(KEY, 0, (target(0, alive),), 0.05)
            await asyncio.sleep(0.05)
            assert len(poller) == 1 and len(calls) == 1
            poller.track(KEY, 0, (), 0.05)
            await asyncio.sleep(0.01)
            assert len(poller) == 0 and len(calls) == 2, "a polled job is told to stop"
        await poller.stop()

    run(scenario)
