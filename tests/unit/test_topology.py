"""Kueue's topology-aware scheduling, the operator's half, as data shaped as Kueue v0.17.0 writes it: the request a
template's annotations make, the gated pods an assignment asks for, the domains read back, and a gated gang said to
wait for Kueue (never Unschedulable). Kueue placing them is shown against real Kueue in tests/kueue/test_topology.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ddpjob_contract import kueue
from ddpjob_contract.pods import LABEL_RANK
from ddpjob_contract.status import Phase
from ddpjob_operator import builders, queueing, topology
from ddpjob_operator.api import Job, parse_job
from ddpjob_operator.lifecycle import plan
from ddpjob_operator.node_health import NodeHealth
from ddpjob_operator.status import ExcludedNode, JobStatus, parse_status, pod_view

from .factories import body, pod
from .test_admission import ADMITTED, T0, run
from .test_lifecycle import FakeCluster

RACK = "topology.ddpjob.dev/rack"
HOST = "kubernetes.io/hostname"


def tas_job(replicas: int = 2, **annotations: str) -> Job:
    b = body("train", replicas)
    b["metadata"]["labels"] = {kueue.LABEL_QUEUE_NAME: "team-a"}
    b["metadata"]["uid"] = "0123456789abcdef"
    b["spec"]["template"]["metadata"] = {"annotations": annotations}
    return parse_job(b)


def assignment(*domains: tuple[str, str, int]) -> dict[str, Any]:
    """A topologyAssignment over (rack, hostname), one slice per domain, as Kueue's encoder may write it."""
    return {
        "levels": [RACK, HOST],
        "slices": [
            {"domainCount": 1, "valuesPerLevel": [{"universal": rack}, {"universal": host}],
             "podCounts": {"universal": pods}}
            for rack, host, pods in domains
        ],
    }  # fmt: skip


def admitted(j: Job, topology_assignment: dict[str, Any] | None) -> dict[str, Any]:
    wl = builders.workload(j, None)
    wl["metadata"].update(uid="wl-uid", generation=1)
    podset: dict[str, Any] = {"name": kueue.POD_SET, "flavors": {"cpu": "tas"}, "count": j.spec.replicas}
    if topology_assignment:
        podset["topologyAssignment"] = topology_assignment
    wl["status"] = {"conditions": list(ADMITTED), "admission": {"clusterQueue": "cq", "podSetAssignments": [podset]}}
    return wl


def test_the_templates_annotations_make_the_workloads_topology_request_ranks_indexed_by_rank() -> None:
    (pod_set,) = builders.workload(tas_job(**{kueue.ANNOTATION_REQUIRED_TOPOLOGY: RACK}), None)["spec"]["podSets"]
    assert pod_set["topologyRequest"] == {"required": RACK, "podIndexLabel": LABEL_RANK}
    (plain,) = builders.workload(tas_job(), None)["spec"]["podSets"]
    assert "topologyRequest" not in plain


def test_required_wins_over_preferred_and_the_slice_needs_both_its_annotations_as_in_kueue() -> None:
    both = {kueue.ANNOTATION_REQUIRED_TOPOLOGY: RACK, kueue.ANNOTATION_PREFERRED_TOPOLOGY: HOST}
    assert topology.request(both) == {"required": RACK, "podIndexLabel": LABEL_RANK}
    assert topology.request({kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY: "true"}) == {
        "unconstrained": True,
        "podIndexLabel": LABEL_RANK,
    }
    assert topology.request({kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY: "false"}) is None
    sliced = {kueue.ANNOTATION_SLICE_REQUIRED_TOPOLOGY: RACK, kueue.ANNOTATION_SLICE_SIZE: "2"}
    assert topology.request(sliced) == {"podSetSliceRequiredTopology": RACK, "podSetSliceSize": 2,
                                        "podIndexLabel": LABEL_RANK}  # fmt: skip
    assert topology.request({kueue.ANNOTATION_SLICE_SIZE: "2"}) is None


