"""The pod cache against the real apiserver: it lists, follows the watch, and resumes it when it ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ddpjob_contract.pods import LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY
from ddpjob_operator import podcache
from ddpjob_operator.kube import Kube
from ddpjob_operator.podcache import PodCache

from .helpers import Raw


def pod(name: str, job: str, *, managed: bool = True) -> dict[str, Any]:
    labels = {LABEL_JOB_NAME: job}
    if managed:
        labels[LABEL_MANAGED_BY] = MANAGED_BY
    container = {"name": "trainer", "image": "registry.example/none:1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [container]}}  # fmt: skip


def eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


class Changes:
    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.keys.append(key)


@pytest.fixture
def changes() -> Changes:
    return Changes()


@pytest.fixture
def cache(namespace: str, api_client: Any, changes: Changes) -> Iterator[PodCache]:
    the_cache = PodCache(Kube(api_client), [namespace], changes)
    the_cache.start()
    yield the_cache
    the_cache.stop()


def names(cache: PodCache, namespace: str, job: str) -> set[str]:
    return {p["metadata"]["name"] for p in cache.index.pods((namespace, job))}


def test_it_lists_what_exists_then_follows_creates_and_deletes(raw: Raw, namespace: str, api_client: Any,
                                                              changes: Changes) -> None:  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/pods"
    raw.post(path, pod("a-0", "a"))
    the_cache = PodCache(Kube(api_client), [namespace], changes)
    assert the_cache.pods((namespace, "a")) is None  # not synced: the caller must list
    the_cache.start()
    try:
        eventually(lambda: the_cache.synced, "the first list")
        assert names(the_cache, namespace, "a") == {"a-0"}
        raw.post(path, pod("a-1", "a"))
        raw.post(path, pod("stray", "a", managed=False))  # not ours: the watch does not even send it
        eventually(lambda: names(the_cache, namespace, "a") == {"a-0", "a-1"}, "the created pod")
        raw.delete(f"{path}/a-0", {"gracePeriodSeconds": 0})
        eventually(lambda: names(the_cache, namespace, "a") == {"a-1"}, "the deleted pod to go")
        assert (namespace, "a") in changes.keys
    finally:
        the_cache.stop()


def test_a_watch_the_apiserver_ends_is_resumed_without_losing_a_change(
    raw: Raw, namespace: str, cache: PodCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(podcache, "WATCH_SECONDS", 1)  # the next watch the cache opens ends after 1 s
    eventually(lambda: cache.synced, "the first list")
    path = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(4):
        time.sleep(1.0)  # across several watches
        raw.post(path, pod(f"b-{i}", "b"))
    eventually(lambda: names(cache, namespace, "b") == {f"b-{i}" for i in range(4)}, "every pod, across watches")


def test_a_change_the_watch_delivered_before_our_create_was_answered_is_kept(
    raw: Raw, namespace: str, api_client: Any, cache: PodCache
) -> None:
    """CI saw it: a pod's status changed (Running; the scheduler's Unschedulable) before the operator's thread took
    in its POST's answer, the answer put the pod back as created, and nothing changed the pod again to mend it."""
    eventually(lambda: cache.synced, "the first list")
    body = pod("c-0", "c")
    body["metadata"]["namespace"] = namespace
    answer = Kube(api_client).create_pod(body)  # the operator's own POST
    assert answer is not None
    raw.set_pod(namespace, "c-0", "Running", trainer=None)

    def phase() -> list[str]:
        return [p["status"].get("phase", "") for p in cache.index.pods((namespace, "c"))]

    eventually(lambda: phase() == ["Running"], "the watch to deliver the Running pod")
    cache.created(answer)  # our thread, late
    assert phase() == ["Running"]
