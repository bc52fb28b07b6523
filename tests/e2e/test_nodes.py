"""Issue 43 on real nodes, in ``make test``: the faults group's box (tests/workers.py) grows to 3 nodes for this
module (the session's node and two more, each its own kubelet, containerd, cgroup root, bridge and /24), and shrinks
back after it.

- A 3-rank job, one rank per node, checkpoints to one ReadWriteMany claim, loses a rank's pod, resumes from the
  claim on the next attempt and Succeeds.
- 2-rank jobs spread over two nodes: rank 1's node loses its power, then rank 0's (MASTER_ADDR's); rank 0's node
  loses its network. Each job restarts once (NodeLost), names and excludes the node, Succeeds at its last step
  from its newest checkpoint, leaves no pod on the node once it is back, and its cut rank logs no step and writes
  no checkpoint after the next attempt's first step (``bench.node_loss.kept_its_promises``; ``python -m
  bench.node_loss`` runs the same trials ten times each and times them).
- A sick node that stays Ready: rank 1's node faults it with SIGBUS twice, then the node under rank 1 again is
  tainted unhealthy; the gang leaves each, excluding it, until it has nowhere left and says so; cleared, it ends.

The session's controller-manager marks a silent node NotReady after 20 s (``tests/conftest.py``, ``GRACE``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from bench.node_loss import (
    GROUP,
    PLURAL,
    VERSION,
    Trial,
    bring_back_node,
    cut_node,
    job_body,
    kept_its_promises,
    pod_lines,
    shared_claim,
)
from ddpjob_box.box import Box
from ddpjob_box.images import shipped_images
from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.operator_process import OperatorProcess
from tests.conftest import Cluster
from tests.e2e.kube import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.images, pytest.mark.timeout(900)]

STEPS = 200
"""Steps of each job here (20 s or more on the 2-core VM): a checkpoint every 20, so one is there before the cut."""


@pytest.fixture(scope="module")
def three_nodes(cluster: Cluster, node: KubeletNode) -> Iterator[Box]:
    box = cluster.box
    assert box is not None
    try:
        box.start_nodes(3, images=shipped_images(), proxy=False)
        yield box
    finally:
        box.stop_extra_nodes()


def _status(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {})


def test_three_ranks_one_per_node_save_to_the_shared_claim_resume_from_it_and_succeed(
    three_nodes: Box, api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    box = three_nodes
    assert len(box.nodes) == 3 and all(n.ready() for n in box.nodes)
    assert len({n.bridge for n in box.nodes}) == 3 and len({str(n.subnet) for n in box.nodes}) == 3
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    core.create_namespaced_persistent_volume_claim(namespace, shared_claim("spread-ckpt"))
    body = job_body("spread", "spread-ckpt", steps=STEPS, replicas=3)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    status = lambda: _status(custom, namespace, "spread")  # noqa: E731
    wait_for("the job to run", lambda: status().get("phase") == "Running", 300, seen=status)
    saved = wait_for("a checkpoint", lambda: (status().get("lastCheckpoint") or {}).get("step"), 120, seen=status)
    pods = core.list_namespaced_pod(namespace, label_selector="ddpjob.dev/job-name=spread").items
    placed = {p.metadata.labels["ddpjob.dev/rank"]: p.spec.node_name for p in pods}
    assert sorted(placed.values()) == sorted(n.name for n in box.nodes), f"one rank per node: {placed}"

    core.delete_namespaced_pod("spread-2", namespace)  # a rank lost: the gang restarts and resumes from the claim

    def resumed() -> list[str]:
        lines = [text for n in box.nodes for _, _, _, text in pod_lines(n.layout.pod_logs, namespace, "spread")]
        return [text for text in lines if "resumed from step" in text]

    said = wait_for("the next attempt to resume from the claim", resumed, 300, seen=status)
    assert all(int(text.split("resumed from step ")[1].split()[0]) >= saved for text in said), said
    final = wait_for("the job to end", lambda: (s := status()).get("phase") in ("Succeeded", "Failed") and s, 600)
    assert final["phase"] == "Succeeded", final
    assert final["restarts"] == 1 and final["progress"]["step"] == STEPS, final
    assert operator.alive() and operator.errors() == []


@pytest.mark.parametrize(
    ("index", "fault", "rank", "steps"), [(0, "power", 1, STEPS), (1, "power", 0, STEPS), (2, "network", 0, 2 * STEPS)]
)
def test_a_cut_node_under_a_running_gang_costs_one_restart_naming_it_and_nothing_else(
    three_nodes: Box,
    api_client: Any,
    namespace: str,
    operator: OperatorProcess,
    index: int,
    fault: str,
    rank: int,
    steps: int,
) -> None:
    """Rank 0's node is MASTER_ADDR's. After the network cut, the cut rank's old pod runs on: it logs no step and
    writes no checkpoint once the next attempt trains (the fence), and no pod of the job is left on the node once
    its network is back. A network cut's gang trains on until the node is NotReady (20 s): its job has more steps,
    so that the next attempt still has some to train (a run of 200 ended 7 s into its next attempt)."""
    trial = Trial(three_nodes, api_client, namespace, index, fault, rank=rank, steps=steps).run()
    assert kept_its_promises(trial), trial
    assert operator.alive() and operator.errors() == []


SIGBUS_ON_MARKED_NODE = """
python -m ddp_trainer "$@" &
child=$!
(while kill -0 "$child" 2>/dev/null; do
   if [ -e "$CHECKPOINT_DIR/sick-$NODE_NAME" ]; then kill -BUS "$child"; fi; sleep 1
 done) &