def test_the_domains_are_read_in_kueues_order_from_universal_and_individual_values() -> None:
    hosts = {"individual": {"prefix": "box-node-", "roots": ["2", "3"]}}
    compact = {
        "levels": [RACK, HOST],
        "slices": [{"domainCount": 2, "valuesPerLevel": [{"universal": "rack-1"}, hosts],
                    "podCounts": {"individual": [1, 2]}}],
    }  # fmt: skip
    levels, domains = topology.assigned({"topologyAssignment": compact})
    assert levels == (RACK, HOST)
    assert domains == (topology.Domain(("rack-1", "box-node-2"), 1), topology.Domain(("rack-1", "box-node-3"), 2))
    assert topology.assigned({}) == ((), ())


def test_the_racks_spanned_are_the_jobs_level_on_its_ranks_nodes_in_rank_order() -> None:
    labels = {"box-node": {RACK: "rack-0"}, "box-node-2": {RACK: "rack-1"}, "box-node-1": {RACK: "rack-0"}}
    assert topology.spans(RACK, ("box-node-2", "box-node", "box-node-1"), labels) == "rack-1,rack-0"
    assert topology.spans(RACK, ("box-node", ""), labels) == "rack-0"
    assert topology.spans(RACK, ("unknown",), labels) == ""
    assert topology.level({kueue.ANNOTATION_PREFERRED_TOPOLOGY: RACK}) == RACK
    assert topology.level({kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY: "true"}) == ""


def test_under_a_topology_assignment_each_rank_pod_is_gated_names_its_workload_and_the_job_says_its_racks() -> None:
    j = tas_job(**{kueue.ANNOTATION_PREFERRED_TOPOLOGY: RACK})
    queued = run(j, JobStatus(), [], None).status
    wl = admitted(j, assignment(("rack-0", "box-node", 1), ("rack-1", "box-node-2", 1)))
    p = run(j, queued, [], wl)
    assert p.create_ranks == (0, 1)
    pod = p.placement.apply(builders.pod(j, 1, p.status.attempt, gang=True))
    assert pod["spec"]["schedulingGates"] == [{"name": kueue.TOPOLOGY_GATE}]
    assert pod["metadata"]["annotations"][kueue.ANNOTATION_WORKLOAD] == wl["metadata"]["name"]
    assert pod["metadata"]["annotations"][kueue.ANNOTATION_PREFERRED_TOPOLOGY] == RACK
    assert pod["metadata"]["labels"][kueue.LABEL_POD_SET] == kueue.POD_SET
    assert pod["metadata"]["labels"][LABEL_RANK] == "1", "Kueue's podIndexLabel"
    again = p.placement.apply(pod)
    assert again["spec"]["schedulingGates"] == [{"name": kueue.TOPOLOGY_GATE}], "gated once"


def test_a_pod_set_placed_by_topology_without_a_request_is_marked_unconstrained_for_kueues_ungater() -> None:
    j = tas_job()
    queued = run(j, JobStatus(), [], None).status
    p = run(j, queued, [], admitted(j, assignment(("rack-0", "box-node", 2))))
    pod = p.placement.apply(builders.pod(j, 0, p.status.attempt, gang=True))
    assert pod["metadata"]["annotations"][kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY] == "true"


def test_an_admission_without_a_topology_assignment_gates_nothing() -> None:
    j = tas_job()
    queued = run(j, JobStatus(), [], None).status
    p = run(j, queued, [], admitted(j, None))
    pod = p.placement.apply(builders.pod(j, 0, p.status.attempt, gang=True))
    assert "schedulingGates" not in pod["spec"] and kueue.ANNOTATION_WORKLOAD not in pod["metadata"]["annotations"]


def test_a_gated_gang_waits_for_kueues_topology_assignment_in_a_normal_event_never_as_unschedulable() -> None:
    c = FakeCluster(tas_job(2))
    c.settle()
    c.set(0, node="", topology_gated=True)
    c.set(1, node="", topology_gated=True)
    p = c.step()
    status, reason, message = c.condition("Running")
    assert c.status.phase is Phase.PENDING and (status, reason) == (False, "WaitingForTopologyAssignment")
    assert message.startswith("waiting for Kueue's topology assignment: every rank gated")
    assert [(e.reason, e.warning) for e in p.events] == [("WaitingForTopologyAssignment", False)]
    c.set(0, node="box-node", topology_gated=False)
    c.set(1, node="box-node-2", topology_gated=False)
    c.step()
    assert c.condition("Running")[1] == "PodsPending", "ungated: no longer said to wait for Kueue"
    assert c.status.nodes == ("box-node", "box-node-2")


