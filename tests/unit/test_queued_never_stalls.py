"""Issue 42: a job queued for Kueue is never left at "creating its Workload" without a word.

The controller runs here on the real ``kube.Kube``, whose requests reach a scripted apiserver: each test scripts the
answers a restarting control plane gives (Kueue's webhook not answering yet, the apiserver not serving DDPJobs for a
moment) and drives the reconciles as the work queue does: an error is retried, a delay of None ends the job's worker,
and nothing wakes a queued job again (it has no pods, and the watch sends only the echoes of our own writes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from ddpjob_operator.controller import Controller
from ddpjob_operator.kube import Kube, KubeError
from ddpjob_operator.loopwatch import LoopWatch
from ddpjob_operator.queueing import workload_name
from ddpjob_operator.workloads import Kueue

from . import factories
from .test_controller import FakeCache, Inline, Nodes, NoPolls
from .test_kube_requests import Answer, Client

KEY = ("ns", "train")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOT_SERVED = (404, b"404 page not found\n")
"""What a restarted apiserver answers for a custom resource before it has read the CRDs: plain text, no Status."""


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "code": code, "reason": reason, "message": message}).encode()


class Apiserver:
    """Holds one DDPJob and its Workloads; ``script`` maps a request ("GET ddpjobs", "PUT ddpjobs", "POST workloads")
    to the answers its next calls get instead of the real one."""

    def __init__(self) -> None:
        self.job = factories.body(replicas=2)
        self.job["metadata"].update(resourceVersion="1", labels={"kueue.x-k8s.io/queue-name": "user-queue"})
        self.workloads: dict[str, dict[str, Any]] = {}
        self.script: dict[str, list[tuple[int, bytes]]] = {}
        self.sent: list[str] = []
        self._lock = threading.Lock()

    def urlopen(self, method: str, url: str, **kw: Any) -> Answer:
        path = urlsplit(url).path.split("/")
        resource = next(p for p in ("ddpjobs", "workloads", "events", "workloadpriorityclasses") if p in path)
        what = f"{method} {resource}"
        with self._lock:
            self.sent.append(what)
            scripted = self.script.get(what)
            if scripted:
                return Answer(*scripted.pop(0))
            return self._answer(method, resource, path[-1], kw.get("body"))

    def _answer(self, method: str, resource: str, name: str, body: bytes | None) -> Answer:
        if resource == "ddpjobs" and method == "GET":
            return Answer(200, json.dumps(self.job).encode())
        if resource == "ddpjobs" and method == "PUT":
            sent = json.loads(body or b"{}")
            version = str(int(self.job["metadata"]["resourceVersion"]) + 1)
            self.job = {**sent, "metadata": {**sent["metadata"], "resourceVersion": version}}
            return Answer(200, json.dumps(self.job).encode())
        if resource == "workloads" and method == "POST":
            workload = json.loads(body or b"{}")
            self.workloads[workload["metadata"]["name"]] = workload
            return Answer(201, b"")
        if resource == "workloads" and name in self.workloads:
            return Answer(200, json.dumps(self.workloads[name]).encode())
        if resource == "events":
            return Answer(201, b"")
        return Answer(404, status_body(404, "NotFound", f"{resource} {name} not found"))

    def queued_message(self) -> str:
        conditions = (self.job.get("status") or {}).get("conditions") or []
        return next((c["message"] for c in conditions if c["type"] == "Queued"), "")


@pytest.fixture
def creates() -> Iterator[Executor]:
    with ThreadPoolExecutor(4, thread_name_prefix="create") as pool:
        yield pool


def controller(server: Apiserver, creates: Executor, now: list[datetime]) -> Controller:
    kube = Kube(Client(server))  # type: ignore[arg-type]
    return Controller(kube, FakeCache([]), NoPolls(), lambda: now[0], nodes=Nodes(), kueue=Kueue(kube),
                      creates=creates, events=Inline(), pod_groups=False)  # fmt: skip


def work_queue(ctl: Controller, server: Apiserver, now: list[datetime], reconciles: int = 12) -> list[str]:
    """Reconcile as the work queue does until the Workload exists and the status says so; what each returned."""
    said: list[str] = []
    for _ in range(reconciles):
        try:
            delay = ctl.reconcile(KEY)
        except KubeError as err:
            said.append(f"raised {err}")
            now[0] += timedelta(seconds=1)
            continue
        said.append(f"returned {delay}")
        if delay is None:
            break  # the worker ends, and nothing wakes a queued job again
        if server.workloads and "waiting for Kueue to admit" in server.queued_message():
            break
        now[0] += timedelta(seconds=delay or 0.0)
    return said


def test_a_queued_job_that_meets_an_apiserver_not_serving_ddpjobs_is_retried_not_forgotten(creates: Executor) -> None:
    # The sequence of the stall: the first Workload POST meets Kueue's webhook not answering yet (Kueue restarted),
    # and the next reads of the job meet the apiserver not serving DDPJobs for a moment. Taken as the job's deletion,
    # that 404 ended the job's worker silently: Queued at "creating its Workload" for good, no Workload, no log line.
    server = Apiserver()
    server.script["POST workloads"] = [(500, status_body(500, "InternalError", "failed calling webhook"))]
    server.script["GET ddpjobs"] = [NOT_SERVED, NOT_SERVED]
    now = [T0]
    ctl = controller(server, creates, now)

    said = work_queue(ctl, server, now)

    assert workload_name("train", server.job["metadata"]["uid"]) in server.workloads, said
    assert "returned None" not in said, f"the job's worker ended with the job still queued: {said}"
    assert server.job["status"]["phase"] == "Queued"
    assert "waiting for Kueue to admit its Workload" in server.queued_message()


def test_a_status_write_that_meets_an_apiserver_not_serving_ddpjobs_is_retried_not_taken_for_a_deletion(
    creates: Executor,
) -> None:
    server = Apiserver()
    server.script["POST workloads"] = [(500, status_body(500, "InternalError", "failed calling webhook"))]
    now = [T0]
    ctl = controller(server, creates, now)
    with pytest.raises(KubeError):
        ctl.reconcile(KEY)  # Queued, then the Workload's POST fails
    assert server.job["status"]["phase"] == "Queued"
    server.script["PUT ddpjobs"] = [NOT_SERVED]  # the next write, which says why the Workload is not there yet
    said = work_queue(ctl, server, now)
    assert "returned None" not in said, said
    assert server.workloads, said


def test_a_failed_workload_creation_is_said_in_the_status_and_after_30_s_in_a_warning_event(creates: Executor) -> None:
    server = Apiserver()
    refused = (500, status_body(500, "InternalError", "failed calling webhook mworkload.kb.io: connection refused"))
    server.script["POST workloads"] = [refused] * 20
    now = [T0]
    ctl = controller(server, creates, now)
    events: list[dict[str, Any]] = []
    original = server._answer

    def answer(method: str, resource: str, name: str, body: bytes | None) -> Answer:
        if resource == "events":
            events.append(json.loads(body or b"{}"))
        return original(method, resource, name, body)

    server._answer = answer  # type: ignore[method-assign]
    said = work_queue(ctl, server, now, reconciles=8)  # 8 s of tries, each failure retried after a second
    assert "returned None" not in said and server.sent.count("POST workloads") >= 3, said
    assert "creating its Workload (its creation failed: HTTP 500: failed calling webhook" in server.queued_message()
    assert not any(e["reason"] == "WorkloadNotCreated" for e in events)
    now[0] = T0 + timedelta(seconds=31)
    work_queue(ctl, server, now, reconciles=2)
    (warning,) = [e for e in events if e["reason"] == "WorkloadNotCreated"]
    assert warning["type"] == "Warning"
    assert "is still not there 30 s after the job was queued" in warning["message"]
    assert "connection refused" in warning["message"]
    conditions = {c["type"]: c for c in server.job["status"]["conditions"]}
    assert conditions["Queued"]["reason"] == "WorkloadNotCreated"
    assert conditions["Created"]["message"].endswith("no pod until Kueue admits its Workload")

    server.script["POST workloads"] = []  # Kueue's webhook answers again
    said = work_queue(ctl, server, now)
    assert server.workloads, said
    assert "waiting for Kueue to admit its Workload" in server.queued_message()


def test_a_blocked_event_loop_is_said_with_what_its_thread_is_doing_and_again_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    warned = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "has not answered" in record.getMessage():
                warned.set()

    async def scenario() -> None:
        watch = LoopWatch(asyncio.get_running_loop(), interval=0.05, limit=0.2)
        watch.start()
        await asyncio.sleep(0.1)

        def blocked_reconcile_on_the_loop() -> None:
            release.wait(10)

        threading.Thread(target=lambda: (warned.wait(10), release.set()), daemon=True).start()
        blocked_reconcile_on_the_loop()  # blocks the loop until the watch has said so
        await asyncio.sleep(0.2)
        watch.stop()

    handler = Seen()
    logging.getLogger("ddpjob_operator").addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING, logger="ddpjob_operator"):
            asyncio.run(scenario())
    finally:
        logging.getLogger("ddpjob_operator").removeHandler(handler)
    messages = [r.getMessage() for r in caplog.records]
    blocked = [m for m in messages if "has not answered" in m]
    assert blocked and "blocked_reconcile_on_the_loop" in blocked[0], messages
    assert any("answers again" in m for m in messages), messages


def test_only_a_409_that_says_the_object_exists_counts_as_created() -> None:
    server = Apiserver()
    api = Kube(Client(server))  # type: ignore[arg-type]
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
    }
    server.script["POST workloads"] = [(409, status_body(409, "AlreadyExists", "workloads w already exists"))]
    assert api.create(workload) is False
    server.script["POST workloads"] = [(409, status_body(409, "Conflict", "the object has been modified"))]
    with pytest.raises(KubeError, match="has been modified"):
        api.create(workload)
