"""Shared fixtures: one real control plane per test session.

``--use-existing-cluster`` runs the same tests against whatever cluster KUBECONFIG points at.
When a test fails, the tail of every component's log is attached to its report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.box import Box
from ddpjob_box.errors import BoxError
from ddpjob_box.images import shipped_images
from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.prometheus import Prometheus
from tests import workers


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a CI timeout, say) takes the Ctrl-C path, so fixtures still tear the box down.
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    if not hasattr(config, "workerinput"):  # the controlling process: its workers inherit the lock's name
        os.environ.setdefault(workers.RUN_ENV, uuid.uuid4().hex)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        for path in (workers.lock_path(), workers.run_file("groups.json")):
            if path is not None:
                path.unlink(missing_ok=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--use-existing-cluster",
        action="store_true",
        help="run cluster tests against the cluster KUBECONFIG points at instead of starting the box",
    )


@dataclass(frozen=True)
class Cluster:
    """What tests need to reach a cluster; ``box`` is None for an existing cluster."""

    kubeconfig: Path
    box: Box | None


_BOX: Box | None = None
GRACE = ("--node-monitor-grace-period=20s", "--node-monitor-period=2s")
"""How long until the node lifecycle controller marks a silent node NotReady, as kind users shorten it for tests:
the node tests (tests/e2e/test_nodes.py) wait that long after each cut. A kubelet here reports every 5 s; the
default 50 s would add half a minute to each cut."""
FAILURE_LINES = 25


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    global _BOX
    if request.config.getoption("--use-existing-cluster"):
        path = os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config"))
        yield Cluster(kubeconfig=Path(path), box=None)
        return
    with tempfile.TemporaryDirectory(prefix="ddpjob-box-") as tmp:
        # The node starts later, on first use: cluster tests drive pod status by hand before it exists.
        box = Box(data_dir=Path(tmp) / "box", with_node=False, with_prometheus=False, controller_manager_args=GRACE)
        try:
            box.start()
        except BoxError as err:
            pytest.fail(f"the control plane did not start: {err}", pytrace=False)
        _BOX = box
        try:
            assert box.plane is not None
            yield Cluster(kubeconfig=box.plane.kubeconfig, box=box)
        finally:
            _BOX = None
            box.stop()


@pytest.fixture(scope="session")
def node(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[KubeletNode]:
    """The box's node, started on first use: kubelet with containerd and runc, running the operator and
    trainer images built from the Dockerfile (a cold session builds them first, about 8 minutes)."""
    with workers.host_lock(request.config, exclusive=False):
        yield start_session_node(cluster, proxy=True)


def start_session_node(cluster: Cluster, *, proxy: bool) -> KubeletNode:
    if cluster.box is None:
        pytest.skip("the box's node exists only in the box, not in an existing cluster")
    try:
        # Cuttable: the node tests (tests/e2e/test_nodes.py) cut the network of whichever node rank 0 lands on.
        return cluster.box.start_node(images=shipped_images(), proxy=proxy, cuttable=True)
    except BoxError as err:
        pytest.fail(f"the box's node did not start: {err}", pytrace=False)


_HOST_ALONE: list[contextlib.ExitStack] = []
"""The exclusive host lock, while this worker runs its ``kubelet`` tests (tests/workers.py)."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``kubelet`` test takes the host for itself before its fixtures (its own nodes) start, and keeps it until
    the last of the ``kubelet`` tests that follow it: no other worker's node starts between two of them."""
    if workers.compares_host(item) and not _HOST_ALONE:
        alone = contextlib.ExitStack()
        alone.enter_context(workers.host_lock(item.config, exclusive=True))
        _HOST_ALONE.append(alone)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """...and lets it go once its fixtures (its nodes) are gone, unless the next test is one too."""
    if _HOST_ALONE and not workers.compares_host(nextitem):
        _HOST_ALONE.pop().close()


@pytest.fixture(scope="session")
def prometheus(cluster: Cluster, node: KubeletNode) -> Prometheus:
    """A real Prometheus finding the training pods through the apiserver (kubernetes_sd_configs)."""
    assert cluster.box is not None
    try:
        return cluster.box.start_prometheus()
    except BoxError as err:
        pytest.fail(f"prometheus did not start: {err}", pytrace=False)


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[Any]:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()
    del client


@pytest.fixture
def namespace(api_client: Any) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards even when the test fails."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"ddpjob.dev/test": "true"}}})
    # A pod is refused until the controller-manager has made the namespace's default ServiceAccount, which takes
    # a while after an apiserver restart (the plane-restart tests): a pod made at once failed with 403.
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(name, field_selector="metadata.name=default").items:
        if time.monotonic() > deadline:
            break  # the test's own pods then say why
        time.sleep(0.1)
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _BOX is not None:
        report.sections.append(("box logs (tails)", _BOX.log_tails()))
        # A log that shows only the output's end (CI's) would show only the box's logs otherwise.
        failure = "\n".join(report.longreprtext.splitlines()[-FAILURE_LINES:])
        report.sections.append(("the failure again, after the box's logs", failure))
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need no node run first: once the box's node is up, it would run the pods that cluster
    tests drive by hand. The Kueue tests run last: their box has a node of its own, and only one node's
    kube-proxy may run on a host, so the session box's node is stopped for them (tests/kueue/conftest.py).
    A stable sort keeps every other order as collected.

    Under pytest-xdist with two workers or more (``make test``), the same order holds within each of the two
    box groups, which run side by side on workers of their own (tests/workers.py)."""
    if not workers.split(config):
        items.sort(key=workers.start_order)
        return
    rank = {workers.E2E: 0, workers.BOX: 1, workers.FAULTS: 2, None: 3}
    items.sort(key=lambda item: (rank[workers.box_group(item)], *workers.start_order(item)))
    workers.write_groups(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return workers.make_scheduler(config, log)


def stop_session_node() -> None:
    """Stop the session box's node, if it runs, for a box of another test package that needs one (the Kueue
    tests, which run last): a host takes one node's kube-proxy at a time."""
    if _BOX is not None:
        _BOX.stop_node()
