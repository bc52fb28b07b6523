"""A box killed outright leaves its kubelet node's pods and shims running; the next claim of its data dir undoes it.

PR_SET_PDEATHSIG takes kubelet, containerd, CoreDNS and kube-proxy down with
the box, but containerd's shims are daemons by design and keep the pods alive,
with their mounts, cgroups and veths. The record written before the node
changed anything is what claim_data_dir uses to put the host back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ddpjob_box import images
from ddpjob_box.controlplane import claim_data_dir
from ddpjob_box.kubenode import hoststate
from ddpjob_box.kubenode.configs import NodeLayout
from ddpjob_box.kubenode.leftovers import RECORD
from tests.conftest import Cluster
from tests.e2e.kube import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.kubelet]

REPO = Path(__file__).resolve().parents[2]

# Starts a node against the session's control plane, runs a pod on it, says READY and waits to be killed.
CHILD = """
import sys, time, ipaddress
from pathlib import Path
from typing import Any
from kubernetes import client, config
from ddpjob_box import images
from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.kubenode.node import KubeletNode
plane_dir, port, token, node_dir, name, subnet = sys.argv[1:7]
plane = ControlPlane(data_dir=Path(plane_dir), apiserver_port=int(port), admin_token=token)
node = KubeletNode(plane=plane, directory=Path(node_dir), name=name, bridge=name[-12:],
                   subnet=ipaddress.IPv4Network(subnet), sandbox_image=images.ensure_pause(),
                   importer=images.import_into_containerd, images=[images.ensure_base()], taints=("crash",))
node.start()
core = client.CoreV1Api(config.new_client_from_config(config_file=str(plane.kubeconfig)))
core.create_namespaced_pod(sys.argv[7], {"metadata": {"name": "sleeper"}, "spec": {
    "nodeName": name, "tolerations": [{"operator": "Exists"}], "restartPolicy": "Never",
    "containers": [{"name": "main", "image": images.ensure_base(), "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"]}]}})
while core.read_namespaced_pod("sleeper", sys.argv[7]).status.phase != "Running":
    time.sleep(0.2)
print("READY", flush=True)
time.sleep(3600)
"""


def _mentioning(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def test_claiming_a_killed_boxs_data_dir_kills_its_pods_and_shims_and_restores_the_host(
    cluster: Cluster, api_client: Any, namespace: str
) -> None:
    if cluster.box is None or cluster.box.plane is None or os.geteuid() != 0:
        pytest.skip("needs the box's control plane and root")
    plane = cluster.box.plane
    # built here, so the child only starts the node
    images.ensure_pause()
    images.ensure_base()
    # not pytest's tmp_path: kubelet's sockets need a short path
    data_dir = Path(tempfile.mkdtemp(prefix="ddpjob-killed-")) / "box"
    node_dir = data_dir / "kubenode"
    name = f"crash-{cluster.box.box_id}"
    rest = [str(node_dir), name, "10.244.250.0/24", namespace]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(plane.data_dir), str(plane.apiserver_port), plane.admin_token, *rest],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONPATH=f"{REPO / 'box'}:{REPO}"),
    )
    try:
        assert child.stdout is not None
        output = []
        deadline = time.monotonic() + 180
        while (line := child.stdout.readline()) and "READY" not in line and time.monotonic() < deadline:
            output.append(line)
        assert "READY" in line, "".join(output[-30:])
        before = hoststate.HostState(**json.loads((node_dir / RECORD).read_text())["before"])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # The shims name the node's containerd socket; the pods sit in cgroups the node made.
    sockets = str(NodeLayout(node_dir, Path("unused")).socket_dir)
    try:
        time.sleep(1)  # PDEATHSIG: kubelet, containerd and the rest die with the child
        assert _mentioning(sockets), "the shims should outlive the killed box, or this test proves nothing"
        assert set(hoststate.pod_cgroups()) - set(before.cgroups), "and so should the pods"
    finally:
        claim_data_dir(data_dir, reset=True)
        client.CoreV1Api(api_client).delete_node(name)
        shutil.rmtree(data_dir.parent)

    assert _mentioning(sockets) == []
    assert hoststate.compare(before, hoststate.snapshot(node_dir, name[-12:])) == []
    assert not Path(sockets).exists()
    # Its kubernetes EndpointSlice goes with its Node: left behind, it sent a share of every later pod's
    # connections to kubernetes.default.svc to this node's dead gateway.
    discovery = client.DiscoveryV1Api(api_client)
    wait_for(
        f"the garbage collector to delete kubernetes-{name}",
        lambda: not [s for s in discovery.list_namespaced_endpoint_slice("default").items
                     if s.metadata.name == f"kubernetes-{name}"],
        60,
        interval=0.5,
    )  # fmt: skip
