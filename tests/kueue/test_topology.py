"""DDPJob placed by Kueue v0.17.0's topology-aware scheduling, on the box's 4 real nodes in 2 racks.

The box labels its nodes (topology.ddpjob.dev/rack: box-node and box-node-1 in rack-0, box-node-2 and box-node-3 in
rack-1) and applies Kueue's Topology and the ResourceFlavor that names it; tests/kueue/topology-queues.yaml is the
ClusterQueue an admin would add. Each rank here asks for all 8 example.com/slot of a node, so a rack holds 2 ranks
(but in the power cut's job: 4 each, in rack-1, away from box-node, which runs Kueue's manager).
Nothing Kueue owns is mocked: Kueue assigns the domains, its ungater removes each pod's gate, and it replaces the
node a power cut takes or a health checker taints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.node_loss import job_body, shared_claim
from ddpjob_box.box import KUEUE_SLOTS
from ddpjob_box.topology import LABEL_PREFIX
from ddpjob_contract.kueue import (
    ANNOTATION_PREFERRED_TOPOLOGY,
    ANNOTATION_REQUIRED_TOPOLOGY,
    LABEL_QUEUE_NAME,
    TOPOLOGY_GATE,
)

from .conftest import KueueCluster
from .test_ddpjob_under_kueue import SLOT, WORKLOADS, Cluster, operated, queued_job, wait_for

pytestmark = pytest.mark.e2e

QUEUES = Path(__file__).with_name("topology-queues.yaml")
LOCAL_QUEUE = "topology-queue"
CLUSTER_QUEUE = "topology-cluster-queue"
RACK = LABEL_PREFIX + "rack"
UNHEALTHY = "ddpjob.dev/unhealthy"
"""A taint the operator honours by default (``policies.node_loss.UNHEALTHY_TAINTS``), as a GPU health checker sets."""
STEPS = 200
"""The power cut's job: a checkpoint every 20 steps, so one is there before the cut."""


@pytest.fixture
def racks(kueue_cluster: KueueCluster) -> dict[str, str]:
    """Node -> rack, from the nodes' labels."""
    nodes = json.loads(kueue_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(RACK, "") for n in nodes}


