"""The controller's calls: a cached body saves the GET, pods go out in parallel, a body not known
to be current is read again before the reconcile acts on it, and a refused pod fails the job in the
next plan. Its collaborators are fakes that honour the same Protocols as the real ones."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError, Executor, Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import pytest

from ddpjob_operator import builders
from ddpjob_operator.api import Key, parse_job
from ddpjob_operator.controller import Controller
from ddpjob_operator.kube import KubeError, NamespaceTerminating
from ddpjob_operator.node_health import ALL_HEALTHY, NodeHealth
from ddpjob_operator.podcache import PodIndex
from ddpjob_operator.progress import Scrape, Target
from ddpjob_operator.remembered import Bodies
from ddpjob_operator.workloads import Kueue

from . import factories

KEY = ("ns", "train")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
P = ParamSpec("P")
T = TypeVar("T")


class FakeKube:
    """Records every call; pods it creates are never listed (as if another actor deleted them)."""

    def __init__(self, replicas: int) -> None:
        self.job = factories.body(replicas=replicas)
        self.job["metadata"]["resourceVersion"] = "1"
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self.namespace_deleted: str | None = None
        """The namespace's deletionTimestamp: None while it lives."""
        self.posted: list[dict[str, Any]] = []
        """Every body created, in order."""
        self.in_place = False
        """Whether the cluster keeps restart rules (``restarts_in_place``)."""
        self._lock = threading.Lock()

    def _call(self, what: str) -> None:
        with self._lock:
            self.calls.append(what)
            self.threads.add(threading.current_thread().name.split("_")[0])

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("GET job")
        return self.job

    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        self._call("LIST pods")
        return []

    def replace_job_status(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._call("PUT status")
        rv = str(int(body["metadata"]["resourceVersion"]) + 1)
        self.job = {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}
        return self.job

    def create(self, obj: Mapping[str, Any]) -> bool:
        self._call(f"POST {obj['kind']}")
        with self._lock:
            self.posted.append(dict(obj))
        return True

    def create_pod(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """As ``create`` (a test's override of it sees pods too), answering the pod as created."""
        if not self.create(pod):
            return None
        return {**pod, "metadata": {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}"}}

    def delete_pod(self, namespace: str, name: str, uid: str = "", *, force: bool = False) -> None:
        self._call("DELETE pod now" if force else "DELETE pod")

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        self._call("DELETE job")

    def delete_pod_groups(self, namespace: str, job_name: str, keep_attempt: int) -> None:
        self._call(f"DELETE podgroups but attempt {keep_attempt}")

    def get_namespace(self, name: str) -> dict[str, Any] | None:
        self._call("GET namespace")
        return {"metadata": {"name": name, "deletionTimestamp": self.namespace_deleted}}

    # Kueue's Workloads: none here (a job without the queue label never asks)

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("GET workload")
        return None

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None:
        self._call(f"GET {plural}")
        return None

    def apply_workload_status(self, manager: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._call(f"APPLY workload status as {manager}")
        return {}

    def release_workload(self, namespace: str, name: str) -> None:
        self._call("RELEASE workload")

    # In-place restarts: the real client asks the cluster once per process (a dry run); here the test says

    def restarts_in_place(self, namespace: str) -> bool:
        return self.in_place

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self._call("PATCH pod")
        return {"metadata": {"name": name, "namespace": namespace, **patch["metadata"]}}


class Inline(Executor):
    """Runs each task at once in the calling thread: the controller's Events, in order, for the test to read."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class NoPolls:
    """A poller that has scraped nothing and records what it is told to poll."""

    def __init__(self) -> None:
        self.tracked: dict[Key, tuple[int, tuple[Target, ...]]] = {}

    def scrapes(self, key: Key) -> Sequence[Scrape]:
        return ()

    def track(self, key: Key, attempt: int, targets: tuple[Target, ...], interval: float) -> None:
        self.tracked[key] = (attempt, targets)


class Nodes:
    """The nodes as the node watch would say: ``health`` is what the next plan reads."""

    def __init__(self, health: NodeHealth = ALL_HEALTHY) -> None:
        self.now = health

    def health(self) -> NodeHealth:
        return self.now


class FakeCache:
    """A pod cache that shows ``shown`` for the job (plus the pods created), whatever the apiserver
    holds; None: not synced yet, so the controller lists the pods itself."""

    def __init__(self, shown: list[dict[str, Any]] | None = None) -> None:
        self.index = PodIndex()
        self.shown = shown

    def pods(self, key: Key) -> list[dict[str, Any]] | None:
        return None if self.shown is None else self.shown + self.index.pods(key)

    def created(self, pod: dict[str, Any]) -> None:
        self.index.created(pod)

    def stopped(self, key: Key) -> list[dict[str, Any]]:
        return self.index.stopped(key)

    def forget(self, key: Key) -> None:
        self.index.forget(key)


@pytest.fixture
def creates() -> Iterator[Executor]:
    with ThreadPoolExecutor(8, thread_name_prefix="create") as pool:
        yield pool


def controller(
    kube: FakeKube,
    creates: Executor,
    pods: FakeCache | None = None,
    *,
    pod_groups: bool = False,
    nodes: Nodes | None = None,
) -> Controller:
    return Controller(kube, pods or FakeCache(), NoPolls(), lambda: T0, nodes=nodes or Nodes(), kueue=Kueue(kube),
                      creates=creates, events=Inline(),
                      pod_groups=pod_groups)  # fmt: skip


def test_a_new_jobs_service_and_pods_are_made_first_then_one_status_write_says_it_launched(
    creates: Executor,
) -> None:
    kube = FakeKube(replicas=4)
    ctl = controller(kube, creates, FakeCache([]))
    bodies = ctl.bodies
    bodies.put(KEY, kube.job)
    assert ctl.reconcile(KEY) == 0.0, "look again at once: the pods just made are in the cache"
    assert kube.calls[0] == "GET job", "the watch's body is checked still current, as a status write would prove"
    assert "PUT status" not in kube.calls and "POST Event" not in kube.calls
    pods = [i for i, call in enumerate(kube.calls) if call == "POST Pod"]
    assert kube.calls.index("POST Service") < min(pods), "the Service first: a crash never leaves pods without it"
    assert kube.calls.count("POST Pod") == 4 and kube.calls.count("POST Service") == 1
    assert "create" in kube.threads, "pods are created on the create pool"
    kube.calls.clear()

    assert ctl.reports_only(KEY), "what is left is a report: it may wait while other jobs' pods are made"
    ctl.reconcile(KEY)
    assert not ctl.reports_only(KEY)
    assert kube.calls == ["PUT status", "POST Event"], "one write says it all, then the Created Event"
    status = kube.job["status"]
    assert (status["phase"], status["launchedAttempt"], status["replicas"]["active"]) == ("Pending", 0, 4)
    reasons = {c["type"]: c["reason"] for c in status["conditions"]}
    assert reasons["Created"] == "Created" and reasons["Running"] == "PodsPending"
    assert kube.posted[-1]["reason"] == "Created"
    assert bodies.get(KEY) is kube.job, "the status write's answer is the newest body"
    kube.calls.clear()

    ctl.reconcile(KEY)
    assert kube.calls == [], "nothing left to write or make"


@pytest.mark.parametrize("now", ["made again", "deleted"])
def test_a_new_job_changed_since_the_watch_delivered_it_gets_no_pods_from_the_old_body(
    creates: Executor, now: str
) -> None:
    kube = FakeKube(replicas=2)
    ctl = controller(kube, creates, FakeCache([]))
    ctl.bodies.put(KEY, kube.job)
    again = factories.body(replicas=2)
    again["metadata"].update(uid="uid-2", resourceVersion="7")
    kube.get_job = lambda namespace, name: again if now == "made again" else None  # type: ignore[method-assign]
    assert ctl.reconcile(KEY) == 0.0
    assert not [c for c in kube.calls if c.startswith("POST")], "no pod owned by a job that is no longer there"
    assert ctl.bodies.get(KEY) is (again if now == "made again" else None)
    ctl.reconcile(KEY)
    owners = {o["metadata"]["ownerReferences"][0]["uid"] for o in kube.posted if o["kind"] == "Pod"}
    assert owners == ({"uid-2"} if now == "made again" else set())


def test_where_podgroups_are_served_the_attempts_podgroup_comes_before_its_pods(
    creates: Executor,
) -> None:
    kube = FakeKube(replicas=3)
    ctl = controller(kube, creates, FakeCache([]), pod_groups=True)
    ctl.bodies.put(KEY, kube.job)
    ctl.reconcile(KEY)
    ctl.reconcile(KEY)  # the status, once the pods exist
    pods = [i for i, call in enumerate(kube.calls) if call == "POST Pod"]
    group = kube.calls.index("POST PodGroup")
    assert group < min(pods), "the gang first: a pod naming an absent PodGroup would wait for it"
    assert not [c for c in kube.calls if c.startswith("DELETE podgroups")], "attempt 0 has no older PodGroups"
    (body,) = [o for o in kube.posted if o["kind"] == "PodGroup"]
    assert body["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    names = {o["spec"]["schedulingGroup"]["podGroupName"] for o in kube.posted if o["kind"] == "Pod"}
    assert names == {body["metadata"]["name"]}
    status = kube.job["status"]
    (gang,) = [c for c in status["conditions"] if c["type"] == "GangScheduling"]
    assert gang["status"] == "True" and gang["reason"] == "PodGroup"


def test_the_service_and_the_podgroup_are_made_side_by_side_and_both_before_any_pod(creates: Executor) -> None:
    meet = threading.Barrier(2, timeout=10)

    class Meets(FakeKube):
        def create(self, obj: Mapping[str, Any]) -> bool:
            if obj["kind"] in ("Service", "PodGroup"):
                meet.wait()  # each waits for the other: made one after the other, they never meet
            return super().create(obj)

    kube = Meets(replicas=2)
    ctl = controller(kube, creates, FakeCache([]), pod_groups=True)
    ctl.reconcile(KEY)
    pods = [i for i, call in enumerate(kube.calls) if call == "POST Pod"]
    assert len(pods) == 2 and max(kube.calls.index("POST Service"), kube.calls.index("POST PodGroup")) < min(pods)


def test_a_later_attempts_podgroup_comes_before_its_pods_and_the_older_attempts_podgroups_go(
    creates: Executor,
) -> None:
    kube = FakeKube(replicas=2)
    kube.job["status"] = {"phase": "Restarting", "attempt": 1, "launchedAttempt": 0, "restarts": 1}
    ctl = controller(kube, creates, pod_groups=True)
    ctl.bodies.put(KEY, kube.job)
    ctl.reconcile(KEY)
    group = kube.calls.index("POST PodGroup")
    assert kube.calls[group + 1] == "DELETE podgroups but attempt 1"
    assert group + 1 < kube.calls.index("POST Pod")


def test_where_podgroups_are_not_served_auto_places_pods_one_by_one_and_says_so(creates: Executor) -> None:
    kube = FakeKube(replicas=2)
    ctl = controller(kube, creates, FakeCache([]), pod_groups=False)
    ctl.bodies.put(KEY, kube.job)
    ctl.reconcile(KEY)
    ctl.reconcile(KEY)  # the status, once the pods exist
    assert "POST PodGroup" not in kube.calls and kube.calls.count("POST Pod") == 2
    (gang,) = [c for c in kube.job["status"]["conditions"] if c["type"] == "GangScheduling"]
    assert gang["status"] == "False" and gang["reason"] == "PodGroupNotServed" and "one by one" in gang["message"]


def test_required_where_podgroups_are_not_served_fails_the_job_before_any_pod_is_made(creates: Executor) -> None:
    kube = FakeKube(replicas=2)
    kube.job["spec"]["gangScheduling"] = "Required"
    ctl = controller(kube, creates, pod_groups=False)
    ctl.bodies.put(KEY, kube.job)
    ctl.reconcile(KEY)
    assert not [c for c in kube.calls if c.startswith("POST") and c != "POST Event"]
    status = kube.job["status"]
    (failed,) = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert status["phase"] == "Failed" and failed["reason"] == "GangSchedulingUnavailable"
    assert "spec.gangScheduling" in failed["message"] and "Auto" in failed["message"]


def test_a_cached_body_that_would_act_without_writing_the_status_is_read_again_first(creates: Executor) -> None:
    kube = FakeKube(replicas=2)
    ctl = controller(kube, creates)
    bodies = ctl.bodies
    bodies.put(KEY, kube.job)
    ctl.reconcile(KEY)  # the pods, before any status
    ctl.reconcile(KEY)  # the status, and (the list shows none) the pods again
    kube.calls.clear()

    assert ctl.reconcile(KEY) == 0.0
    assert kube.calls == ["LIST pods"], "the pods are missing again, but the cached body may be stale: no creates"
    assert bodies.get(KEY) is None
    ctl.reconcile(KEY)
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


def failed(pod: dict[str, Any], exit_code: int) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "finishedAt": "2026-11-23T00:00:00Z"}
    status = {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}
    return {**pod, "metadata": {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}"}, "status": status}


def test_with_a_synced_pod_cache_a_new_job_needs_no_list_and_its_created_pods_are_in_the_cache_at_once(
    creates: Executor,
) -> None:
    kube = FakeKube(replicas=2)
    cache = FakeCache([])
    ctl = controller(kube, creates, cache)
    ctl.reconcile(KEY)
    assert "LIST pods" not in kube.calls and kube.calls.count("POST Pod") == 2
    assert sorted(p["metadata"]["name"] for p in cache.index.pods(KEY)) == ["train-0", "train-1"]
    kube.calls.clear()
    ctl.reconcile(KEY)
    assert "POST Pod" not in kube.calls, "the pods just created are not created again before the watch shows them"


class ListsRunningPods(FakeKube):
    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        self._call("LIST pods")
        job = parse_job(self.job)
        return [
            {**builders.pod(job, r, 0, gang=False), "status": {"phase": "Running"}} for r in range(job.spec.replicas)
        ]


def test_a_plan_that_would_end_the_job_from_the_cache_alone_is_made_again_from_a_list(creates: Executor) -> None:
    kube = ListsRunningPods(replicas=2)
    cache = FakeCache()
    ctl = controller(kube, creates, cache)
    ctl.reconcile(KEY)
    ctl.reconcile(KEY)  # the ranks run: phase Running
    job = parse_job(kube.job)
    cache.shown = [
        failed(builders.pod(job, 0, 0, gang=False), exit_code=1),
        builders.pod(job, 1, 0, gang=False),
    ]  # a permanent failure
    kube.calls.clear()
    ctl.reconcile(KEY)
    assert "LIST pods" in kube.calls, "the cache said the job failed: the apiserver is asked before acting"
    assert kube.job["status"]["phase"] != "Failed"


class RefusesPods(FakeKube):
    """An apiserver that refuses every pod with ``status``, as it does an invalid one (422) or over quota (403)."""

    def __init__(self, replicas: int, status: int) -> None:
        super().__init__(replicas)
        self.status = status
        self.events: list[str] = []

    def create(self, obj: Mapping[str, Any]) -> bool:
        if obj["kind"] == "Pod":
            self._call("POST Pod")
            raise KubeError(self.status, 'Pod "train-0" is invalid: spec.dnsPolicy: Unsupported value: "Sometimes"')
        if obj["kind"] == "Event":
            self.events.append(obj["reason"])
        return super().create(obj)


def test_a_pod_refused_as_invalid_fails_the_job_in_the_next_plan_with_one_status_write(creates: Executor) -> None:
    kube = RefusesPods(replicas=2, status=422)
    ctl = controller(kube, creates)
    assert ctl.reconcile(KEY) == 0.0, "look again at once"
    assert "PUT status" not in kube.calls and kube.calls.count("GET job") == 1, "the first status is the failure"
    kube.calls.clear()
    assert ctl.reconcile(KEY) is None
    failed = next(c for c in kube.job["status"]["conditions"] if c["type"] == "Failed")
    assert (kube.job["status"]["phase"], failed["reason"]) == ("Failed", "InvalidPodTemplate")
    assert "spec.dnsPolicy" in failed["message"] and kube.events[-1] == "InvalidPodTemplate"
    assert kube.calls.count("PUT status") == 1 and "POST Pod" not in kube.calls
    kube.calls.clear()
    ctl.reconcile(KEY)
    assert "PUT status" not in kube.calls and "POST Pod" not in kube.calls, "failed once, and it stays so"


def test_a_pod_refused_for_another_reason_is_reported_and_retried(creates: Executor) -> None:
    kube = RefusesPods(replicas=2, status=403)
    ctl = controller(kube, creates)
    with pytest.raises(KubeError):
        ctl.reconcile(KEY)
    assert kube.events[-1] == "PodCreateFailed"
    with pytest.raises(KubeError):
        ctl.reconcile(KEY)  # the work queue's retry writes the status first
    running = next(c for c in kube.job["status"]["conditions"] if c["type"] == "Running")
    assert kube.job["status"]["phase"] == "Pending" and running["reason"] == "PodCreateFailed"


def test_a_pod_creation_failing_otherwise_is_said_in_status_until_the_pods_exist(creates: Executor) -> None:
    """Kueue's pod webhook down (failurePolicy Fail): the apiserver answers 500 naming the webhook."""
    kube = RefusesPods(replicas=2, status=500)
    ctl = controller(kube, creates)
    with pytest.raises(KubeError):
        ctl.reconcile(KEY)
    with pytest.raises(KubeError):
        ctl.reconcile(KEY)  # the work queue's retry: the status now says why, and it tries again
    running = next(c for c in kube.job["status"]["conditions"] if c["type"] == "Running")
    assert running["reason"] == "PodCreateFailed" and "retrying" in running["message"], running
    assert "HTTP 500" in running["message"] and kube.job["status"]["phase"] == "Pending"
    kube.status = 0  # the webhook is back

    def create(obj: Mapping[str, Any]) -> bool:
        return FakeKube.create(kube, obj)

    kube.create = create  # type: ignore[method-assign]
    for _ in range(3):  # create, read the job again (the body cached was not written), say so
        ctl.reconcile(KEY)
    running = next(c for c in kube.job["status"]["conditions"] if c["type"] == "Running")
    assert running["reason"] != "PodCreateFailed", running


def test_launched_ranks_that_vanish_with_their_terminating_namespace_restart_nothing_and_create_nothing(
    creates: Executor,
) -> None:
    kube = FakeKube(replicas=2)
    cache = FakeCache([])
    ctl = controller(kube, creates, cache)
    ctl.reconcile(KEY)
    ctl.reconcile(KEY)  # every pod seen: the attempt is launched
    assert kube.job["status"]["launchedAttempt"] == 0
    kube.namespace_deleted = "2026-01-01T00:00:00Z"
    cache.index = PodIndex()  # the namespace controller deleted them
    kube.calls.clear()
    assert ctl.reconcile(KEY) is None, "the namespace controller deleted the pods: not a failure"
    assert "PUT status" not in kube.calls and "POST Pod" not in kube.calls and "POST Event" not in kube.calls
    assert kube.job["status"]["restarts"] == 0
    kube.calls.clear()
    ctl.reconcile(KEY)
    assert kube.calls == [], "a job of a namespace being deleted is left alone, without asking again"


@pytest.mark.parametrize("refused", ["Service", "Pod"])
def test_a_create_refused_because_the_namespace_is_terminating_ends_the_jobs_work_quietly(
    creates: Executor, refused: str
) -> None:
    class Terminating(FakeKube):
        def create(self, obj: Mapping[str, Any]) -> bool:
            if obj["kind"] != refused:
                return super().create(obj)
            self._call(f"POST {obj['kind']}")
            raise NamespaceTerminating(403, f"{obj['kind']} is forbidden: namespace ns is being terminated")

    kube = Terminating(replicas=2)
    kube.namespace_deleted = "2026-01-01T00:00:00Z"
    ctl = controller(kube, creates)
    assert ctl.reconcile(KEY) is None, "no error: nothing to retry"
    assert kube.calls.count("POST Service") == 1 and kube.calls.count("POST Pod") == (2 if refused == "Pod" else 0)
    kube.calls.clear()
    ctl.reconcile(KEY)
    assert kube.calls == [], "the other jobs of that namespace are left alone too"
    kube.job["metadata"]["creationTimestamp"] = "2026-01-01T00:05:00Z"
    kube.calls.clear()
    ctl.reconcile(KEY)
    ctl.reconcile(KEY)  # the first acts on no cached body: it reads the job again
    assert "POST Service" in kube.calls, "a job made after that deletion began is in a namespace made anew"


def test_a_plan_that_ends_something_in_a_living_namespace_goes_ahead(creates: Executor) -> None:
    kube = ListsRunningPods(replicas=2)
    ctl = controller(kube, creates, FakeCache([]))
    ctl.reconcile(KEY)
    ctl.reconcile(KEY)
    job = parse_job(kube.job)
    ctl._pods = FakeCache(
        [failed(builders.pod(job, 0, 0, gang=False), exit_code=1), builders.pod(job, 1, 0, gang=False)]
    )
    kube.list_pods = lambda namespace, name: [failed(builders.pod(job, 0, 0, gang=False), exit_code=1),  # type: ignore[method-assign]
                                              builders.pod(job, 1, 0, gang=False)]  # fmt: skip
    kube.calls.clear()
    ctl.reconcile(KEY)
    assert "GET namespace" in kube.calls and kube.job["status"]["phase"] == "Failed"


def test_a_reconcile_creating_pods_ends_when_the_operator_stops_and_cancels_the_queued_creates() -> None:
    # With concurrent.futures.wait, a create cancelled in the queue never woke the reconcile: its thread
    # blocked the interpreter's exit forever (a whole `make test` hung after its summary line).
    started, release = threading.Event(), threading.Event()
    kube = FakeKube(replicas=4)
    create = kube.create

    def slow(obj: Mapping[str, Any]) -> bool:
        if obj["kind"] == "Pod":
            started.set()
            release.wait(10)
        return create(obj)

    kube.create = slow  # type: ignore[method-assign]
    queued = threading.Event()

    class Pool(ThreadPoolExecutor):
        """Says when the reconcile has handed it all four creates: a stop before that would meet a submit
        (RuntimeError, not the cancel this test is about), as it did once on a loaded machine."""

        submitted = 0

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            future = super().submit(fn, *args, **kwargs)
            Pool.submitted += 1
            if Pool.submitted == 4:
                queued.set()
            return future

    pool = Pool(1, thread_name_prefix="create")  # one at a time: the other ranks queue
    ctl = controller(kube, pool)
    ctl.bodies.put(KEY, kube.job)
    failed: list[BaseException] = []

    def reconcile() -> None:
        try:
            ctl.reconcile(KEY)
        except BaseException as err:  # what the stopping operator's reconcile ends with
            failed.append(err)

    worker = threading.Thread(target=reconcile, daemon=True)
    worker.start()
    assert started.wait(10), "the first create began"
    assert queued.wait(10), "the reconcile queued the other ranks' creates"
    pool.shutdown(wait=False, cancel_futures=True)  # what Runtime.stop does
    release.set()
    worker.join(10)
    assert not worker.is_alive(), "the reconcile still waits on creates that were cancelled"
    assert [type(e) for e in failed] == [CancelledError]


class AdmittedByKueue(FakeKube):
    """A job labelled for a Kueue queue whose Workload Kueue admitted with 2 of its 4 ranks (partial admission)."""

    def __init__(self) -> None:
        super().__init__(replicas=4)
        self.job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
        self.job["spec"]["minReplicas"] = 2
        self.created: list[Mapping[str, Any]] = []

    def create(self, obj: Mapping[str, Any]) -> bool:
        self.created.append(obj)
        return super().create(obj)

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("GET workload")
        conditions = [{"type": t, "status": "True", "reason": t, "message": ""} for t in ("QuotaReserved", "Admitted")]
        admission = {"clusterQueue": "cq", "podSetAssignments": [{"name": "ranks", "flavors": {}, "count": 2}]}
        return {"metadata": {"name": name, "namespace": namespace, "uid": "w", "finalizers": []},
                "spec": {"podSets": [{"name": "ranks", "count": 4, "minCount": 2}]},
                "status": {"conditions": conditions, "admission": admission}}  # fmt: skip


def test_under_partial_admission_the_pods_and_the_podgroup_are_built_for_the_admitted_ranks(
    creates: Executor,
) -> None:
    kube = AdmittedByKueue()
    ctl = controller(kube, creates, pod_groups=True)
    kube.job["status"] = {"phase": "Queued", "attempt": 0, "launchedAttempt": -1}
    ctl.reconcile(KEY)  # admitted: the attempt's pods are made in the same reconcile
    pods = [o for o in kube.created if o["kind"] == "Pod"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["train-0", "train-1"]
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["WORLD_SIZE"] == "2"
    (group,) = [o for o in kube.created if o["kind"] == "PodGroup"]
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2
    assert kube.job["status"]["admittedReplicas"] == 2


def test_the_pods_made_avoid_the_nodes_the_job_excludes(creates: Executor) -> None:
    kube = FakeKube(replicas=2)
    since = T0.isoformat().replace("+00:00", "Z")
    kube.job["status"] = {"excludedNodes": [{"name": "node-1", "reason": "NodeLost", "since": since}]}
    ctl = controller(kube, creates, FakeCache([]))
    ctl.reconcile(KEY)
    pods = [o for o in kube.posted if o["kind"] == "Pod"]
    assert len(pods) == 2
    for made in pods:
        (term,) = made["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert term["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-1"]}
        ]


def test_pod_changes_that_decide_nothing_are_written_together_and_a_failure_is_written_at_once(
    creates: Executor,
) -> None:
    """KWOK's pod stages cost about four status writes per rank (bench.scale): each pod bound, then each running, was
    one write. Such changes now wait until 2 s after the job's last write (``write_pace``) and go out together; a
    change that decides something (here a failure, with no restart left) does not wait."""
    kube = FakeKube(replicas=2)
    cache = FakeCache([])
    clock = [T0]
    ctl = Controller(kube, cache, NoPolls(), lambda: clock[0], nodes=Nodes(), kueue=Kueue(kube), creates=creates,
                     events=Inline(), pod_groups=False)  # fmt: skip
    ctl.bodies.put(KEY, kube.job)
    ctl.reconcile(KEY)
    ctl.reconcile(KEY)  # the status, once the pods exist: Pending, written at T0
    assert kube.calls.count("PUT status") == 1
    kube.calls.clear()

    def bound(rank: int, node: str, **status: Any) -> None:
        (pod,) = [p for p in cache.index.pods(KEY) if p["metadata"]["name"] == f"train-{rank}"]
        cache.index.apply("MODIFIED", {**pod, "spec": {**pod.get("spec", {}), "nodeName": node},
                                       "status": {**pod.get("status", {}), **status}})  # fmt: skip

    bound(0, "node-a")
    clock[0] = T0 + timedelta(seconds=0.5)
    assert ctl.reconcile(KEY) == pytest.approx(1.5), "looked at again when the pace allows"
    bound(1, "node-b")
    clock[0] = T0 + timedelta(seconds=1.2)
    assert ctl.reconcile(KEY) == pytest.approx(0.8)
    assert "PUT status" not in kube.calls, "where each rank runs decides nothing: it waits"
    clock[0] = T0 + timedelta(seconds=2.0)
    ctl.reconcile(KEY)
    assert kube.calls == ["PUT status"], "both ranks' nodes in one write"
    assert kube.job["status"]["placement"]["nodes"] == ["node-a", "node-b"]
    kube.calls.clear()

    failed = {"name": "trainer", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    bound(1, "node-b", phase="Failed", containerStatuses=[failed])
    kube.list_pods = lambda namespace, name: cache.index.pods(KEY)  # type: ignore[method-assign]
    clock[0] = T0 + timedelta(seconds=2.1)
    ctl.reconcile(KEY)
    writes = [c for c in kube.calls if not c.startswith(("LIST", "GET"))]
    assert writes[0] == "PUT status", "a rank's failure decides the job's end: written at once, before it acts"
    assert kube.job["status"]["phase"] == "Failed", kube.job["status"]
