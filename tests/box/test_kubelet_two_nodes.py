"""Two kubelets on one machine: two nodes, each with its own containerd, bridge, /24 and cgroup root.

A pod on one node reaches a pod on the other by its DNS name through the
host's routing between the bridges, as ranks on two nodes would rendezvous.
The second node runs no kube-proxy: Service rules are host-wide iptables, and
two proxies would rewrite each other's chains. Whichever node stops last
puts the host back as the first one found it.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from kubernetes import client

from ddpjob_box import images
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode import hoststate
from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.kubenode.subnet import pick_subnet
from tests.conftest import Cluster
from tests.e2e.conftest import Kubectl

pytestmark = [pytest.mark.cluster, pytest.mark.kubelet]

TAINT = "ddpjob.dev/kubelet-two-nodes-test"


def start_two_nodes(cluster: Cluster, extra_images: Sequence[str] = ()) -> Iterator[tuple[KubeletNode, KubeletNode]]:
    if cluster.box is None or cluster.box.plane is None or os.geteuid() != 0:
        pytest.skip("needs the box's control plane and root")
    box = cluster.box
    assert box.plane is not None
    second: KubeletNode | None = None
    try:
        started = time.monotonic()
        first = box.start_node(images=list(extra_images), taints=(TAINT,))
        print(f"first node Ready {time.monotonic() - started:.1f}s after start")
        second = KubeletNode(
            plane=box.plane,
            directory=box.data_dir / "kubenode-b",
            name=f"{first.name}-b",
            bridge=f"kb{box.box_id}",
            subnet=pick_subnet(int(box.box_id, 16) % 256 + 64),
            sandbox_image=images.ensure_pause(),
            importer=images.import_into_containerd,
            images=first.images,
            taints=(TAINT,),
            with_proxy=False,
        )
        started = time.monotonic()
        second.start()
        print(f"second node Ready {time.monotonic() - started:.1f}s after start")
    except BoxError as err:
        if second:
            second.stop()
        box.stop_node()
        pytest.fail(f"a kubelet node did not start: {err}", pytrace=False)
    try:
        yield first, second
    finally:
        second.stop()
        box.stop_node()


@pytest.fixture(scope="module")
def nodes(cluster: Cluster) -> Iterator[tuple[KubeletNode, KubeletNode]]:
    yield from start_two_nodes(cluster)


def pod(name: str, node: KubeletNode, script: str, image: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "pair"}},
        "spec": {
            "hostname": name,
            "subdomain": "pair",
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image or node.images[0],
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script] if not image else ["sh", "-c", script],
                }
            ],
        },
    }


SERVER = """
import socket
server = socket.create_server(("", 7000))
conn, peer = server.accept()
conn.sendall(socket.gethostname().encode())
print("served", peer[0])
"""

CLIENT = """
import socket, time
for _ in range(300):
    try:
        print("got", socket.create_connection(("pair-0.pair", 7000), timeout=2).recv(100).decode())
        break
    except OSError:
        time.sleep(0.2)
"""


def finished(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    deadline = time.monotonic() + 120
    while (current := core.read_namespaced_pod(name, namespace)).status.phase not in ("Succeeded", "Failed"):
        if time.monotonic() > deadline:
            pytest.fail(f"pod {name} is still {current.status.phase} after 120s", pytrace=False)
        time.sleep(0.2)
    return current


def test_a_pod_on_one_node_reaches_a_pod_on_the_other_by_its_dns_name(
    nodes: tuple[KubeletNode, KubeletNode], api_client: Any, namespace: str, kubectl: Kubectl
) -> None:
    first, second = nodes
    core = client.CoreV1Api(api_client)
    service = {"metadata": {"name": "pair"}, "spec": {"clusterIP": "None", "selector": {"app": "pair"}}}
    core.create_namespaced_service(namespace, service)
    core.create_namespaced_pod(namespace, pod("pair-0", first, SERVER))
    core.create_namespaced_pod(namespace, pod("pair-1", second, CLIENT))

    server, peer = finished(core, namespace, "pair-0"), finished(core, namespace, "pair-1")

    assert (server.spec.node_name, peer.spec.node_name) == (first.name, second.name)
    assert ipaddress.ip_address(server.status.pod_ip) in first.subnet
    assert ipaddress.ip_address(peer.status.pod_ip) in second.subnet
    assert kubectl("logs", "-n", namespace, "pair-1").stdout.split() == ["got", "pair-0"]
    # No NAT between the nodes: the server sees the client's own pod IP, as a collective's peers must.
    assert kubectl("logs", "-n", namespace, "pair-0").stdout.split() == ["served", peer.status.pod_ip]


def test_stopping_the_first_node_before_the_second_leaves_the_host_as_the_first_found_it(
    nodes: tuple[KubeletNode, KubeletNode], cluster: Cluster
) -> None:
    first, second = nodes
    before = first.before
    assert before is not None and cluster.box is not None
    # Not the reverse order: the host-wide state must wait for the second node, which still needs it.
    cluster.box.stop_node()
    assert hoststate.snapshot(second.directory, second.bridge).sysctls["vm.overcommit_memory"] == "1"
    assert second.ready()
    second.stop()
    assert (first.leftovers, second.leftovers) == ([], [])
    for node in (first, second):
        assert hoststate.compare(before, hoststate.snapshot(node.directory, node.bridge)) == []


@pytest.fixture(scope="module")
def kubectl(cluster: Cluster) -> Kubectl:
    return Kubectl(cluster.kubeconfig)
