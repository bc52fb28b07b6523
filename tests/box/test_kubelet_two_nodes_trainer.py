"""The issue's stretch: two ranks from the trainer image, one on each of two kubelet nodes, all-reduce over gloo.

Costly: the trainer image (torch, about 5 GB unpacked) is imported into each node's containerd, which took
minutes per node on the 2-core VM, hence the long timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from ddpjob_box import images
from ddpjob_box.kubenode.node import KubeletNode
from tests.box.test_kubelet_two_nodes import finished, pod, start_two_nodes
from tests.conftest import Cluster
from tests.e2e.conftest import Kubectl

pytestmark = [
    pytest.mark.cluster, pytest.mark.kubelet, pytest.mark.images, pytest.mark.stretch, pytest.mark.timeout(1800),
]  # fmt: skip


@pytest.fixture(scope="module")
def nodes(cluster: Cluster) -> Iterator[tuple[KubeletNode, KubeletNode]]:
    yield from start_two_nodes(cluster, [images.ensure_target("trainer")])


@pytest.fixture(scope="module")
def kubectl(cluster: Cluster) -> Kubectl:
    return Kubectl(cluster.kubeconfig)


ALL_REDUCE = """
import datetime, os, socket, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="tcp://pair-0.pair:29500", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print("sum", total.item(), "on", socket.gethostname())
dist.destroy_process_group()
"""


def test_two_ranks_on_two_nodes_all_reduce_over_gloo_from_the_trainer_image(
    nodes: tuple[KubeletNode, KubeletNode], api_client: Any, namespace: str, kubectl: Kubectl
) -> None:
    first, second = nodes
    trainer = first.images[1]
    core = client.CoreV1Api(api_client)
    service = {
        "metadata": {"name": "pair"},
        "spec": {"clusterIP": "None", "selector": {"app": "pair"}, "publishNotReadyAddresses": True},
    }
    core.create_namespaced_service(namespace, service)
    # the peer's name resolves once the endpoint controller has seen its pod
    script = "until getent hosts pair-0.pair >/dev/null; do sleep 0.2; done; exec python -c '" + ALL_REDUCE + "'"
    for rank, node in enumerate(nodes):
        body = pod(f"pair-{rank}", node, script, image=trainer)
        body["spec"]["containers"][0]["env"] = [{"name": "RANK", "value": str(rank)}]
        core.create_namespaced_pod(namespace, body)

    pods = [finished(core, namespace, f"pair-{rank}") for rank in range(2)]

    logs = [kubectl("logs", "-n", namespace, f"pair-{rank}").stdout.strip() for rank in range(2)]
    assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"], logs
    assert [p.spec.node_name for p in pods] == [first.name, second.name]
    assert logs == ["sum 3.0 on pair-0", "sum 3.0 on pair-1"]
