"""The box's simulated nodes (ddpjob_box.kwok), as data: each node's shape, and KWOK's stages as read from its
module with DDPJob's pods among those that complete. KWOK running them is tests/kueue/test_simulated.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from ddpjob_box.kwok import GPU, NODE_ANNOTATION, STAGES, TAINT, node, stages


def test_a_simulated_node_is_an_8_gpu_host_kwok_manages_tainted_away_from_real_pods_and_not_yet_ready() -> None:
    body = node(3, {"topology.ddpjob.dev/rack": "rack-1"})
    assert body["metadata"]["name"] == "kwok-node-3"
    assert body["metadata"]["annotations"][NODE_ANNOTATION] == "fake"
    assert body["metadata"]["labels"]["topology.ddpjob.dev/rack"] == "rack-1"
    assert body["metadata"]["labels"]["kubernetes.io/hostname"] == "kwok-node-3"
    assert body["spec"]["taints"] == [TAINT]
    assert body["status"]["allocatable"][GPU] == "8" and "conditions" not in body["status"], "KWOK makes it Ready"
    assert "RestartAllContainersOnContainerExits" in body["status"]["declaredFeatures"], "the scheduler needs it"


def test_the_stages_are_kwoks_own_with_ddpjob_pods_completing_like_a_jobs(tmp_path: Path) -> None:
    for name in STAGES:
        path = tmp_path / "kustomize" / "stage" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        selector = [{"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}]
        stage = {"kind": "Stage", "metadata": {"name": path.stem}, "spec": {"selector": {"matchExpressions": selector}}}
        path.write_text(yaml.safe_dump(stage))
    configuration, *read = yaml.safe_load_all(stages(tmp_path))
    assert configuration["kind"] == "KwokConfiguration" and configuration["options"]["podPlayStageParallelism"] > 4
    assert [s["metadata"]["name"] for s in read] == [Path(n).stem for n in STAGES]
    kinds = read[STAGES.index("pod/general/pod-complete.yaml")]["spec"]["selector"]["matchExpressions"][0]["values"]
    assert kinds == ["Job", "DDPJob", "PyTorchJob"]
