"""Simulated nodes: KWOK's controller, run against the box's apiserver, keeps ``count`` Node objects alive and moves
the pods bound to them through KWOK's stages (created, Running, Succeeded after a delay each pod may choose,
deleted), so the real scheduler, controller-manager, Kueue and the operator see a cluster of GPU hosts.

Each node is an 8-GPU host (``nvidia.com/gpu``, CPU and memory to match) in the box's racks and blocks, tainted
``kwok.x-k8s.io/node=fake:NoSchedule`` so that only pods that tolerate it land there (a Kueue ResourceFlavor's
tolerations, for example): the real nodes keep the box's own pods. The stages are KWOK's own "general" set, read
from its module; a pod lasts ``pod-complete.stage.kwok.x-k8s.io/delay`` (its annotation, a Go duration) once
Running, then Succeeds, every container exiting 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddpjob_box import toolchain
from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.processes import Component, wait_until
from ddpjob_box.topology import POOL_LABEL, Level, node_labels

NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""KWOK manages the nodes that carry this annotation (value ``fake``), and no other: never the box's real ones."""
TAINT = {"key": NODE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
GPU = "nvidia.com/gpu"
CAPACITY = {"cpu": "96", "memory": "768Gi", "pods": "110", GPU: "8", "ephemeral-storage": "1Ti"}
"""A GPU host: 8 GPUs, 12 cores and 96 GiB each."""
NODE_PREFIX = "kwok-node-"
RUN_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
"""On a pod: how long it runs once Running before it Succeeds, a Go duration ("60s"); KWOK's default otherwise."""
POD_CIDR = "10.250.0.0/16"
"""The simulated pods' addresses (never routed): away from the real nodes' 10.244.0.0/16."""
STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/general/pod-create.yaml",
    "pod/general/pod-init-container-running.yaml",
    "pod/general/pod-init-container-completed.yaml",
    "pod/general/pod-ready.yaml",
    "pod/general/pod-complete.yaml",
    "pod/general/pod-delete.yaml",
)
OWNER_KINDS_THAT_COMPLETE = ("Job", "DDPJob", "PyTorchJob")
"""Pods of these owners Succeed after their delay (KWOK's stage completes a Job's pods only; a DDPJob's rank pods
finish too, as a training run does, and so do a PyTorchJob's, for ``bench.scale``'s other side)."""


CONFIGURATION: dict[str, Any] = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    "options": {
        "podPlayStageParallelism": 32,
        "nodePlayStageParallelism": 4,
        "nodeLeaseParallelism": 8,
        "podsOnNodeSyncParallelism": 1,
        "manageAllNodes": False,
        "enableDebuggingHandlers": True,
        "enableProfilingHandler": True,
        "enableContentionProfiling": False,
        "enablePodsOnNodeSyncListPager": True,
        "enablePodsOnNodeSyncStreamWatch": False,
    },
}
"""KWOK plays 4 pod stages at a time by default: about 10 status patches a second here, so that 400 admitted pods
waited minutes to turn Ready and Kueue evicted their jobs for PodsReadyTimeout (``bench.scale``). A configuration
read from a file gets none of KWOK's defaults (v0.8.0 exited: "playStageParallelism must be greater than 0"), so
each option is given: KWOK's defaults, but for the pod stages and node leases (8, from 4: 250 nodes' leases)."""


def stages(module: Path) -> str:
    """KWOK's configuration, then its general stages as its module ships them, with DDPJob's pods among those that
    complete."""
    documents: list[dict[str, Any]] = [CONFIGURATION]
    for name in STAGES:
        stage = yaml.safe_load((module / "kustomize" / "stage" / name).read_text())
        for expression in (stage.get("spec") or {}).get("selector", {}).get("matchExpressions") or []:
            if expression.get("key") == ".metadata.ownerReferences.[].kind":
                expression["values"] = list(OWNER_KINDS_THAT_COMPLETE)
        documents.append(stage)
    return yaml.safe_dump_all(documents, sort_keys=False)


KUBELET_FEATURES = (
    "ExtendWebSocketsToKubelet",
    "InPlacePodLevelResourcesVerticalScaling",
    "InPlacePodVerticalScalingInitContainers",
    "RestartAllContainersOnContainerExits",
)
"""What the box's kubelet (v1.37) declares in ``status.declaredFeatures``, when no real node is there to read it from:
the scheduler places a pod that needs one (the operator's in-place restart rules need RestartAllContainers...) only
on a node that declares it."""


def node(index: int, labels: dict[str, str], features: tuple[str, ...] = KUBELET_FEATURES) -> dict[str, Any]:
    """Simulated node ``index``, created with its capacity and the kubelet's declared features (KWOK keeps what a
    node has), not yet Ready (KWOK's initialize stage makes it so)."""
    name = f"{NODE_PREFIX}{index}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": [TAINT]},
        "status": {"capacity": dict(CAPACITY), "allocatable": dict(CAPACITY), "declaredFeatures": list(features)},
    }


@dataclass
class SimulatedNodes:
    plane: ControlPlane
    directory: Path
    count: int
    topology: tuple[Level, ...] = ()
    controller: Component | None = None
    names: list[str] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.plane.logs_dir / "kwok.log"

    def start(self) -> None:
        """Build (or find) KWOK, write its stages, start it, create the nodes and wait until every one is Ready."""
        from kubernetes import client, config

        binary = toolchain.ensure(toolchain.kwok_build())["kwok"]
        module = toolchain.go_module_dir("kwok", "sigs.k8s.io/kwok", toolchain.kwok_version())
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "stages.yaml").write_text(stages(module))
        self.controller = Component(
            "kwok",
            [
                str(binary),
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--config={self.directory / 'stages.yaml'}",
                f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                f"--cidr={POD_CIDR}",
            ],
            self.log_path,
            # its own work directory: KWOK reads ~/.kwok/kwok.yaml first when one exists
            env={**os.environ, "KWOK_WORKDIR": str(self.directory)},
        )
        self.controller.start()
        # their racks and blocks, but not the real nodes' pool, which the box's topology flavor selects
        places = node_labels(self.topology, self.count)
        labels = [{k: v for k, v in place.items() if k != POOL_LABEL} for place in places]
        with config.new_client_from_config(config_file=str(self.plane.kubeconfig)) as api:
            core = client.CoreV1Api(api)
            features = self._kubelet_features(core)
            for index in range(self.count):
                body = node(index, labels[index], features)
                core.create_node(body)
                self.names.append(body["metadata"]["name"])
            wait_until(
                f"{self.count} simulated nodes to be Ready", lambda: self._all_ready(core), 120, watch=[self.controller]
            )

    @staticmethod
    def _kubelet_features(core: Any) -> tuple[str, ...]:
        """The features the box's real kubelets declare (a simulated host claims the same kubelet), else
        KUBELET_FEATURES."""
        real = core.list_node(label_selector="type!=kwok").items
        declared = sorted({f for n in real for f in (n.status.declared_features or [])})
        return tuple(declared) or KUBELET_FEATURES

    def _all_ready(self, core: Any) -> bool:
        nodes = core.list_node(label_selector="type=kwok").items
        ready = [n for n in nodes if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
        return len(ready) >= self.count

    def stop(self) -> None:
        """KWOK stops; the nodes go with the control plane (or stay, NotReady, in a kept data directory)."""
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
