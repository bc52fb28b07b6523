"""The operator against a real apiserver when a rank's node is lost: its node watch sees the Node's Ready condition go
Unknown, the gang restarts at once with reason NodeLost, the lost node's pod is force-deleted (no kubelet there
would ever confirm its deletion), the healthy node's pod is not, and the next attempt's pods avoid the node.

No kubelet runs here: the test registers two Nodes and plays their kubelets (the pods' binding and status), as the
other cluster tests play the ranks. What real kubelets and the node lifecycle controller do when a node loses power
or its network is measured on the multi-node box by ``bench.node_loss``.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Operator
from .helpers import TRAINER, Raw, job_body, wait_for

pytestmark = pytest.mark.cluster

TAINT = {"key": "ddpjob.dev/test-node", "effect": "NoSchedule"}
"""Keeps every other test's pods off these Nodes: this test binds its own pods by hand."""

NOWHERE = {"ddpjob.dev/test-node": "bound-by-hand"}
"""A node selector that no node matches, so that the scheduler leaves the test's pods to it (the box has a real node
that would take them first)."""


def ready(status: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"status": {"conditions": [{"type": "Ready", "status": status, "reason": "KubeletReady" if status == "True"
                                       else "NodeStatusUnknown", "lastHeartbeatTime": now,
                                       "lastTransitionTime": now}]}}  # fmt: skip


class Kubelets:
    """The kubelets this test plays: each reports its node Ready every 3 s until silenced, as a real one does
    (the session box's node lifecycle controller marks a node silent for 20 s Unknown: tests/conftest.py)."""

    def __init__(self, raw: Raw, names: list[str]) -> None:
        self.raw, self.names, self.reporting = raw, names, set(names)
        self.done, self.lock = threading.Event(), threading.Lock()
        self.thread = threading.Thread(target=self._report, daemon=True)

    def _report(self) -> None:
        while not self.done.wait(3):
            with self.lock:
                for name in sorted(self.reporting):
                    self.raw.merge(f"/api/v1/nodes/{name}/status", ready("True"))

    def silence(self, name: str) -> None:
        """Its kubelet stops reporting: no report of it is sent from now on."""
        with self.lock:
            self.reporting.discard(name)


@pytest.fixture
def nodes(raw: Raw) -> Iterator[Kubelets]:
    names = [f"n-{uuid.uuid4().hex[:6]}-{side}" for side in ("a", "b")]
    kubelets = Kubelets(raw, names)
    for name in names:
        raw.post("/api/v1/nodes", {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                                   "spec": {"taints": [TAINT]}})  # fmt: skip
        raw.merge(f"/api/v1/nodes/{name}/status", ready("True"))
    kubelets.thread.start()
    try:
        yield kubelets
    finally:
        kubelets.done.set()
        kubelets.thread.join()
        for name in names:
            raw.delete(f"/api/v1/nodes/{name}")


def bind(raw: Raw, ns: str, pod: str, node: str) -> None:
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"kind": "Node", "name": node},
    }
    raw.post(f"/api/v1/namespaces/{ns}/pods/{pod}/binding", binding)


def test_a_lost_nodes_rank_restarts_the_gang_at_once_and_only_its_pod_is_force_deleted(
    raw: Raw, namespace: str, nodes: Kubelets, operator: Operator
) -> None:
    healthy, lost = nodes.names
    template = {"spec": {"containers": [copy.deepcopy(TRAINER)], "nodeSelector": NOWHERE}}
    raw.create_job(namespace, job_body("train", 2, gangScheduling="Disabled", template=template))
    wait_for(lambda: len(raw.pods(namespace, "train")) == 2, what="the job's two pods")
    bind(raw, namespace, "train-0", healthy)
    bind(raw, namespace, "train-1", lost)
    raw.set_all(namespace, "train", "Running")
    wait_for(lambda: raw.status(namespace, "train").get("phase") == "Running", what="the job to run",
             seen=lambda: raw.status(namespace, "train"))  # fmt: skip

    nodes.silence(lost)
    raw.merge(f"/api/v1/nodes/{lost}/status", ready("Unknown"))  # its kubelet stopped reporting

    def restarted() -> dict[str, Any] | None:
        status = raw.status(namespace, "train")
        restarting = next((c for c in status.get("conditions") or [] if c["type"] == "Restarting"), {})
        return status if restarting.get("reason") == "NodeLost" else None

    status = wait_for(restarted, what="a NodeLost restart", seen=lambda: raw.status(namespace, "train"))
    assert status["restarts"] == 1
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert f"node {lost} is lost" in restarting["message"] and "rank 1's pod train-1" in restarting["message"]
    assert [(e["name"], e["reason"]) for e in status["excludedNodes"]] == [(lost, "NodeLost")]
    assert any(e["reason"] == "NodeLost" and e["type"] == "Warning" for e in raw.events(namespace, "train"))

    # The lost node's pod is gone from the apiserver at once. The healthy node's is kept a moment for a restart in
    # place (its trainer has not exited: no kubelet here), then deleted with its grace period: it waits for its kubelet.
    wait_for(lambda: "train-1" not in {x["metadata"]["name"] for x in raw.pods(namespace, "train")},
             what="the lost node's pod to be force-deleted")  # fmt: skip
    healthy_pod = wait_for(lambda: next((x for x in raw.pods(namespace, "train") if x["metadata"]["name"] == "train-0"
                                         and x["metadata"].get("deletionTimestamp")), None),
                           what="the healthy node's pod to be deleted")  # fmt: skip
    assert healthy_pod["metadata"].get("deletionGracePeriodSeconds") != 0, "never force-deleted"

    # Its kubelet confirms; the next attempt's pods avoid the lost node.
    raw.delete(f"/api/v1/namespaces/{namespace}/pods/train-0", {"gracePeriodSeconds": 0})
    made = wait_for(lambda: (p := raw.pods(namespace, "train")) and len(p) == 2
                    and all(x["metadata"]["labels"]["ddpjob.dev/attempt"] == "1" for x in p) and p,
                    what="the next attempt's pods")  # fmt: skip
    for pod in made:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [lost]}
        ]
    assert raw.status(namespace, "train")["restarts"] == 1, "counted once"
