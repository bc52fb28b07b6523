"""Kueue in one place (``workloads``): the Workloads come from one watch, which wakes only the job whose Workload
Kueue wrote; until it has listed, a reconcile GETs, and while Kueue is not served the watch waits quietly."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from ddpjob_contract import kueue
from ddpjob_operator.api import Key
from ddpjob_operator.kube import NotServed
from ddpjob_operator.listwatch import NotYet
from ddpjob_operator.workloads import FLAVOR_SECONDS, Kueue, WorkloadWatch


def workload(name: str, job: str, *, rv: str = "5", uid: str = "u1", ns: str = "ns", **meta: Any) -> dict[str, Any]:
    labels = {"ddpjob.dev/job-name": job, "app.kubernetes.io/managed-by": "ddpjob-operator"}
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv, "labels": labels,
                         "managedFields": [{"manager": "kueue"}], **meta},
            "status": {"conditions": []}}  # fmt: skip


class Api:
    """The requests ``Kueue`` makes, recorded; ``stored`` is what the apiserver holds."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.served = True

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"GET {name}")
        if not self.served:
            raise NotServed(404, "404 page not found")
        return self.stored.get((namespace, name))

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"GET {plural}/{name}")
        return None

    def create(self, obj: Mapping[str, Any]) -> bool:
        where = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        self.calls.append(f"POST {where[1]}")
        if where in self.stored:
            return False
        self.stored[where] = dict(obj)
        return True

    def apply_workload_status(self, manager: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(f"APPLY {body['metadata']['name']}")
        return workload(body["metadata"]["name"], "train", rv="9", status_of=manager)

    def release_workload(self, namespace: str, name: str) -> None:
        self.calls.append(f"RELEASE {name}")

    # the watch's own connection

    def serves(self, api_version: str, plural: str) -> bool:
        assert (api_version, plural) == (kueue.API_VERSION, "workloads")
        return self.served

    def list_workloads(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(f"LIST {namespace or 'all'}")
        return list(self.stored.values()), "10"

    def watch_workloads(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())


def watch(api: Api, woken: list[Key], served: list[str] | None = None) -> tuple[Kueue, WorkloadWatch]:
    client = Kueue(api)
    return client, WorkloadWatch(api, served or [], client, woken.append)


def test_before_the_watch_has_listed_a_reconcile_gets_the_workload_and_after_it_asks_nothing() -> None:
    api = Api()
    api.stored[("ns", "w")] = workload("w", "train")
    client, watcher = watch(api, woken := [])
    assert not client.watched("ns") and client.workload("ns", "w") is not None
    assert api.calls == ["GET w"]
    watcher._list("")
    assert woken == [("ns", "train")], "the LIST wakes the job of every Workload it found"
    api.calls.clear()
    read = client.workload("ns", "w")
    assert client.watched("ns") and read is not None and "managedFields" not in read["metadata"]
    assert client.workload("ns", "other") is None
    assert api.calls == [], "a watched Workload is read from memory: a queued job costs no request while it waits"


def test_each_watch_event_wakes_only_its_job_and_a_deletion_of_an_older_workload_of_that_name_is_ignored() -> None:
    api = Api()
    client, watcher = watch(api, woken := [])
    watcher._list("")
    watcher._event("", "ADDED", workload("w1", "a"))
    watcher._event("", "MODIFIED", workload("w2", "b", rv="6", uid="u2"))
    assert woken == [("ns", "a"), ("ns", "b")]
    watcher._event("", "DELETED", workload("w2", "b", uid="older"))
    assert client.workload("ns", "w2") is not None, "another incarnation's deletion leaves this one"
    watcher._event("", "DELETED", workload("w2", "b", uid="u2"))
    assert client.workload("ns", "w2") is None


def test_a_relist_replaces_what_was_known_in_its_scope_and_wakes_the_jobs_of_workloads_gone_meanwhile() -> None:
    api = Api()
    api.stored[("ns", "w1")] = workload("w1", "a")
    client, watcher = watch(api, woken := [], served=["ns"])
    watcher._list("ns")
    del api.stored[("ns", "w1")]
    api.stored[("ns", "w2")] = workload("w2", "b")
    woken.clear()
    watcher._list("ns")
    assert sorted(woken) == [("ns", "a"), ("ns", "b")]
    assert client.workload("ns", "w1") is None and client.workload("ns", "w2") is not None


def test_our_own_create_and_status_write_are_known_at_once_but_never_over_a_newer_watched_version() -> None:
    api = Api()
    client, watcher = watch(api, [])
    watcher._list("")
    assert client.create(workload("w", "train", rv=""))
    assert client.workload("ns", "w") is not None, "the next reconcile does not create it again"
    api.stored[("ns", "x")] = workload("x", "train")
    assert not client.create(workload("x", "train")), "there already"
    assert client.workload("ns", "x") is not None, "the one there is read and known"
    watcher._event("", "MODIFIED", workload("w", "train", rv="12"))
    client.apply_status("ddpjob-operator", workload("w", "train"))
    assert client.workload("ns", "w")["metadata"]["resourceVersion"] == "12", "the watch's newer version stays"
    watcher._event("", "MODIFIED", workload("w", "train", rv="8"))
    client.apply_status("ddpjob-operator", workload("w", "train"))
    assert client.workload("ns", "w")["metadata"]["resourceVersion"] == "9"


def test_while_kueue_is_not_served_the_watch_waits_quietly_and_a_reconcile_hears_not_served() -> None:
    api = Api()
    api.served = False
    client, watcher = watch(api, [])
    with pytest.raises(NotYet):
        watcher._list("")
    assert not client.watched("ns") and "LIST all" not in api.calls
    with pytest.raises(NotServed):
        client.workload("ns", "w")


def test_the_watch_thread_waits_for_kueue_then_lists_without_logging_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    installed = threading.Event()

    class Later(Api):
        def serves(self, api_version: str, plural: str) -> bool:
            return installed.is_set()

    api = Later()
    client = Kueue(api)
    watcher = WorkloadWatch(api, [], client, lambda key: None, unserved_seconds=0.05)
    watcher.start()
    try:
        assert not installed.wait(0.2) and not client.watched("ns")
        installed.set()
        for _ in range(100):
            if client.watched("ns"):
                break
            time.sleep(0.05)
        assert client.watched("ns"), "listed once Kueue is served"
    finally:
        watcher.stop()
    assert not [r for r in caplog.records if r.levelname == "WARNING"], "Kueue not installed is no failure"


def test_the_orphans_are_the_workloads_being_deleted_that_kueues_finalizer_still_holds() -> None:
    api = Api()
    client, watcher = watch(api, [])
    watcher._list("")
    held = {"deletionTimestamp": "2026-11-29T00:00:00Z", "finalizers": [kueue.FINALIZER]}
    watcher._event("", "MODIFIED", workload("w1", "a", **held))
    watcher._event("", "MODIFIED", workload("w2", "b", deletionTimestamp="2026-11-29T00:00:00Z"))
    watcher._event("", "MODIFIED", workload("w3", "c", finalizers=[kueue.FINALIZER]))
    assert client.orphans() == [("ns", "w1", ("ns", "a"))]


def test_a_resourceflavor_is_read_once_per_half_minute_not_on_every_reconcile() -> None:
    api = Api()
    now = [100.0]
    client = Kueue(api, clock=lambda: now[0])
    for _ in range(5):
        client.flavor("gpu")
    assert api.calls == ["GET resourceflavors/gpu"]
    now[0] += FLAVOR_SECONDS
    client.flavor("gpu")
    client.flavor("cpu")
    assert api.calls == ["GET resourceflavors/gpu", "GET resourceflavors/gpu", "GET resourceflavors/cpu"]


def test_the_jobs_whose_topology_assignment_names_a_node_are_found_to_be_woken_when_it_turns_ready() -> None:
    """A job is held while its assignment names a lost node (no pod made there); the node's return must wake it, as
    Kueue's replacement would, not the 300 s resync. Without the wake it waited for the resync (issue 45's note)."""
    api = Api()
    client, watcher = watch(api, [])
    watcher._list("")
    placed = workload("w1", "a")
    tas = {"levels": ["topology.ddpjob.dev/rack", "kubernetes.io/hostname"],
           "slices": [{"domainCount": 2, "valuesPerLevel": [{"universal": "rack-1"},
                                                           {"individual": {"roots": ["node-2", "node-3"]}}],
                       "podCounts": {"universal": 1}}]}  # fmt: skip
    placed["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
        {"name": kueue.POD_SET, "count": 2, "topologyAssignment": tas}]}  # fmt: skip
    watcher._event("", "MODIFIED", placed)
    watcher._event("", "MODIFIED", workload("w2", "b", uid="u2"))  # admitted without a topology: names no node
    assert client.jobs_assigned("node-3") == {("ns", "a")}
    assert client.jobs_assigned("node-9") == set()