def test_a_job_asking_for_a_level_says_the_racks_its_ranks_nodes_are_in_and_keeps_them_once_done() -> None:
    j = tas_job(2, **{kueue.ANNOTATION_REQUIRED_TOPOLOGY: RACK})
    racks = NodeHealth(labels={"box-node": {RACK: "rack-0"}, "box-node-1": {RACK: "rack-0"}})
    pods = [pod(j, 0, node="box-node", phase="Running"), pod(j, 1, node="box-node-1", phase="Running")]
    status = plan(j, JobStatus(), [], T0, nodes=racks).status
    running = plan(j, status, pods, T0, nodes=racks).status
    assert (running.nodes, running.spans) == (("box-node", "box-node-1"), "rack-0")
    between = plan(j, running, [], T0, nodes=racks).status
    assert (between.nodes, between.spans) == ((), ""), "no pod now: no place shown (a restart's old nodes)"
    done = [replace(p, phase="Succeeded", exit_code=0) for p in pods]
    finished = plan(j, running, done, T0, nodes=racks).status
    assert finished.phase is Phase.SUCCEEDED and finished.spans == "rack-0"
    gone = plan(j, finished, [], T0, nodes=racks).status
    assert (gone.nodes, gone.spans) == (("box-node", "box-node-1"), "rack-0"), "kept once it has ended"


def test_each_ranks_node_and_the_spans_round_trip_through_the_status() -> None:
    status = JobStatus(nodes=("box-node", ""), spans="rack-0")
    assert parse_status(status.to_dict()).nodes == ("box-node", "")
    assert parse_status(status.to_dict()).spans == "rack-0"
    assert JobStatus().to_dict()["placement"] is None
    # no null inside, which the apiserver would prune: the status read back must equal the one written
    assert JobStatus(nodes=("box-node",)).to_dict()["placement"] == {"nodes": ["box-node"]}


def test_queueing_reads_the_placement_as_topology_only_with_an_assignment() -> None:
    j = tas_job(**{kueue.ANNOTATION_REQUIRED_TOPOLOGY: RACK})
    name = queueing.workload_name(j.name, j.uid)
    read = queueing.read(j.queue, admitted(j, assignment(("rack-0", "box-node", 2))), {}, name=name)
    assert read.placement.topology_workload == name
    plain = queueing.read(j.queue, admitted(j, None), {}, name=name)
    assert plain.placement.topology_workload == ""


def test_a_pod_is_read_as_gated_by_kueues_topology_gate_only() -> None:
    gated = {"metadata": {"name": "train-0"}, "spec": {"schedulingGates": [{"name": kueue.TOPOLOGY_GATE}]}}
    other = {"metadata": {"name": "train-0"}, "spec": {"schedulingGates": [{"name": "example.com/other"}]}}
    assert pod_view(gated, "trainer").topology_gated and not pod_view(other, "trainer").topology_gated


def test_no_pod_is_made_while_kueues_assignment_still_names_a_lost_node_until_kueue_replaces_it() -> None:
    j = tas_job(2, **{kueue.ANNOTATION_REQUIRED_TOPOLOGY: RACK})
    name = queueing.workload_name(j.name, j.uid)
    queued = run(j, JobStatus(), [], None).status
    lost = NodeHealth(lost={"box-node-2": "its Ready condition is Unknown"})
    old = admitted(j, assignment(("rack-1", "box-node-2", 1), ("rack-1", "box-node-3", 1)))
    held = plan(j, queued, [], T0, queued=queueing.read(j.queue, old, {}, name=name), nodes=lost)
    assert held.create_ranks == () and held.placement.assigned_nodes == ("box-node-2", "box-node-3")
    replaced = admitted(j, assignment(("rack-1", "box-node-3", 2)))
    made = plan(j, held.status, [], T0, queued=queueing.read(j.queue, replaced, {}, name=name), nodes=lost)
    assert made.create_ranks == (0, 1), "Kueue put the lost node's rank on the rack's other node"


