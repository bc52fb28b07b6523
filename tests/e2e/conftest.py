"""End-to-end fixtures: the CRD applied with the real kubectl, and the operator as its own process."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box import toolchain
from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.operator_process import OperatorProcess
from tests import workers
from tests.chart.helm import wait_established
from tests.conftest import Cluster, start_session_node

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "helm" / "ddpjob" / "crds" / "ddpjob.yaml"


class Kubectl:
    def __init__(self, kubeconfig: Path):
        self.binary = toolchain.ensure(toolchain.kubernetes_build())["kubectl"]
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args], capture_output=True, text=True, timeout=120
        )
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}", pytrace=False)
        return proc


@pytest.fixture(scope="session")
def node(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[KubeletNode]:
    """The box's node (tests/conftest.py). Run side by side with the chart's and Kueue's tests (make test), it
    has no kube-proxy, which only one node on a host may run: no test here uses a ClusterIP Service."""
    with workers.host_lock(request.config, exclusive=False):
        yield start_session_node(cluster, proxy=not workers.split(request.config))


@pytest.fixture(scope="session")
def kubectl(cluster: Cluster) -> Kubectl:
    run = Kubectl(cluster.kubeconfig)
    run("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(cluster.kubeconfig, "ddpjobs.ddpjob.dev")
    return run


@pytest.fixture
def operator(
    cluster: Cluster, kubectl: Kubectl, node: KubeletNode, namespace: str, api_client: Any, tmp_path: Path
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster.kubeconfig, tmp_path / "operator.log", namespaces=[namespace])
    try:
        yield op
    finally:
        op.stop()
        print(f"--- operator log:\n{op.log()[-4000:]}")
        print_pod_logs(api_client, namespace)


def print_pod_logs(api_client: Any, namespace: str) -> None:
    """Every container's log tail in ``namespace``, for the report of a failed test."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api_client)
    for pod in core.list_namespaced_pod(namespace).items:
        for container in [*(pod.spec.init_containers or []), *pod.spec.containers]:
            try:
                log = core.read_namespaced_pod_log(pod.metadata.name, namespace, container=container.name)
            except ApiException as err:
                log = f"(no log: {err.reason})"
            print(f"--- {pod.metadata.name}/{container.name} ({pod.status.phase}):\n{(log or '')[-1500:]}")
