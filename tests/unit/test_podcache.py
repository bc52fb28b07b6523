"""The pod index: watch events, our own creates and a fresh LIST, each with its one rule."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ddpjob_contract import exits
from ddpjob_contract.pods import (
    ANNOTATION_SPEC_HASH,
    LABEL_ATTEMPT,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    LABEL_RANK,
    MANAGED_BY,
)
from ddpjob_operator import podcache
from ddpjob_operator.podcache import PodCache, PodIndex, slim
from ddpjob_operator.status import pod_view


def pod(name: str, uid: str, *, job: str = "train", namespace: str = "ns", phase: str = "Pending") -> dict[str, Any]:
    labels = {LABEL_JOB_NAME: job, LABEL_MANAGED_BY: MANAGED_BY}
    return {"metadata": {"name": name, "uid": uid, "namespace": namespace, "labels": labels},
            "status": {"phase": phase}}  # fmt: skip


def names(index: PodIndex, job: str = "train", namespace: str = "ns") -> list[tuple[str, str]]:
    return sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in index.pods((namespace, job)))


def test_watch_events_add_replace_and_delete_a_jobs_pods() -> None:
    index = PodIndex()
    assert index.apply("ADDED", pod("train-0", "a")) == ("ns", "train")
    index.apply("ADDED", pod("train-1", "b"))
    index.apply("MODIFIED", pod("train-0", "a", phase="Running"))
    assert [p["status"]["phase"] for p in index.pods(("ns", "train")) if p["metadata"]["name"] == "train-0"] == [
        "Running"
    ]
    index.apply("DELETED", pod("train-1", "b"))
    assert names(index) == [("train-0", "a")]


def test_the_late_deletion_of_an_older_pod_does_not_remove_the_newer_pod_of_the_same_name() -> None:
    index = PodIndex()
    index.apply("ADDED", pod("train-0", "old"))
    index.created(pod("train-0", "new"))  # our POST answered before the watch told of the old one's end
    index.apply("DELETED", pod("train-0", "old"))
    assert names(index) == [("train-0", "new")]


def test_our_posts_answer_does_not_undo_what_the_watch_delivered_of_the_same_pod_before_it() -> None:
    """CI saw it: a pod set Running right after its create reached the cache by the watch first; the POST's answer,
    taken in after, put it back to Pending, and the job stayed Pending with both pods Running."""
    index = PodIndex()
    index.apply("MODIFIED", pod("train-0", "a", phase="Running"))
    index.created(pod("train-0", "a"))
    assert [p["status"]["phase"] for p in index.pods(("ns", "train"))] == ["Running"]


def versioned(phase: str, version: str, attempt: str = "0") -> dict[str, Any]:
    body = pod("train-0", "a", phase=phase)
    body["metadata"]["resourceVersion"] = version
    body["metadata"]["labels"][LABEL_ATTEMPT] = attempt
    return body


def test_the_answer_to_our_adopting_patch_is_taken_unless_the_watch_already_holds_a_newer_version() -> None:
    index = PodIndex()
    index.apply("MODIFIED", versioned("Running", "97"))
    index.created(versioned("Running", "102", attempt="1"))  # the patch that adopts it into attempt 1
    assert [p["metadata"]["labels"][LABEL_ATTEMPT] for p in index.pods(("ns", "train"))] == ["1"]
    index.apply("MODIFIED", versioned("Failed", "110", attempt="1"))  # delivered before a later answer of ours
    index.created(versioned("Running", "104", attempt="1"))
    assert [p["status"]["phase"] for p in index.pods(("ns", "train"))] == ["Failed"]


@pytest.mark.parametrize(("a", "b", "newer"), [("10", "9", True), ("9", "10", False), ("10", "10", False),
                                              ("", "9", False), ("09", "8", False), ("x1", "1", False)])  # fmt: skip
def test_resource_versions_compare_as_integers_and_only_when_well_formed(a: str, b: str, newer: bool) -> None:
    assert podcache.newer({"metadata": {"resourceVersion": a}}, {"metadata": {"resourceVersion": b}}) is newer


def stopped_pod(name: str, uid: str, message: str, code: int = 143) -> dict[str, Any]:
    body = pod(name, uid, phase="Failed")
    terminated = {"exitCode": code, "message": message, "finishedAt": "2026-01-01T00:00:09Z"}
    body["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
    return body


def test_the_deletion_of_a_pod_that_stopped_after_saving_keeps_its_last_words_until_a_newer_one() -> None:
    index = PodIndex()
    key = ("ns", "train")
    index.apply("ADDED", pod("train-0", "a"))
    index.apply("DELETED", stopped_pod("train-0", "a", exits.stopped_message(57, "SIGTERM")))
    assert index.pods(key) == []
    (kept,) = index.stopped(key)
    assert pod_view(kept, "trainer").message == exits.stopped_message(57, "SIGTERM")
    index.apply("DELETED", stopped_pod("train-1", "b", exits.stopped_message(30, "")))  # an older stop's, late
    index.apply("DELETED", stopped_pod("train-2", "c", "lost a peer", code=200))
    assert [p["metadata"]["uid"] for p in index.stopped(key)] == ["a"]
    index.apply("DELETED", stopped_pod("train-0", "d", exits.stopped_message(90, "")))
    assert [p["metadata"]["uid"] for p in index.stopped(key)] == ["d"]
    index.forget(key)
    assert index.stopped(key) == []


def test_a_pod_without_the_job_label_is_ignored() -> None:
    index = PodIndex()
    stray = pod("x", "u")
    del stray["metadata"]["labels"][LABEL_JOB_NAME]
    assert index.apply("ADDED", stray) is None
    assert index.pods(("ns", "train")) == []


def test_a_list_replaces_its_namespace_and_reports_jobs_gone_and_new() -> None:
    index = PodIndex()
    index.apply("ADDED", pod("a-0", "1", job="a"))
    index.apply("ADDED", pod("b-0", "2", job="b"))
    index.apply("ADDED", pod("c-0", "3", job="c", namespace="other"))
    touched = index.replace("ns", [pod("b-0", "2", job="b"), pod("d-0", "4", job="d")])
    assert touched == {("ns", "a"), ("ns", "b"), ("ns", "d")}  # a's pod went away during a gap
    assert names(index, "a") == [] and names(index, "d") == [("d-0", "4")]
    assert names(index, "c", "other") == [("c-0", "3")]  # another namespace's watch owns it


def test_a_cluster_wide_list_replaces_everything() -> None:
    index = PodIndex()
    index.apply("ADDED", pod("c-0", "3", job="c", namespace="other"))
    assert index.replace("", []) == {("other", "c")}
    assert names(index, "c", "other") == []


def test_a_slim_pod_reads_the_same_as_the_whole_pod() -> None:
    whole = pod("train-0", "a", phase="Failed")
    whole["metadata"] |= {"annotations": {ANNOTATION_SPEC_HASH: "h"}, "managedFields": [{"manager": "x"}],
                          "deletionTimestamp": "2026-11-23T00:00:00Z"}  # fmt: skip
    whole["metadata"]["labels"] |= {LABEL_RANK: "0", LABEL_ATTEMPT: "2"}
    rules = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [200]}}]
    whole["spec"] = {"nodeName": "node-1", "containers": [
        {"name": "trainer", "image": "i", "args": ["x"] * 100, "restartPolicyRules": rules},
        {"name": "sidecar", "image": "i"},
    ]}  # fmt: skip
    whole["status"] = {
        "phase": "Failed",
        "podIP": "10.0.0.1",
        "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 200, "finishedAt": "2026-11-23T00:00:01Z"}}}
        ],
        # what the scheduler says of a pod it cannot place, or preempts (read by pod_view); Ready is not read
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "minCount (6)",
             "lastTransitionTime": "2026-11-23T00:00:00Z"},
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "by g"},
            {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-23T00:00:00Z"},
        ],
    }  # fmt: skip
    view = pod_view(slim(whole), "trainer")
    assert view == pod_view(whole, "trainer")
    assert view.unschedulable and view.disruption, "the scheduler's words survive slimming"
    assert view.in_place, "so does the trainer's restart rule: without it no rank is ever restarted in place"
    assert [c["type"] for c in slim(whole)["status"]["conditions"]] == ["PodScheduled", "DisruptionTarget"]
    assert "managedFields" not in slim(whole)["metadata"]
    assert slim(whole)["spec"]["containers"] == [{"name": "trainer", "restartPolicyRules": rules}]


def test_only_changes_that_reconciles_read_concern_the_job() -> None:
    index = PodIndex()
    created = pod("train-0", "a")
    created["metadata"]["resourceVersion"] = "5"
    index.created(created)
    echoed = pod("train-0", "a")
    echoed["metadata"]["resourceVersion"] = "5"
    assert index.apply("ADDED", echoed) is None, "the watch's ADDED of the pod we created: nothing new"
    initialized = pod("train-0", "a")
    initialized["metadata"]["resourceVersion"] = "6"
    initialized["status"]["conditions"] = [{"type": "Initialized", "status": "False"}]
    assert index.apply("MODIFIED", initialized) is None, "a condition we do not read changes nothing"
    unschedulable = pod("train-0", "a")
    unschedulable["metadata"]["resourceVersion"] = "7"
    unschedulable["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    assert index.apply("MODIFIED", unschedulable) == ("ns", "train"), "why the scheduler cannot place it"
    again = {**unschedulable, "metadata": {**unschedulable["metadata"], "resourceVersion": "8"}}
    again["status"] = {
        **unschedulable["status"],
        "conditions": [{**unschedulable["status"]["conditions"][0], "lastTransitionTime": "2026-11-23T00:00:00Z"}],
    }
    assert index.apply("MODIFIED", again) is None, "a condition's timestamp alone changes nothing we read"
    assert index.apply("MODIFIED", pod("train-0", "a", phase="Running")) == ("ns", "train")
    assert index.apply("DELETED", pod("train-0", "a")) == ("ns", "train")


class FakePodSource:
    """The apiserver's pods for the cache: LISTs record their scope; watches wait until the cache stops."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.listed: list[str] = []
        self.stopped = threading.Event()

    def list_managed_pods(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        self.listed.append(namespace)
        return [p for p in self.pods if not namespace or p["metadata"]["namespace"] == namespace], "1"

    def watch_managed_pods(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        self.stopped.wait(seconds)
        yield from ()


@pytest.mark.parametrize(
    ("namespaces", "listed", "kept"),
    [
        (["team-a"], ["team-a"], {"team-a"}),
        (["team-*"], [""], {"team-a", "team-b"}),
        (["!kube-system"], [""], {"team-a", "team-b"}),  # Kopf's exclusion: every namespace but that one
        (["team-a", "kube-*"], [""], {"team-a", "kube-system"}),  # served when any pattern matches, as in Kopf
        (["*, !team-b"], [""], {"team-a", "kube-system"}),  # Kopf's comma-separated globs in one pattern
    ],
)
def test_the_cache_watches_the_namespaces_kopf_serves(namespaces: list[str], listed: list[str], kept: set[str]) -> None:
    source = FakePodSource([pod("x-0", ns, job="x", namespace=ns) for ns in ("team-a", "team-b", "kube-system")])
    cache = PodCache(source, namespaces, lambda key: None)
    cache.start()
    try:
        deadline = time.monotonic() + 10
        while not cache.synced and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(source.listed) == listed
        assert {ns for ns in ("team-a", "team-b", "kube-system") if cache.pods((ns, "x"))} == kept
    finally:
        cache.stop()
        source.stopped.set()


def _unschedulable(p: dict[str, Any], message: str) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return {**p, "status": {**p["status"], "conditions": [condition]}}


def test_the_schedulers_words_stay_while_the_same_pod_is_unschedulable_and_only_the_gangs_count_follows() -> None:
    index = PodIndex()
    words = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    count = "minCount (2) cannot be satisfied: 0 scheduled, 1 remaining"
    index.apply("MODIFIED", _unschedulable(pod("train-0", "u1"), words))
    index.apply("MODIFIED", _unschedulable(pod("train-0", "u1"), count))  # before any reconcile read the words
    assert pod_view(index.pods(("ns", "train"))[0], "trainer").unschedulable == words
    other = "0/1 nodes are available: 1 node(s) had untolerated taint."
    index.apply("MODIFIED", _unschedulable(pod("train-0", "u1"), other))  # new words replace the old
    assert pod_view(index.pods(("ns", "train"))[0], "trainer").unschedulable == other
    index.apply("MODIFIED", _unschedulable(pod("train-0", "u2"), count))  # a new pod of that name: its own words
    assert pod_view(index.pods(("ns", "train"))[0], "trainer").unschedulable == count
