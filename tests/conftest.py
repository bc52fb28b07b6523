"""Shared fixtures: one real control plane per test session.

``--use-existing-cluster`` runs the same tests against whatever cluster KUBECONFIG points at.
When a test fails, the tail of every component's log is attached to its report.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.errors import BoxError


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--use-existing-cluster",
        action="store_true",
        help="run cluster tests against the cluster KUBECONFIG points at instead of starting the box",
    )


@dataclass(frozen=True)
class Cluster:
    """What tests need to reach a cluster; ``plane`` is None for an existing cluster."""

    kubeconfig: Path
    plane: ControlPlane | None


_PLANE: ControlPlane | None = None


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    global _PLANE
    if request.config.getoption("--use-existing-cluster"):
        path = os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config"))
        yield Cluster(kubeconfig=Path(path), plane=None)
        return
    with tempfile.TemporaryDirectory(prefix="ddpjob-box-") as tmp:
        plane = ControlPlane(data_dir=Path(tmp) / "box")
        try:
            plane.start()
        except BoxError as err:
            pytest.fail(f"the control plane did not start: {err}", pytrace=False)
        _PLANE = plane
        try:
            yield Cluster(kubeconfig=plane.kubeconfig, plane=plane)
        finally:
            _PLANE = None
            plane.stop()


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
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if getattr(report, "failed", False) and _PLANE is not None:
        report.sections.append(("control plane logs (tails)", _PLANE.log_tails()))  # type: ignore[attr-defined]
    return report  # type: ignore[no-any-return]