@pytest.fixture
def cluster(kueue_cluster: KueueCluster, kueue_namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    """The namespace with the topology LocalQueue, the CRD, and the operator watching the namespace."""
    kubectl = kueue_cluster.kubectl
    kubectl("apply", "-n", kueue_namespace, "-f", str(QUEUES))
    kubectl("wait", f"clusterqueue/{CLUSTER_QUEUE}", "--for=condition=Active", "--timeout=60s")
    kubectl("wait", "-n", kueue_namespace, f"localqueue/{LOCAL_QUEUE}", "--for=condition=Active", "--timeout=60s")
    with operated(kueue_cluster, kueue_namespace, tmp_path) as cluster:
        yield cluster


def topology_job(name: str, replicas: int, annotation: str, level: str = RACK, steps: int = 20) -> dict[str, Any]:
    """A CPU DDPJob in the topology queue; each rank takes a whole node's slots."""
    body = queued_job(name, replicas=replicas, slots=KUEUE_SLOTS, steps=steps)
    body["metadata"]["labels"][LABEL_QUEUE_NAME] = LOCAL_QUEUE
    body["spec"]["template"]["metadata"] = {"annotations": {annotation: level}}
    return body


def rank_nodes(cluster: Cluster, job: str) -> dict[int, str]:
    """Rank -> node of the job's pods, once every one is bound."""
    pods = cluster.pods(job)
    return {int(p["metadata"]["labels"]["ddpjob.dev/rank"]): p["spec"].get("nodeName", "") for p in pods}


def placed(cluster: Cluster, job: str, replicas: int) -> dict[int, str]:
    def bound() -> dict[int, str] | None:
        nodes = rank_nodes(cluster, job)
        return nodes if len(nodes) == replicas and all(nodes.values()) else None

    return wait_for(f"{job}'s {replicas} pods placed", bound, 240)


def test_a_job_requiring_a_rack_runs_both_ranks_in_one_rack_and_succeeds(
    cluster: Cluster, racks: dict[str, str]
) -> None:
    cluster.create(topology_job("tas-one-rack", 2, ANNOTATION_REQUIRED_TOPOLOGY))
    (workload,) = wait_for("its Workload", lambda: cluster.get(WORKLOADS)["items"] or None, 60)
    request = workload["spec"]["podSets"][0]["topologyRequest"]
    assert request == {"required": RACK, "podIndexLabel": "ddpjob.dev/rank"}, request
    nodes = placed(cluster, "tas-one-rack", 2)
    pod = cluster.get("pod", "tas-one-rack-1")
    assert not [g for g in pod["spec"].get("schedulingGates") or [] if g["name"] == TOPOLOGY_GATE], "Kueue ungated"
    # the Topology's last level is the node: Kueue's ungater pins each pod to its assigned node
    assert pod["spec"]["nodeSelector"].get("kubernetes.io/hostname") == nodes[1], pod["spec"]["nodeSelector"]
    assert len({nodes[0], nodes[1]}) == 2 and racks[nodes[0]] == racks[nodes[1]] != "", (nodes, racks)
    status = cluster.wait_phase("tas-one-rack", "Succeeded", 600)
    assert status["placement"]["spans"] == racks[nodes[0]], status
    assert status["placement"]["nodes"] == [nodes[0], nodes[1]], status
    wide = cluster.run("get", "ddpj", "-n", cluster.ns, "-o", "wide").stdout
    assert "SPANS" in wide and racks[nodes[0]] in wide, wide


def test_a_rack_too_small_for_a_required_job_keeps_it_queued_with_kueues_reason_and_preferred_spreads(
    cluster: Cluster, racks: dict[str, str]
) -> None:
    cluster.create(topology_job("tas-too-big", 3, ANNOTATION_REQUIRED_TOPOLOGY))

    def said() -> dict[str, Any] | None:
        queued = cluster.condition("tas-too-big", "Queued")
        return queued if "allows to fit only 2 out of 3" in str(queued.get("message")) else None

    queued = wait_for("Kueue's reason on the job", said, 120)
    assert cluster.phase("tas-too-big") == "Queued" and queued["status"] == "True", cluster.explain("tas-too-big")
    assert cluster.pods("tas-too-big") == []
    cluster.run("delete", "ddpjob", "tas-too-big", "-n", cluster.ns)

    cluster.create(topology_job("tas-spread", 3, ANNOTATION_PREFERRED_TOPOLOGY))
    nodes = placed(cluster, "tas-spread", 3)
    assert len(set(nodes.values())) == 3 and {racks[n] for n in nodes.values()} == {"rack-0", "rack-1"}, nodes
    status = cluster.wait_phase("tas-spread", "Running", 300)  # it runs: test 1 shows a job of this queue to its end
    assert status["placement"]["spans"] == "rack-0,rack-1", status


def test_ring_neighbours_share_a_rack_ranks_0_1_in_one_and_2_3_in_the_other(
    cluster: Cluster, racks: dict[str, str]
) -> None:
    cluster.create(topology_job("tas-ring", 4, ANNOTATION_PREFERRED_TOPOLOGY, steps=10))
    nodes = placed(cluster, "tas-ring", 4)
    by_rank = [racks[nodes[rank]] for rank in range(4)]
    assert by_rank[0] == by_rank[1] != by_rank[2] == by_rank[3], (nodes, racks)
    # the ring 0-1-2-3-0 crosses between racks twice, the least 2 racks allow (ranks alternating: 4 times)
    assert sum(by_rank[r] != by_rank[(r + 1) % 4] for r in range(4)) == 2
    cluster.wait_phase("tas-ring", "Running", 300)


@pytest.mark.parametrize("fault", ["power", "taint"])
def test_a_node_lost_or_tainted_under_a_placed_rank_is_replaced_by_kueue_in_the_same_rack_and_the_job_resumes_once(
    cluster: Cluster, racks: dict[str, str], kueue_cluster: KueueCluster, fault: str
) -> None:
    """A power cut (the node goes NotReady), or a health checker's taint on a node that stays Ready (Kueue's
    TASReplaceNodeOnNodeTaints replaces a node whose taint the pods do not tolerate)."""
    job, claim_name = f"tas-{fault}", f"tas-{fault}-ckpt"
    claim = shared_claim(claim_name)
    cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", **claim})
    body = job_body(job, claim_name, steps=STEPS)
    spec = body["spec"]["template"]["spec"]
    del spec["affinity"]  # Kueue's assignment places the ranks, not a spread of our own
    spec["nodeSelector"] = {RACK: "rack-1"}  # Kueue's topology assignment honours it: never box-node's rack
    spec["containers"][0]["resources"] = {"requests": {SLOT: "4", "cpu": "100m"}, "limits": {SLOT: "4"}}
    body["metadata"]["labels"] = {LABEL_QUEUE_NAME: LOCAL_QUEUE}
    body["spec"]["template"]["metadata"] = {"annotations": {ANNOTATION_REQUIRED_TOPOLOGY: RACK}}
    cluster.create(body)
    before = placed(cluster, job, 2)
    wait_for("a checkpoint", lambda: (cluster.status(job).get("lastCheckpoint") or {}).get("step"), 300)
    rack = racks[before[1]]
    assert racks[before[0]] == rack, before
    cut = kueue_cluster.box.node_named(before[1])
    reason = {"power": "NodeLost", "taint": "NodeUnhealthy"}[fault]
    if fault == "power":
        cut.power_cut()
    else:
        kueue_cluster.kubectl("taint", "node", cut.name, f"{UNHEALTHY}=gpu:NoSchedule")
    try:
        final = wait_for("the job to end", lambda: (s := cluster.status(job)).get("phase") in (
            "Succeeded", "Failed") and s, 600)  # fmt: skip
        assert final["phase"] == "Succeeded", cluster.explain(job)
        assert final["restarts"] == 1 and final["progress"]["step"] == STEPS, final
        assert [e["reason"] for e in final.get("excludedNodes") or [] if e["name"] == cut.name] == [reason], final
        said = "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}"
        events = cluster.run("get", "events", "-n", cluster.ns, "--field-selector", f"involvedObject.name={job}",
                             "-o", said).stdout  # fmt: skip
        assert [line for line in events.splitlines() if line.startswith(reason) and cut.name in line], events
        assert not [line for line in events.splitlines() if line.startswith("EvictedByKueue")], "replaced, not evicted"
        print(f"--- the job's Events:\n{events}")
        after = final["placement"]["nodes"]
        assert cut.name not in after and {racks[n] for n in after} == {rack}, (before, after, racks)
        (workload,) = cluster.get(WORKLOADS)["items"]
        named = json.dumps(workload["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"])
        assert cut.name not in named, f"Kueue replaced {cut.name} in its assignment: {named}"
        resumed = [line for rank in range(2) for line in cluster.log(f"{job}-{rank}").splitlines()]
        assert any("resumed from step" in line for line in resumed), resumed[-20:]
    finally:
        if fault == "power":
            cut.power_on()
        else:
            kueue_cluster.kubectl("taint", "node", cut.name, f"{UNHEALTHY}-")
    wait_for(f"no pod of the job on {cut.name}", lambda: not [
        p for p in cluster.pods(job) if p["spec"].get("nodeName") == cut.name], 120)  # fmt: skip
