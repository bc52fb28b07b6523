"""policies.node_loss: a rank on a lost or sick node restarts the gang off it at once, once, and the job avoids the
node until the entry expires; only pods on a lost node are deleted with no grace period."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from ddpjob_contract.status import Phase
from ddpjob_operator import builders
from ddpjob_operator.lifecycle import plan
from ddpjob_operator.node_health import NodeHealth
from ddpjob_operator.nodewatch import NodeWatch
from ddpjob_operator.policies import node_loss
from ddpjob_operator.status import ExcludedNode, parse_status

from .factories import job
from .test_lifecycle import T0, FakeCluster, running


def node(name: str, ready: str = "True", taints: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"taints": [{"key": t, "effect": "NoSchedule"} for t in taints]},
        "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown" if ready == "Unknown"
                                   else "KubeletReady", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("seen", "lost", "sick"),
    [
        (node("a"), "", ""),
        (
            node("a", ready="Unknown"),
            "its Ready condition is Unknown (NodeStatusUnknown) since 2026-01-01T00:00:00Z",
            "",
        ),
        (node("a", ready="False"), "its Ready condition is False (KubeletReady) since 2026-01-01T00:00:00Z", ""),
        (None, "the node was deleted", ""),
        (
            node("a", taints=("node.kubernetes.io/out-of-service",)),
            "the node carries the taint node.kubernetes.io/out-of-service",
            "",
        ),
        (node("a", taints=("nvidia.com/gpu-unhealthy",)), "", "the node carries the taint nvidia.com/gpu-unhealthy"),
        (node("a", taints=("example.com/other",)), "", ""),
    ],
)
def test_a_node_reads_as_lost_sick_or_healthy(seen: dict[str, Any] | None, lost: str, sick: str) -> None:
    assert node_loss.read(seen) == (lost, sick)


def on_nodes(replicas: int = 2) -> Any:
    c = running(replicas)
    for rank in range(replicas):
        c.set(rank, node=f"node-{rank}")
    return c


def test_a_rank_on_a_lost_node_restarts_the_gang_once_and_only_its_pod_is_deleted_at_once() -> None:
    c = on_nodes(2)
    lost = NodeHealth(lost={"node-1": "its Ready condition is Unknown"})
    p = plan(c.job, c.status, list(c.pods.values()), T0, nodes=lost)
    assert p.status.phase is Phase.RESTARTING
    assert (p.status.attempt, p.status.restarts) == (1, 1)
    restarting = p.status.condition("Restarting")
    assert restarting is not None and restarting.reason == "NodeLost"
    assert "node node-1 is lost (its Ready condition is Unknown): rank 1's pod train-1 ran there" in restarting.message
    assert [e.reason for e in p.events] == ["NodeLost"]
    assert [x.name for x in p.force_delete_pods] == ["train-1"], "only the pod whose kubelet cannot confirm"
    assert [x.name for x in p.delete_pods] == ["train-0"], "a pod on a healthy node stops with its grace period"
    (excluded,) = p.status.excluded_nodes
    assert (excluded.name, excluded.reason, excluded.since) == ("node-1", "NodeLost", T0)
    assert p.avoid_nodes == ("node-1",)

    # The next plans: the old pods are gone; the new attempt's pods avoid the node, and nothing counts again.
    c.status = p.status
    c.pods.clear()
    again = plan(c.job, c.status, [], T0 + timedelta(seconds=1), nodes=lost)
    assert again.status.restarts == 1 and again.create_ranks == (0, 1) and again.avoid_nodes == ("node-1",)


def test_a_pod_stuck_terminating_on_a_lost_node_is_deleted_at_once_and_one_on_a_healthy_node_never_is() -> None:
    c = on_nodes(2)
    c.status = replace(c.status, phase=Phase.RESTARTING, attempt=1, restarts=1)
    stuck = [replace(p, terminating=True) for p in c.pods.values()]
    p = plan(c.job, c.status, stuck, T0, nodes=NodeHealth(lost={"node-1": "the node was deleted"}))
    assert [x.name for x in p.force_delete_pods] == ["train-1"]
    assert p.delete_pods == () and p.create_ranks == ()


def test_a_rank_on_a_sick_node_restarts_the_gang_off_it_with_its_grace_period() -> None:
    c = on_nodes(2)
    sick = NodeHealth(sick={"node-0": "the node carries the taint nvidia.com/gpu-unhealthy"})
    p = plan(c.job, c.status, list(c.pods.values()), T0, nodes=sick)
    restarting = p.status.condition("Restarting")
    assert restarting is not None and restarting.reason == "NodeUnhealthy"
    assert p.force_delete_pods == () and sorted(x.name for x in p.delete_pods) == ["train-0", "train-1"]
    assert [e.name for e in p.status.excluded_nodes] == ["node-0"]


def test_an_excluded_node_expires_and_a_user_may_clear_the_list() -> None:
    c = on_nodes(2)
    entry = ExcludedNode("node-9", "NodeLost", "its Ready condition is Unknown", T0)
    c.status = replace(c.status, excluded_nodes=(entry,))
    kept = plan(
        c.job, c.status, list(c.pods.values()), T0 + timedelta(seconds=59), nodes=NodeHealth(exclusion_seconds=60)
    )
    assert kept.avoid_nodes == ("node-9",)
    gone = plan(
        c.job, c.status, list(c.pods.values()), T0 + timedelta(seconds=60), nodes=NodeHealth(exclusion_seconds=60)
    )
    assert gone.avoid_nodes == () and gone.status.excluded_nodes == ()
    assert gone.status.to_dict()["excludedNodes"] is None, "written as gone"
    written = kept.status.to_dict()["excludedNodes"]
    assert parse_status({"excludedNodes": written}).excluded_nodes == (entry,)
    assert parse_status({"excludedNodes": [{"name": "node-9"}]}).excluded_nodes == (), "a mangled entry is dropped"


def test_a_node_lost_past_backoff_limit_fails_the_job() -> None:
    c = on_nodes(2)
    c.status = replace(c.status, restarts=c.job.spec.run_policy.backoff_limit)
    p = plan(c.job, c.status, list(c.pods.values()), T0, nodes=NodeHealth(lost={"node-0": "the node was deleted"}))
    assert p.status.phase is Phase.FAILED
    assert [x.name for x in p.force_delete_pods] == ["train-0"]


def test_the_pods_avoid_excluded_nodes_beside_the_templates_own_node_affinity() -> None:
    built = builders.pod(job(), 0, 0, gang=False)
    kept_off = builders.avoiding(built, ("node-b", "node-a"))
    (term,) = kept_off["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                         "values": ["node-a", "node-b"]}]  # fmt: skip
    own = {"key": "gpu", "operator": "In", "values": ["h100"]}
    fields = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [own]}, fields]}
    two_terms = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}}
    terms = builders.avoiding(two_terms, ("node-a",))["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert all(t["matchExpressions"][-1]["values"] == ["node-a"] for t in terms), "ORed terms: each avoids it"
    assert terms[0]["matchExpressions"][0] == own and "matchFields" in terms[1]
    assert builders.avoiding(builders.pod(job(), 0, 0, gang=False), ()) == builders.pod(job(), 0, 0, gang=False)


class Nodes:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = [node("a"), node("b")]
        self.events: list[tuple[str, dict[str, Any]]] = []

    def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        return list(self.items), "1"

    def watch_nodes(self, version: str, seconds: int) -> Any:
        return iter(self.events)


def test_the_node_watch_says_which_nodes_are_bad_and_wakes_only_on_a_change() -> None:
    source = Nodes()
    changed: list[str] = []
    watch = NodeWatch(source, changed.append, unhealthy_taints=("example.com/bad",), exclusion_seconds=42)
    watch._list("")
    assert watch.health().lost == {} and watch.health().sick == {} and watch.health().exclusion_seconds == 42
    changed.clear()
    watch._event("", "MODIFIED", node("a"))
    assert changed == [], "nothing changed"
    watch._event("", "MODIFIED", node("a", ready="Unknown"))
    watch._event("", "MODIFIED", node("b", taints=("example.com/bad",)))
    assert set(watch.health().lost) == {"a"} and set(watch.health().sick) == {"b"}
    assert changed == ["a", "b"]
    source.items = [node("a")]
    watch._list("")  # a came back, and b was deleted while the watch was down
    assert watch.health().lost == {"b": "the node was deleted"} and watch.health().sick == {}


def test_the_node_watch_keeps_a_sick_nodes_taints_that_repel_pods_and_wakes_when_they_change() -> None:
    source = Nodes()
    changed: list[str] = []
    watch = NodeWatch(source, changed.append, unhealthy_taints=("example.com/bad",))
    watch._list("")
    changed.clear()
    prefers = node("a")
    prefers["spec"]["taints"] = [{"key": "example.com/bad", "value": "gpu", "effect": "PreferNoSchedule"}]
    watch._event("", "MODIFIED", prefers)
    assert set(watch.health().sick) == {"a"} and watch.health().repelling == {}, "it only prefers no pods"
    repels = node("a")
    repels["spec"]["taints"] = [{"key": "example.com/bad", "value": "gpu", "effect": "NoExecute"},
                                {"key": "example.com/other", "effect": "NoSchedule"}]  # fmt: skip
    watch._event("", "MODIFIED", repels)
    assert watch.health().repelling == {"a": ({"key": "example.com/bad", "value": "gpu", "effect": "NoExecute"},)}
    assert changed == ["a", "a"], "the same verdict, other taints: the jobs on it look again"
    watch._event("", "MODIFIED", node("a"))
    assert watch.health().repelling == {} and watch.health().sick == {}


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        ({"key": "k", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),
        ({"key": "k", "value": "v"}, True),
        ({"key": "k", "operator": "Equal", "value": "w"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "k", "operator": "Exists", "tolerationSeconds": 60}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "k", "operator": "Gt", "value": "v"}, False),
    ],
)
def test_a_taint_is_tolerated_for_good_as_kubernetes_matches_a_toleration(
    toleration: dict[str, Any], tolerates: bool
) -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert node_loss.tolerated(taint, [toleration]) is tolerates


def test_the_node_watch_keeps_each_nodes_labels_for_the_racks_a_job_spans_without_waking_a_job() -> None:
    source = Nodes()
    changed: list[str] = []
    watch = NodeWatch(source, changed.append)
    racked = node("a")
    racked["metadata"]["labels"] = {"topology.ddpjob.dev/rack": "rack-0"}
    source.items = [racked, node("b")]
    watch._list("")
    changed.clear()
    assert watch.health().labels["a"] == {"topology.ddpjob.dev/rack": "rack-0"}
    moved = node("a")
    moved["metadata"]["labels"] = {"topology.ddpjob.dev/rack": "rack-1"}
    watch._event("", "MODIFIED", moved)
    assert watch.health().labels["a"] == {"topology.ddpjob.dev/rack": "rack-1"} and changed == []
    watch._event("", "DELETED", node("b"))
    assert "b" not in watch.health().labels


def test_a_restart_that_came_first_from_a_peers_failure_is_put_down_to_the_node_lost_under_it_once() -> None:
    # A power cut: rank 1's processes die at once, rank 0's collective fails at once (a retryable failure, counted),
    # and rank 1's node is marked NotReady only after the grace period, its pod still Running there.
    c = on_nodes(2)
    c.set(0, phase="Failed", exit_code=200)
    restarted = plan(c.job, c.status, list(c.pods.values()), T0)
    assert restarted.status.restarts == 1 and restarted.status.condition("Restarting").reason == "RetryableFailure"  # type: ignore[union-attr]
    pods = [p for p in c.pods.values() if p.name == "train-1"]  # train-0 is gone; train-1 cannot confirm
    lost = NodeHealth(lost={"node-1": "its Ready condition is Unknown"})
    later = plan(c.job, restarted.status, pods, T0 + timedelta(seconds=12), nodes=lost)
    restarting = later.status.condition("Restarting")
    assert restarting is not None and restarting.reason == "NodeLost"
    assert "node node-1 is lost" in restarting.message and "already counted" in restarting.message
    assert later.status.restarts == 1, "counted once"
    assert [e.name for e in later.status.excluded_nodes] == ["node-1"] and [e.reason for e in later.events] == [
        "NodeLost"
    ]
    assert [x.name for x in later.force_delete_pods] == ["train-1"]
    again = plan(c.job, later.status, pods, T0 + timedelta(seconds=13), nodes=lost)
    assert [e.reason for e in again.events] == [] and again.status.restarts == 1


def test_a_pod_on_a_lost_node_is_not_left_waiting_to_be_restarted_in_place_by_a_kubelet_that_cannot() -> None:
    # Seen on the box (a network cut): the lost node's pod waited out the in-place wait before it was deleted.
    c = on_nodes(2)
    for rank in range(2):
        c.set(rank, in_place=True, trainer_running=True)
    p = plan(c.job, c.status, list(c.pods.values()), T0, nodes=NodeHealth(lost={"node-1": "the node was deleted"}))
    assert p.status.phase is Phase.RESTARTING
    assert [x.name for x in p.force_delete_pods] == ["train-1"]
    assert "train-1" not in [x.name for x in (*p.delete_pods, *p.adopt_pods)]


def test_a_rank_that_runs_on_when_its_peers_node_is_lost_is_deleted_at_once_not_waited_for() -> None:
    # Seen on the box (a network cut): the healthy node's rank went on training with the cut one, which it still
    # reached, until the in-place wait ran out: 10 s of the 35 from the cut to training again.
    c = on_nodes(2)
    for rank in range(2):
        c.set(rank, in_place=True, trainer_running=True)
    lost = NodeHealth(lost={"node-1": "its Ready condition is Unknown"})
    first = plan(c.job, c.status, list(c.pods.values()), T0, nodes=lost)
    later = plan(c.job, first.status, list(c.pods.values()), T0 + timedelta(seconds=1), nodes=lost)
    assert [x.name for x in later.delete_pods] == ["train-0"], "deleted with its grace period, not force"
    assert later.adopt_pods == () and later.requeue_after is not None


def test_a_rank_failing_twice_in_a_row_on_one_node_with_sigbus_restarts_the_gang_off_that_node() -> None:
    c = on_nodes(2)
    c.set(1, phase="Failed", exit_code=135)
    first = plan(c.job, c.status, list(c.pods.values()), T0)
    assert first.status.condition("Restarting").reason == "RetryableFailure"  # type: ignore[union-attr]
    assert first.status.machine_fault is not None and first.status.excluded_nodes == ()
    # The next attempt: rank 1 lands on the same node and fails the same way.
    c.status = first.status
    c.pods = {n: replace(p, attempt=1, phase="Running", exit_code=None) for n, p in c.pods.items()}
    c.set(1, phase="Failed", exit_code=135)
    second = plan(c.job, replace(c.status, phase=Phase.RUNNING), list(c.pods.values()), T0 + timedelta(seconds=60))
    restarting = second.status.condition("Restarting")
    assert restarting is not None and restarting.reason == "NodeUnhealthy"
    assert "rank 1 failed twice in a row on node node-1" in restarting.message and "SIGBUS" in restarting.message
    assert [(e.name, e.reason) for e in second.status.excluded_nodes] == [("node-1", "NodeUnhealthy")]
    assert second.status.restarts == 2 and second.force_delete_pods == (), "its kubelet answers: no force"


def test_a_rank_its_kubelet_restarts_in_place_on_the_node_it_faulted_twice_is_not_kept_there() -> None:
    """On the 3-node box: rank 1's pod, restarted in place by its kubelet after its second SIGBUS, was adopted into
    the next attempt on the node the gang had just excluded, and trained on there."""
    c = on_nodes(2)
    c.set_all(in_place=True, trainer_running=True)
    c.set(1, exit_code=135, next_count=1)
    first = plan(c.job, c.status, list(c.pods.values()), T0)
    first = plan(c.job, first.status, list(c.pods.values()), T0 + timedelta(seconds=1))
    assert "train-1" in {x.name for x in first.adopt_pods}, "the first time: restarted in place where it is"
    c.status = first.status
    c.pods = {n: replace(p, attempt=1, adopted=True, exit_code=None) for n, p in c.pods.items()}
    c.set(1, exit_code=135, next_count=2)
    then = T0 + timedelta(seconds=60)
    second = plan(c.job, replace(c.status, phase=Phase.RUNNING), list(c.pods.values()), then)
    assert [(e.name, e.reason) for e in second.status.excluded_nodes] == [("node-1", "NodeUnhealthy")]
    later = plan(c.job, second.status, list(c.pods.values()), then + timedelta(seconds=1))
    assert "train-1" not in {x.name for x in later.adopt_pods}
    assert "train-1" in {x.name for x in later.delete_pods}, "made again off node-1"


def test_a_machine_fault_then_another_cause_starts_the_count_again() -> None:
    assert node_loss.machine_fault(135, "").startswith("SIGBUS")
    assert node_loss.machine_fault(1, "RuntimeError: CUDA error: an illegal memory access") != ""
    assert node_loss.machine_fault(1, "NCCL error: unhandled system error") != ""
    assert node_loss.machine_fault(1, "ValueError: bad shape") == ""
    c = on_nodes(2)
    c.set(1, phase="Failed", exit_code=135)
    first = plan(c.job, c.status, list(c.pods.values()), T0)
    assert first.status.machine_fault is not None
    c.pods = {n: replace(p, attempt=1, phase="Running", exit_code=None) for n, p in c.pods.items()}
    c.set(1, phase="Failed", exit_code=200)  # a lost peer, say: nothing points at the machine
    second = plan(c.job, replace(first.status, phase=Phase.RUNNING), list(c.pods.values()), T0 + timedelta(seconds=60))
    assert second.status.condition("Restarting").reason == "RetryableFailure"  # type: ignore[union-attr]
    assert second.status.machine_fault is None and second.status.excluded_nodes == ()


def test_a_gang_with_nowhere_left_to_run_says_so_with_the_nodes_it_excludes_in_its_one_line() -> None:
    c = FakeCluster(job(replicas=2))
    entry = ExcludedNode("node-1", "NodeLost", "its Ready condition is Unknown", T0)
    c.status = replace(c.status, excluded_nodes=(entry,))
    c.settle()
    c.set(0, node="node-0")
    c.set(1, node="", unschedulable="0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.")
    p = c.step()
    status, reason, message = c.condition("Running")
    assert c.status.phase is Phase.PENDING and (status, reason) == (False, "Unschedulable")
    assert "didn't match Pod's node affinity/selector" in message and "\n" not in message
    assert message.endswith("; this job excludes node-1 (NodeLost) until they expire or are removed from "
                            "status.excludedNodes")  # fmt: skip
    assert [e.reason for e in p.events] == ["Unschedulable"]


def test_a_gang_with_nowhere_left_is_made_again_uncounted_once_an_exclusion_its_pods_were_built_for_is_cleared() -> (
    None
):
    """On the 3-node box: with excludedNodes cleared (kubectl patch, or expiry), the unplaced rank's pod still avoided
    the nodes (a pod's affinity cannot change), and the gang waited until its in-place rank used up backoffLimit."""
    c = FakeCluster(job(replicas=2))
    entry = ExcludedNode("node-1", "NodeUnhealthy", "the node carries the taint ddpjob.dev/unhealthy", T0)
    c.status = replace(c.status, excluded_nodes=(entry,))
    c.settle()
    c.set(0, node="node-0", avoids=("node-1",))
    c.set(1, node="", avoids=("node-1",), unschedulable="0/2 nodes are available: 2 node(s) didn't match ...")
    c.step()
    assert c.status.phase is Phase.PENDING, "still excluded: it waits, saying why"
    c.status = replace(c.status, excluded_nodes=())  # cleared by the user
    restarts = c.status.restarts
    c.step()
    restarting = c.status.condition("Restarting")
    assert restarting is not None and restarting.reason == "ExclusionsCleared"
    assert "pod train-1, not placed, was built to avoid node-1" in restarting.message
    assert c.status.restarts == restarts, "not counted"


def test_the_nodes_a_pod_avoids_are_written_on_it_and_read_back() -> None:
    from ddpjob_operator.status import pod_view

    built = builders.avoiding(builders.pod(job(replicas=2), 1, 0, gang=False), ("b", "a"))
    built["status"] = {"phase": "Pending"}
    assert pod_view(built, "trainer").avoids == ("a", "b")
    assert pod_view(builders.pod(job(replicas=2), 1, 0, gang=False), "trainer").avoids == ()
