"""A control-plane component that exits on its own is started again, as kubelet restarts a static pod.

The real kube-scheduler exits on purpose when it finds its cache inconsistent (the chaos soak saw it,
with three jobs and an apiserver restart); without a restart, every later pod stayed Pending with no Event.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.conftest import Cluster

pytestmark = pytest.mark.cluster


def test_a_killed_scheduler_is_started_again_and_schedules_the_next_pod(
    cluster: Cluster, api_client: Any, namespace: str
) -> None:
    from kubernetes import client

    if cluster.box is None or cluster.box.plane is None:
        pytest.skip("the box's control plane only")
    plane = cluster.box.plane
    scheduler = next(c for c in plane.components if c.name == "kube-scheduler")
    killed = scheduler.pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (scheduler.alive() and scheduler.pid != killed):
        assert time.monotonic() < deadline, f"kube-scheduler was not started again: {plane.restarted}"
        time.sleep(0.2)
    assert any(line.startswith("kube-scheduler exited with code -9") for line in plane.restarted), plane.restarted

    core = client.CoreV1Api(api_client)
    pod = {
        "metadata": {"name": "unplaceable"},
        "spec": {
            "nodeSelector": {"ddpjob.dev/no-such-node": "true"},
            "containers": [{"name": "c", "image": "nothing:here"}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    deadline = time.monotonic() + 60
    while True:
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=unplaceable").items
        if any(e.reason == "FailedScheduling" for e in events):
            break  # only a running scheduler says why it cannot place a pod
        assert time.monotonic() < deadline, "the restarted scheduler never looked at the new pod"
        time.sleep(0.5)
