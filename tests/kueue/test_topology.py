"""DDPJob placed by Kueue v0.17.0's topology-aware scheduling, on the box's 4 real nodes in 2 racks.

The box labels its nodes (topology.ddpjob.dev/rack: box-node and box-node-1 in rack-0, box-node-2 and box-node-3 in
rack-1) and applies Kueue's Topology and the ResourceFlavor that names it; tests/kueue/topology-queues.yaml is the
ClusterQueue an admin would add. Each rank here asks for all 8 example.com/slot of a node, so a rack holds 2 ranks.
Nothing Kueue owns is mocked: Kueue assigns the domains and its ungater removes each pod's gate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.box import KUEUE_SLOTS
from ddpjob_box.operator_process import OperatorProcess
from ddpjob_box.topology import LABEL_PREFIX
from ddpjob_contract.kueue import (
    ANNOTATION_PREFERRED_TOPOLOGY,
    ANNOTATION_REQUIRED_TOPOLOGY,
    LABEL_QUEUE_NAME,
    TOPOLOGY_GATE,
)
from tests.chart.helm import wait_established
from tests.e2e.conftest import CRD

from .conftest import KueueCluster
from .test_ddpjob_under_kueue import WORKLOADS, Cluster, queued_job, wait_for

pytestmark = pytest.mark.e2e

QUEUES = Path(__file__).with_name("topology-queues.yaml")
LOCAL_QUEUE = "topology-queue"
CLUSTER_QUEUE = "topology-cluster-queue"
RACK = LABEL_PREFIX + "rack"


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
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(kueue_cluster.kubeconfig, "ddpjobs.ddpjob.dev")
    op = OperatorProcess(kueue_cluster.kubeconfig, tmp_path / "operator.log", namespaces=[kueue_namespace])
    cluster = Cluster(kueue_cluster, kueue_namespace)
    try:
        yield cluster
    finally:
        kubectl("delete", "ddpjobs", "--all", "-n", kueue_namespace, "--wait=false", check=False)
        wait_for("the test's Workloads gone", lambda: not cluster.get(WORKLOADS)["items"], 120)
        op.stop()
        log = op.log()
        print(f"--- operator log:\n{log[-6000:]}")
        assert "Traceback" not in log, "the operator logged a traceback"


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
    status = cluster.wait_phase("tas-spread", "Succeeded", 600)
    assert status["placement"]["spans"] == "rack-0,rack-1", status


def test_ring_neighbours_share_a_rack_ranks_0_1_in_one_and_2_3_in_the_other(
    cluster: Cluster, racks: dict[str, str]
) -> None:
    cluster.create(topology_job("tas-ring", 4, ANNOTATION_PREFERRED_TOPOLOGY, steps=10))
    nodes = placed(cluster, "tas-ring", 4)
    by_rank = [racks[nodes[rank]] for rank in range(4)]
    assert by_rank[0] == by_rank[1] != by_rank[2] == by_rank[3], (nodes, racks)
    cluster.wait_phase("tas-ring", "Succeeded", 600)
