"""End-to-end fixtures: the CRD applied with the real kubectl, and the operator as its own process."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box import toolchain
from ddpjob_box.operator_process import OperatorProcess
from tests.conftest import Cluster

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
def kubectl(cluster: Cluster) -> Kubectl:
    run = Kubectl(cluster.kubeconfig)
    run("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    run("wait", "--for=condition=Established", "crd/ddpjobs.ddpjob.dev", "--timeout=60s")
    return run


@pytest.fixture
def operator(
    cluster: Cluster, kubectl: Kubectl, local_node: Any, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster.kubeconfig, tmp_path / "operator.log", namespaces=[namespace])
    try:
        yield op
    finally:
        op.stop()
        print(f"--- operator log:\n{op.log()[-4000:]}")
        for log in sorted(local_node.state_dir.glob("pods/*/*/log")):
            meta = log.parent.parent / "meta.json"
            if meta.exists() and f'"namespace": "{namespace}"' in meta.read_text():
                print(f"--- {meta.read_text()[:160]} {log.parent.name}:\n{log.read_text(errors='replace')[-1500:]}")