def test_no_pod_is_made_while_the_assignment_names_a_sick_node_the_job_left_whose_taint_its_pods_refuse() -> None:
    """Kueue replaces a Ready node whose NoSchedule or NoExecute taint the pods do not tolerate, once the job's pods
    there have gone; one they tolerate, or a PreferNoSchedule taint, it keeps, and so it may a sick node the job never
    had a pod on (its pods leaving are what has Kueue look again): a wait for those would last as long as the taint."""
    taint = {"key": "ddpjob.dev/unhealthy", "value": "gpu", "effect": "NoSchedule"}
    sick = NodeHealth(sick={"box-node-2": "the node carries the taint ddpjob.dev/unhealthy=gpu"},
                      repelling={"box-node-2": (taint,)})  # fmt: skip
    old_assignment = assignment(("rack-1", "box-node-2", 1), ("rack-1", "box-node-3", 1))
    left = (ExcludedNode("box-node-2", "NodeUnhealthy", "the node carries the taint ddpjob.dev/unhealthy=gpu", T0),)

    def made(tolerations: list[dict[str, Any]], excluded: tuple[ExcludedNode, ...], nodes: NodeHealth) -> tuple[
            int, ...]:  # fmt: skip
        j = tas_job(2, **{kueue.ANNOTATION_REQUIRED_TOPOLOGY: RACK})
        j = replace(j, spec=replace(j.spec, template={**j.spec.template, "spec": {
            **j.spec.template["spec"], "tolerations": tolerations}}))  # fmt: skip
        name = queueing.workload_name(j.name, j.uid)
        queued = replace(run(j, JobStatus(), [], None).status, excluded_nodes=excluded)
        read = queueing.read(j.queue, admitted(j, old_assignment), {}, name=name)
        return plan(j, queued, [], T0, queued=read, nodes=nodes).create_ranks

    assert made([], left, sick) == (), "held until Kueue replaces the node the job left"
    assert made([{"key": "ddpjob.dev/unhealthy", "operator": "Exists"}], left, sick) == (0, 1), "tolerated: kept"
    assert made([], (), sick) == (0, 1), "never left by the job: Kueue may never look at it again"
    assert made([], left, NodeHealth(sick=sick.sick)) == (0, 1), "a taint that only prefers no pods: not repelling"


def test_a_pod_kueue_failed_on_its_assigned_node_is_a_disruption_not_the_ranks_failure() -> None:
    failed = {
        "metadata": {"name": "train-1"},
        "status": {"phase": "Failed", "conditions": [{"type": "TerminatedByKueue", "status": "True",
                   "reason": "UnschedulableOnAssignedNode", "message": "Pod terminated by Kueue NodeController"}]},
    }  # fmt: skip
    disruption = pod_view(failed, "trainer").disruption
    assert disruption is not None and disruption.reason == "UnschedulableOnAssignedNode"


def test_pods_placed_by_topology_are_not_kept_off_excluded_nodes_kueues_assignment_places_them() -> None:
    j = tas_job(2, **{kueue.ANNOTATION_REQUIRED_TOPOLOGY: RACK})
    name = queueing.workload_name(j.name, j.uid)
    placed = queueing.read(j.queue, admitted(j, assignment(("rack-0", "box-node", 2))), {}, name=name).placement
    assert placed.keeps_off(("box-node-1",)) == ()
    plain = queueing.read(j.queue, admitted(j, None), {}, name=name).placement
    assert plain.keeps_off(("box-node-1",)) == ("box-node-1",)


def test_unconstrained_is_read_as_kueue_reads_a_boolean() -> None:
    """The CRD takes Go's ParseBool words, as Kueue does; each true one asks for an unconstrained placement."""
    for word in ("true", "True", "1", "t"):
        assert topology.request({kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY: word}) == {
            "unconstrained": True, "podIndexLabel": LABEL_RANK}, word  # fmt: skip
    assert topology.request({kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY: "False"}) is None
