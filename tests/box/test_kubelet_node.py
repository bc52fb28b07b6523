"""A real node: kubelet with containerd, runc and a CNI bridge, registered with the box's apiserver.

Nothing here is simulated: the pods run from a local Debian image under runc,
their logs and exec go apiserver -> kubelet -> containerd, and stopping the node
must leave the host as a snapshot found it before the node started.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode import hoststate
from ddpjob_box.kubenode.node import KubeletNode
from tests.conftest import Cluster
from tests.e2e.conftest import Kubectl
from tests.e2e.kube import wait_pod_phase

pytestmark = [pytest.mark.cluster, pytest.mark.kubelet]

TAINT = "ddpjob.dev/kubelet-node-test"


def _processes_mentioning(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[KubeletNode]:
    if cluster.box is None or cluster.box.plane is None:
        pytest.skip("the kubelet node runs only in the box, not in an existing cluster")
    if os.geteuid() != 0:
        pytest.skip("a kubelet node needs root")
    box = cluster.box
    started = time.monotonic()
    try:
        node = box.start_node(taints=(TAINT,))
    except BoxError as err:
        pytest.fail(f"the kubelet node did not start: {err}", pytrace=False)
    print(f"kubelet node Ready {time.monotonic() - started:.1f}s after start")
    try:
        yield node
    finally:
        box.stop_node()


@pytest.fixture(scope="module")
def kubectl(cluster: Cluster) -> Kubectl:
    return Kubectl(cluster.kubeconfig)


def _pod(name: str, node: KubeletNode, command: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": node.images[0],
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                }
            ],
        },
    }


def test_the_kubelet_registers_its_node_and_reports_it_ready(node: KubeletNode, api_client: Any) -> None:
    got = client.CoreV1Api(api_client).read_node(node.name)
    assert {c.type: c.status for c in got.status.conditions}["Ready"] == "True"
    assert got.status.node_info.container_runtime_version.startswith("containerd://")
    assert {a.type: a.address for a in got.status.addresses}["InternalIP"] == node.gateway


def test_a_pod_runs_from_a_local_image_with_logs_and_exec_through_the_apiserver(
    node: KubeletNode, api_client: Any, namespace: str, kubectl: Kubectl
) -> None:
    core = client.CoreV1Api(api_client)
    # The pod waits for a file that only `kubectl exec` creates, so Succeeded proves exec reached the container.
    script = "echo started on $(cat /etc/hostname); while [ ! -f /tmp/go ]; do sleep 0.1; done; echo finished"
    created = time.monotonic()
    core.create_namespaced_pod(namespace, _pod("hello", node, script))
    pod = wait_pod_phase(core, namespace, "hello", {"Running", "Succeeded", "Failed"}, 120)
    print(f"pod Running {time.monotonic() - created:.1f}s after create")
    assert pod.status.phase == "Running"
    assert ipaddress.ip_address(pod.status.pod_ip) in node.subnet
    # A bridge whose MAC follows its ports' would now have the pod's veth MAC, and pods' ARP entries for the
    # gateway would go stale as pods come and go.
    assert Path(f"/sys/class/net/{node.bridge}/address").read_text().strip() == node.bridge_mac

    exec_out = kubectl("exec", "-n", namespace, "hello", "--", "sh", "-c", "id -u; touch /tmp/go").stdout
    assert exec_out.split() == ["0"]
    pod = wait_pod_phase(core, namespace, "hello", {"Succeeded", "Failed"}, 60)
    assert pod.status.phase == "Succeeded"
    logs = kubectl("logs", "-n", namespace, "hello").stdout
    assert logs.splitlines() == ["started on hello", "finished"]


def test_the_runtime_enforces_the_pods_user_read_only_root_and_memory_limit(
    node: KubeletNode, api_client: Any, namespace: str, kubectl: Kubectl
) -> None:
    core = client.CoreV1Api(api_client)
    restricted = _pod("restricted", node, "id -u; touch /probe 2>/dev/null && echo writable || echo read-only")
    restricted["spec"]["securityContext"] = {"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": True}
    restricted["spec"]["containers"][0]["securityContext"] = {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    core.create_namespaced_pod(namespace, restricted)
    # Python holds 200 MB against a 64 Mi limit: the kernel's OOM killer ends it inside the pod's memory cgroup.
    hog = _pod("hog", node, "python3 -c 'x = bytearray(200 * 1024 * 1024); x[::4096] = b\"x\" * len(x[::4096])'")
    hog["spec"]["containers"][0]["resources"] = {"limits": {"memory": "64Mi", "cpu": "500m"}}
    core.create_namespaced_pod(namespace, hog)

    done = wait_pod_phase(core, namespace, "restricted", {"Succeeded", "Failed"}, 120)
    assert done.status.phase == "Succeeded"
    assert kubectl("logs", "-n", namespace, "restricted").stdout.split() == ["10001", "read-only"]
    oom = wait_pod_phase(core, namespace, "hog", {"Succeeded", "Failed"}, 120)
    terminated = oom.status.container_statuses[0].state.terminated
    assert (oom.status.phase, terminated.reason, terminated.exit_code) == ("Failed", "OOMKilled", 137)


IN_CLUSTER_VERSION = """
import json, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
ctx = ssl.create_default_context(cafile=sa + "ca.crt")
req = urllib.request.Request("https://kubernetes.default.svc/version",
                             headers={"Authorization": "Bearer " + open(sa + "token").read()})