wait "$child"
"""
"""The trainer, SIGBUSed (exit 135) while its node is marked sick in the shared claim: a machine that faults under
whatever runs on it. The shell is PID 1: a signal it sent itself would be ignored, so it signals its child."""


def test_a_sick_node_is_left_and_excluded_and_a_gang_with_nowhere_left_says_so_until_cleared(
    three_nodes: Box, api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    """Rank 1's node faults the trainer with SIGBUS twice in a row: the gang leaves it, excluding it (NodeUnhealthy).
    Then the node under rank 1 again is tainted unhealthy: the gang leaves that one too, and with two of three nodes
    excluded, its two ranks (one per node) have nowhere to run: its Running condition says Unschedulable and names the
    excluded nodes. Cleared as docs/reference.md says (the taint removed, status.excludedNodes emptied), it runs to
    the end."""
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    core.create_namespaced_persistent_volume_claim(namespace, shared_claim("sick-ckpt"))
    body = job_body("sick", "sick-ckpt", steps=2 * STEPS)  # a run of 200 ended before its second move
    body["spec"]["runPolicy"]["backoffLimit"] = 6
    trainer = body["spec"]["template"]["spec"]["containers"][0]
    trainer["command"] = ["sh", "-c", SIGBUS_ON_MARKED_NODE, "sick"]
    trainer["env"] = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    status = lambda: _status(custom, namespace, "sick")  # noqa: E731

    def rank_node(rank: int) -> str | None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"ddpjob.dev/job-name=sick,ddpjob.dev/rank={rank}")
        running = [p for p in pods.items if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return running[0].spec.node_name if running and status().get("phase") == "Running" else None

    def excluded() -> dict[str, str]:
        return {e["name"]: e["reason"] for e in status().get("excludedNodes") or []}

    wait_for("the job to run", lambda: rank_node(1), 300, seen=status)
    wait_for("a checkpoint", lambda: (status().get("lastCheckpoint") or {}).get("step"), 120, seen=status)
    faulty = rank_node(1)
    assert faulty is not None
    claim = core.read_namespaced_persistent_volume_claim("sick-ckpt", namespace)
    directory = core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path
    marker = Path(directory) / f"sick-{faulty}"  # the claim's directory is the host's, as every node's mount
    marker.touch()
    wait_for(f"{faulty} excluded", lambda: excluded().get(faulty) == "NodeUnhealthy" or None, 300, seen=status)
    entry = next(e for e in status()["excludedNodes"] if e["name"] == faulty)
    assert "SIGBUS" in entry["message"], entry
    marker.unlink()

    tainted = wait_for("rank 1 on another node", lambda: (n := rank_node(1)) and n != faulty and n, 300, seen=status)
    cut_node(core, three_nodes.node_named(tainted), "taint")
    try:

        def nowhere() -> str | None:
            running = next((c for c in status().get("conditions") or [] if c["type"] == "Running"), {})
            return running.get("message") if running.get("reason") == "Unschedulable" else None

        said = wait_for("the gang to say it cannot be placed", nowhere, 300, seen=status)
        assert excluded() == {faulty: "NodeUnhealthy", tainted: "NodeUnhealthy"}, status()
        assert "this job excludes" in said and faulty in said and tainted in said, said
    finally:
        bring_back_node(core, three_nodes.node_named(tainted), "taint")
    clear = {"status": {"excludedNodes": None}}  # docs/reference.md's kubectl patch, as a merge patch
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "sick", clear)
    final = wait_for("the job to end", lambda: (s := status()).get("phase") in ("Succeeded", "Failed") and s, 600)
    assert final["phase"] == "Succeeded" and final["progress"]["step"] == 2 * STEPS, final
    assert operator.alive() and operator.errors() == []
