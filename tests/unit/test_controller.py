"""The controller's calls: a cached body saves the GET, pods go out in parallel, and a body not
known to be current is read again before the reconcile acts on it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ddpjob_operator import builders
from ddpjob_operator.api import parse_job
from ddpjob_operator.controller import Bodies, reconcile
from ddpjob_operator.podcache import PodIndex

from . import factories

KEY = ("ns", "train")


class FakeKube:
    """Records every call; pods it creates are never listed (as if another actor deleted them)."""

    def __init__(self, replicas: int) -> None:
        self.job = factories.body(replicas=replicas)
        self.job["metadata"]["resourceVersion"] = "1"
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def _call(self, what: str) -> None:
        with self._lock:
            self.calls.append(what)
            self.threads.add(threading.current_thread().name.split("_")[0])

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        self._call("GET job")
        return self.job

    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        self._call("LIST pods")
        return []

    def replace_job_status(self, body: dict[str, Any]) -> dict[str, Any]:
        self._call("PUT status")
        rv = str(int(body["metadata"]["resourceVersion"]) + 1)
        self.job = {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}
        return self.job

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._call(f"POST {obj['kind']}")
        return {**obj, "metadata": {**obj["metadata"], "uid": f"uid-{obj['metadata']['name']}"}}


def test_a_new_job_from_the_watch_is_written_then_its_service_and_pods_are_created_without_a_get() -> None:
    kube = FakeKube(replicas=4)
    bodies = Bodies()
    bodies.put(KEY, kube.job)
    with ThreadPoolExecutor(8, thread_name_prefix="create") as creates, ThreadPoolExecutor(1) as events:
        assert reconcile(kube, *KEY, bodies=bodies, creates=creates, events=events) is not None  # type: ignore[arg-type]
    assert kube.calls[:2] == ["LIST pods", "PUT status"] and "GET job" not in kube.calls
    pods = [i for i, call in enumerate(kube.calls) if call == "POST Pod"]
    assert kube.calls.index("POST Service") < min(pods), "the Service first: a crash never leaves pods without it"
    assert kube.calls.count("POST Pod") == 4 and kube.calls.count("POST Service") == 1
    assert "create" in kube.threads, "pods are created on the create pool"
    assert bodies.get(KEY) is kube.job, "the status write's answer is the newest body"


def test_a_cached_body_that_would_act_without_writing_the_status_is_read_again_first() -> None:
    kube = FakeKube(replicas=2)
    bodies = Bodies()
    bodies.put(KEY, kube.job)
    reconcile(kube, *KEY, bodies=bodies)  # type: ignore[arg-type]
    kube.calls.clear()

    assert reconcile(kube, *KEY, bodies=bodies) == 0.0  # type: ignore[arg-type]
    assert kube.calls == ["LIST pods"], "the pods are missing again, but the cached body may be stale: no creates"
    assert bodies.get(KEY) is None
    reconcile(kube, *KEY, bodies=bodies)  # type: ignore[arg-type]
    assert kube.calls[1:3] == ["GET job", "LIST pods"] and kube.calls.count("POST Pod") == 2


def test_the_watchs_echo_of_our_own_status_write_is_told_apart_from_news() -> None:
    bodies = Bodies()
    assert bodies.put(KEY, {"metadata": {"resourceVersion": "1"}}), "first sight"
    seen = bodies.get(KEY)
    written = {"metadata": {"resourceVersion": "2"}}
    bodies.wrote(KEY, seen, written)
    assert not bodies.put(KEY, {"metadata": {"resourceVersion": "2"}}), "the echo of our write"
    assert bodies.put(KEY, {"metadata": {"resourceVersion": "3"}}), "someone else's change"


def test_our_own_write_never_replaces_a_body_the_watch_delivered_meanwhile() -> None:
    bodies = Bodies()
    seen, written, newer = {"rv": "1"}, {"rv": "2"}, {"rv": "3"}
    bodies.put(KEY, seen)
    bodies.wrote(KEY, seen, written)
    assert bodies.get(KEY) is written
    bodies.put(KEY, newer)
    bodies.wrote(KEY, written, {"rv": "2'"})
    assert bodies.get(KEY) is newer, "the user's change that came in during the reconcile is kept"


class FakeCache:
    """A synced pod cache that shows ``pods`` for the job, whatever the apiserver holds."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.index = PodIndex()
        self.shown = pods

    def pods(self, key: tuple[str, str]) -> list[dict[str, Any]]:
        return self.shown + self.index.pods(key)


def failed(pod: dict[str, Any], exit_code: int) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "finishedAt": "2026-11-23T00:00:00Z"}
    status = {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}
    return {**pod, "metadata": {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}"}, "status": status}


def test_with_a_pod_cache_a_new_job_needs_no_list_and_its_created_pods_are_in_the_cache_at_once() -> None:
    kube = FakeKube(replicas=2)
    cache = FakeCache([])
    reconcile(kube, *KEY, pods=cache)  # type: ignore[arg-type]
    assert "LIST pods" not in kube.calls and kube.calls.count("POST Pod") == 2
    assert sorted(p["metadata"]["name"] for p in cache.index.pods(KEY)) == ["train-0", "train-1"]
    kube.calls.clear()
    reconcile(kube, *KEY, pods=cache)  # type: ignore[arg-type]
    assert "POST Pod" not in kube.calls, "the pods just created are not created again before the watch shows them"


class ListsRunningPods(FakeKube):
    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        self._call("LIST pods")
        job = parse_job(self.job)
        return [{**builders.pod(job, r, 0), "status": {"phase": "Running"}} for r in range(job.spec.replicas)]


def test_a_plan_that_would_end_the_job_from_the_cache_alone_is_made_again_from_a_list() -> None:
    kube = ListsRunningPods(replicas=2)
    reconcile(kube, *KEY)  # type: ignore[arg-type]
    reconcile(kube, *KEY)  # type: ignore[arg-type]  # the ranks run: phase Running
    job = parse_job(kube.job)
    stale = [failed(builders.pod(job, 0, 0), exit_code=1), builders.pod(job, 1, 0)]  # a permanent failure
    kube.calls.clear()
    reconcile(kube, *KEY, pods=FakeCache(stale))  # type: ignore[arg-type]
    assert "LIST pods" in kube.calls, "the cache said the job failed: the apiserver is asked before acting"
    assert kube.job["status"]["phase"] != "Failed"
