"""The box's simulated GPU hosts (``ddpjob cluster up --simulated-nodes``): KWOK's controller keeps them alive and
moves their pods through its stages, while the real scheduler, Kueue and the operator treat them as real.

A queued DDPJob of 8 ranks, each asking for one nvidia.com/gpu, is admitted by Kueue into the simulated flavor
(tests/kueue/simulated-queues.yaml), placed by the scheduler on the simulated hosts (the flavor's toleration lets
it), and run by KWOK to Succeeded. Nothing here runs a container: that is what bench.scale needs of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.kwok import GPU, NODE_PREFIX, RUN_ANNOTATION
from ddpjob_contract.kueue import LABEL_QUEUE_NAME
from tests.e2e.jobs import cpu_job

from .conftest import SIMULATED_NODES, KueueCluster
from .test_ddpjob_under_kueue import WORKLOADS, Cluster, operated, wait_for

pytestmark = pytest.mark.e2e

QUEUES = Path(__file__).with_name("simulated-queues.yaml")


@pytest.fixture
def cluster(kueue_cluster: KueueCluster, kueue_namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    kubectl = kueue_cluster.kubectl
    kubectl("apply", "-n", kueue_namespace, "-f", str(QUEUES))
    kubectl("wait", "clusterqueue/simulated-cluster-queue", "--for=condition=Active", "--timeout=60s")
    with operated(kueue_cluster, kueue_namespace, tmp_path) as cluster:
        yield cluster


def simulated_job(name: str, replicas: int, runs_for: str) -> dict[str, Any]:
    body = cpu_job(name, replicas=replicas)
    body["metadata"]["labels"] = {LABEL_QUEUE_NAME: "simulated-queue"}
    body["spec"]["template"]["metadata"] = {"annotations": {RUN_ANNOTATION: runs_for}}
    trainer = body["spec"]["template"]["spec"]["containers"][0]
    trainer["resources"] = {"requests": {GPU: "1", "cpu": "4"}, "limits": {GPU: "1"}}
    return body


def test_the_simulated_hosts_are_ready_gpu_nodes_tainted_away_from_real_work(kueue_cluster: KueueCluster) -> None:
    nodes = json.loads(kueue_cluster.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json").stdout)["items"]
    assert len(nodes) == SIMULATED_NODES
    for node in nodes:
        assert node["status"]["allocatable"][GPU] == "8"
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]), node
        assert {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"} in node["spec"]["taints"]


def test_a_queued_8_rank_job_runs_on_the_simulated_hosts_to_succeeded(cluster: Cluster) -> None:
    cluster.create(simulated_job("sim", 8, "5s"))
    final = wait_for("the job to end", lambda: (s := cluster.status("sim")).get("phase") in ("Succeeded", "Failed")
                     and s, 300)  # fmt: skip
    assert final["phase"] == "Succeeded", cluster.explain("sim")
    nodes = final["placement"]["nodes"]
    assert len(nodes) == 8 and all(n.startswith(NODE_PREFIX) for n in nodes), nodes
    (workload,) = cluster.get(WORKLOADS)["items"]
    assert workload["status"]["admission"]["podSetAssignments"][0]["flavors"][GPU] == "simulated-gpu"
