"""A box with Kueue, as ``ddpjob cluster up --kueue`` starts it, for the tests in this package.

``kueue_cluster`` starts it once for the package and stops it when the package's last test is done, so it
never runs beside the session's other box's node. It yields a ``KueueCluster``: the kubeconfig, a kubectl
that fails the test on error, the ``Box`` and its ``Kueue`` (``.stop()``, ``.start()`` and ``.kill()`` take
Kueue's manager down and up). ``queues`` applies tests/kueue/queues.yaml in a fresh namespace.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpjob_box.box import Box
from ddpjob_box.errors import BoxError
from ddpjob_box.kueue import Kueue
from ddpjob_box.topology import parse as parse_topology
from tests import workers
from tests.conftest import GRACE, stop_session_node
from tests.e2e.conftest import Kubectl

QUEUES = Path(__file__).with_name("queues.yaml")
NODES = 4
TOPOLOGY = "rack=2"
SIMULATED_NODES = 4
"""KWOK's simulated GPU hosts beside the real nodes (test_simulated.py), 2 per rack."""

LOCAL_QUEUE = "user-queue"
CLUSTER_QUEUE = "cluster-queue"

_BOX: Box | None = None


@dataclass(frozen=True)
class KueueCluster:
    kubeconfig: Path
    kubectl: Kubectl
    box: Box
    kueue: Kueue


@pytest.fixture(scope="package")
def kueue_cluster(request: pytest.FixtureRequest) -> Iterator[KueueCluster]:
    """The box with its node and Kueue (a cold run builds Kueue's image first); stopped even when a test fails."""
    global _BOX
    if os.geteuid() != 0:
        pytest.skip("the box's node, which runs Kueue, needs root")
    stop_session_node()  # these tests run last (tests/conftest.py): no later test needs that node
    with workers.host_lock(request.config, exclusive=False), tempfile.TemporaryDirectory(prefix="ddpjob-box-") as tmp:
        # 4 nodes in 2 racks, for topology-aware placement (test_topology.py); Kueue's manager on the first
        box = Box(
            data_dir=Path(tmp) / "box",
            with_kueue=True,
            with_prometheus=False,
            node_count=NODES,
            topology=parse_topology(TOPOLOGY),
            simulated_nodes=SIMULATED_NODES,
            controller_manager_args=GRACE,  # as the session's box: a cut node is NotReady in 20 s
        )
        started = time.monotonic()
        try:
            box.start()  # stops what it started when it fails
        except BoxError as err:
            pytest.fail(f"the box with Kueue did not start: {err}", pytrace=False)
        print(f"box with Kueue ready in {time.monotonic() - started:.0f}s")
        assert box.plane is not None and box.kueue is not None
        _BOX = box
        try:
            yield KueueCluster(box.plane.kubeconfig, Kubectl(box.plane.kubeconfig), box, box.kueue)
        finally:
            _BOX = None
            box.stop()


@pytest.fixture
def kueue_namespace(kueue_cluster: KueueCluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards even when the test fails."""
    kubectl = kueue_cluster.kubectl
    name = f"k-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def queues(kueue_cluster: KueueCluster, kueue_namespace: str) -> str:
    """tests/kueue/queues.yaml applied, its LocalQueue in the test's namespace; returns the namespace once
    Kueue reports the ClusterQueue Active (its flavor exists and its quota is loaded)."""
    kubectl = kueue_cluster.kubectl
    kubectl("apply", "-n", kueue_namespace, "-f", str(QUEUES))
    kubectl("wait", f"clusterqueue/{CLUSTER_QUEUE}", "--for=condition=Active", "--timeout=60s")
    kubectl("wait", "-n", kueue_namespace, f"localqueue/{LOCAL_QUEUE}", "--for=condition=Active", "--timeout=60s")
    return kueue_namespace


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _BOX is not None:
        report.sections.append(("box with Kueue: logs (tails)", _BOX.log_tails()))
    return report
