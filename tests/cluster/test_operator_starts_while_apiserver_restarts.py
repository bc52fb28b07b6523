"""The operator started while the apiserver is down (an upgrade, a restart) waits for it, in one line a try.

The chaos soak found it: an operator restarted while another fault restarted kube-apiserver logged a
traceback from its startup and tried again only 60 s later.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.operator_process import OperatorProcess
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster


def until_logged(operator: OperatorProcess, line: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while line not in operator.log():
        assert operator.alive(), operator.log_tail()
        assert time.monotonic() < deadline, f"the operator never logged {line!r}:\n{operator.log_tail()}"
        time.sleep(0.2)


def test_an_operator_started_while_the_apiserver_is_down_starts_once_it_answers(
    cluster: Cluster, namespace: str, crd: dict[str, Any], tmp_path: Path
) -> None:
    if cluster.box is None or cluster.box.plane is None:
        pytest.skip("the box's control plane only")
    plane = cluster.box.plane
    apiserver = next(c for c in plane.components if c.name == "kube-apiserver")
    apiserver.stop()
    try:
        operator = OperatorProcess(plane.kubeconfig, tmp_path / "operator.log", namespaces=[namespace])
        until_logged(operator, "failed temporarily")
    finally:
        apiserver.start()
    try:
        until_logged(operator, "gang scheduling: the cluster serves PodGroups")
        log = operator.log()
        assert "Traceback" not in log, log
        failed = [line for line in log.splitlines() if "failed temporarily" in line]
        assert "the apiserver did not answer" in failed[0] and "trying again in 2s" in failed[0], failed
    finally:
        operator.stop()
