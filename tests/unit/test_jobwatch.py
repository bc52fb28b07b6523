"""The job watch hands every DDPJob event to the runtime as Kopf did: listed jobs (type None), then the watch's
events; only the namespaces served; a job missing from a LIST after a gap is said DELETED; a failed or expired
watch lists again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ddpjob_operator.api import Key
from ddpjob_operator.jobwatch import JobWatch
from ddpjob_operator.kube import Expired, NotServed


def job(name: str, namespace: str = "ns", version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version}}


class FakeJobs:
    """LISTs answer ``listings`` in turn (an exception is raised); each watch yields its batch of events, then
    ends; once both run out, watches wait until the test stops them."""

    def __init__(self, listings: list[list[dict[str, Any]] | Exception],
                 watches: list[list[tuple[str, dict[str, Any]]] | Exception]) -> None:  # fmt: skip
        self.listings = listings
        self.watches = watches
        self.listed: list[str] = []
        self.stopped = threading.Event()

    def list_jobs(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        self.listed.append(namespace)
        answer = self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]
        if isinstance(answer, Exception):
            raise answer
        return [j for j in answer if not namespace or j["metadata"]["namespace"] == namespace], "10"

    def watch_jobs(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        if not self.watches:
            self.stopped.wait(seconds)
            return
        batch = self.watches.pop(0)
        if isinstance(batch, Exception):
            raise batch
        yield from batch


class Seen:
    def __init__(self) -> None:
        self.events: list[tuple[Key, str | None]] = []
        self.lock = threading.Lock()

    def __call__(self, key: Key, kind: str | None, body: dict[str, Any] | None) -> None:
        with self.lock:
            self.events.append((key, kind))

    def wait_for(self, count: int) -> list[tuple[Key, str | None]]:
        deadline = time.monotonic() + 10
        while len(self.events) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.events)


def run(source: FakeJobs, served: list[str], count: int) -> list[tuple[Key, str | None]]:
    seen = Seen()
    watch = JobWatch(source, served, seen)
    watch.start()
    try:
        return seen.wait_for(count)
    finally:
        watch.stop()
        source.stopped.set()


def test_listed_jobs_come_first_as_kopf_delivered_them_then_the_watchs_events_in_order() -> None:
    source = FakeJobs([[job("a")]], [[("ADDED", job("b")), ("BOOKMARK", {"metadata": {"resourceVersion": "12"}}),
                                      ("MODIFIED", job("a", version="13")), ("DELETED", job("b"))]])  # fmt: skip
    assert run(source, [], 4) == [(("ns", "a"), None), (("ns", "b"), "ADDED"), (("ns", "a"), "MODIFIED"),
                                  (("ns", "b"), "DELETED")]  # fmt: skip


def test_a_job_deleted_while_the_watch_was_down_is_said_deleted_by_the_next_list() -> None:
    source = FakeJobs([[job("a"), job("b")], [job("a")]], [Expired(410, "too old")])
    events = run(source, [], 4)
    assert events[:2] == [(("ns", "a"), None), (("ns", "b"), None)]
    assert events[2:] == [(("ns", "b"), "DELETED"), (("ns", "a"), None)]


def test_an_apiserver_that_does_not_serve_ddpjobs_yet_is_asked_again() -> None:
    source = FakeJobs([NotServed(404, "404 page not found"), [job("a")]], [])
    assert run(source, [], 1) == [(("ns", "a"), None)]
    assert source.listed == ["", ""]


@pytest.mark.parametrize(
    ("namespaces", "listed", "kept"),
    [
        (["team-a"], ["team-a"], {"team-a"}),
        (["team-a", "team-b"], ["team-a", "team-b"], {"team-a", "team-b"}),
        (["team-*"], [""], {"team-a", "team-b"}),
        (["!kube-system"], [""], {"team-a", "team-b"}),
    ],
)
def test_the_watch_serves_the_namespaces_kopf_serves(namespaces: list[str], listed: list[str], kept: set[str]) -> None:
    source = FakeJobs([[job("x", ns) for ns in ("team-a", "team-b", "kube-system")]], [])
    events = run(source, namespaces, len(kept))
    time.sleep(0.05)  # nothing more comes
    assert sorted(source.listed) == listed
    assert {key[0] for key, _ in events} == kept