print("apiserver", json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"])
"""


def test_a_pod_resolves_its_headless_service_name_and_reaches_the_apiserver_as_kubernetes_default_svc(
    node: KubeletNode, api_client: Any, namespace: str, kubectl: Kubectl
) -> None:
    if not (node.with_dns and node.with_proxy):
        pytest.skip("this node runs without CoreDNS or kube-proxy")
    _resolve_and_reach_the_apiserver(node, api_client, namespace, kubectl)


def test_node_components_killed_outright_are_started_again_and_the_node_still_runs_pods_that_resolve_names(
    node: KubeletNode, api_client: Any, namespace: str, kubectl: Kubectl
) -> None:
    """As systemd restarts a real node's kubelet and containerd, and kubelet its CoreDNS and kube-proxy pods."""
    if not (node.with_dns and node.with_proxy):
        pytest.skip("this node runs without CoreDNS or kube-proxy")
    killed = {c.name: c.pid for c in node.components}
    assert set(killed) == {"coredns", "containerd", "kubelet", "kube-proxy", "apiserver-forwarder"}
    for pid in killed.values():
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not all(c.alive() and c.pid != killed[c.name] for c in node.components):
        assert time.monotonic() < deadline, f"not all started again: {node.plane.restarted}"
        time.sleep(0.2)
    said = {line.split(" exited", 1)[0] for line in node.plane.restarted}
    assert set(killed) <= said, node.plane.restarted
    _resolve_and_reach_the_apiserver(node, api_client, namespace, kubectl)


def _resolve_and_reach_the_apiserver(node: KubeletNode, api_client: Any, namespace: str, kubectl: Kubectl) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "job"},
            "spec": {"clusterIP": "None", "selector": {"app": "job"}, "ports": [{"port": 29500}]},
        },
    )
    # getent goes through the pod's resolv.conf (CoreDNS) with its search path, as gloo's resolver does.
    script = (
        f"for i in $(seq 100); do getent hosts job-0.job && break; sleep 0.2; done; python3 -c '{IN_CLUSTER_VERSION}'"
    )
    pod = _pod("job-0", node, script)
    pod["metadata"]["labels"] = {"app": "job"}
    pod["spec"] |= {"hostname": "job-0", "subdomain": "job"}
    core.create_namespaced_pod(namespace, pod)
    done = wait_pod_phase(core, namespace, "job-0", {"Succeeded", "Failed"}, 120)
    logs = kubectl("logs", "-n", namespace, "job-0").stdout
    assert done.status.phase == "Succeeded", logs
    assert logs.splitlines()[0].split()[0] == done.status.pod_ip
    assert "job-0.job" in logs.splitlines()[0]
    assert logs.splitlines()[-1] == f"apiserver {client.VersionApi(api_client).get_code().git_version}"


def test_stopping_the_node_leaves_the_host_as_found(node: KubeletNode, api_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    # A pod still running at stop leaves the most behind: mounts, a netns, veth, cgroups, a shim.
    core.create_namespaced_pod(namespace, _pod("sleeper", node, "sleep 3600"))
    wait_pod_phase(core, namespace, "sleeper", {"Running"}, 120)
    before = node.before
    assert before is not None

    node.stop()

    assert node.leftovers == []
    assert hoststate.compare(before, hoststate.snapshot(node.directory, node.bridge)) == []
    assert _processes_mentioning(str(node.directory)) == []
    assert all(not c.alive() for c in (node.kubelet, node.containerd, node.coredns, node.kube_proxy) if c)
    assert not node.layout.socket_dir.exists()
