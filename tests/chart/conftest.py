"""Chart fixtures: the CRD, installed from the chart's crds/ with the real kubectl."""

from __future__ import annotations

import pytest

from tests.chart.helm import CHART, kubectl, wait_established
from tests.conftest import Cluster


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> str:
    """The DDPJob CRD, established (kubectl resolves ddpjobs.ddpjob.dev only once it is served)."""
    path = CHART / "crds" / "ddpjob.yaml"
    kubectl(cluster.kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    wait_established(cluster.kubeconfig, "ddpjobs.ddpjob.dev")
    return "ddpjobs.ddpjob.dev"
