"""The whole box: control plane, local node and Prometheus, started and stopped as one."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.node.network import Bridge, pick_subnet
from ddpjob_box.node.provisioner import storage_class
from ddpjob_box.node.teardown import record_node, teardown
from ddpjob_box.processes import Component, tail, wait_until
from ddpjob_box.prometheus import Prometheus

NODE_NAME = "box-node"
KUBELET_NODE_NAME = "box-kubelet"


@dataclass
class LocalNode:
    """The node agent as a child process, plus what it needs to be restarted and torn down."""

    plane: ControlPlane
    state_dir: Path
    bridge: Bridge
    netns_prefix: str
    component: Component | None = None

    @property
    def targets_file(self) -> Path:
        return self.state_dir / "targets.json"

    def start(self) -> None:
        if os.geteuid() != 0:
            raise BoxError("the local node needs root for network namespaces: run as root (sudo make ...)")
        record_node(self.state_dir, self.bridge, self.netns_prefix)
        self.component = Component(
            "node",
            [
                sys.executable,
                "-m",
                "ddpjob_box.node.agent",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--name={NODE_NAME}",
                f"--state-dir={self.state_dir}",
                f"--bridge={self.bridge.name}",
                f"--subnet={self.bridge.subnet}",
                f"--netns-prefix={self.netns_prefix}",
                f"--owner-pid={os.getpid()}",
                f"--apiserver-port={self.plane.apiserver_port}",
                f"--ca-file={self.plane.ca_file}",
            ],
            self.plane.logs_dir / "node.log",
        )
        self.component.start()
        wait_until(
            "the local node to register",
            lambda: f"node {NODE_NAME} ready" in _read(self.component),
            60,
            watch=[self.component],
        )

    def restart(self) -> None:
        """Stop and start the agent alone; the pods' processes keep running under their shims."""
        if self.component:
            self.component.stop()
        self.start()

    def stop(self) -> None:
        if self.component:
            self.component.stop()
        teardown(self.state_dir, self.bridge, self.netns_prefix)

    def pod_dir(self, uid: str) -> Path:
        return self.state_dir / "pods" / uid


def _read(component: Component | None) -> str:
    return tail(component.log_path, 200) if component else ""


@dataclass
class Box:
    data_dir: Path
    with_node: bool = True
    with_prometheus: bool = True
    apiserver_port: int | None = None
    reset: bool = False
    box_id: str = field(default_factory=lambda: secrets.token_hex(3))
    bridge: Bridge | None = None
    plane: ControlPlane | None = None
    node: LocalNode | None = None
    # The real node (kubelet, containerd, runc), opt-in beside the process node until the box switches to it.
    kubelet_node: KubeletNode | None = None
    prometheus: Prometheus | None = None

    def __enter__(self) -> Box:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        # The bridge is chosen first: the apiserver's certificate must name its gateway, where pods reach it.
        self.bridge = Bridge(f"ddpj{self.box_id}", pick_subnet(int(self.box_id, 16) % 256))
        self.plane = ControlPlane(
            data_dir=self.data_dir,
            apiserver_port=self.apiserver_port,
            reset=self.reset,
            extra_ips=(self.bridge.gateway,),
        )
        try:
            self.plane.start()
            if self.with_node:
                self.start_node()
            if self.with_prometheus:
                assert self.node is not None, "Prometheus scrapes the targets the local node lists"
                self.prometheus = Prometheus(self.data_dir / "prometheus", self.node.targets_file)
                self.prometheus.start()
        except BaseException:
            self.stop()
            raise

    def start_node(self) -> LocalNode:
        """Start the local node; tests that drive pod status by hand run before any node exists."""
        assert self.plane is not None and self.bridge is not None
        if self.node is None:
            self.node = LocalNode(self.plane, self.data_dir / "node", self.bridge, f"ddpj-{self.box_id}-")
            self.ensure_storage_class(storage_class())
            self.node.start()
        return self.node

    def start_kubelet_node(self, *, images: Sequence[str] = (), taints: tuple[str, ...] = ()) -> KubeletNode:
        """Start the box's kubelet node on first use. It runs the local base image and ``images`` (local
        names, imported into its containerd), and only pods that tolerate ``taints``."""
        from ddpjob_box import images as local_images

        assert self.plane is not None
        if self.kubelet_node is None:
            node = KubeletNode(
                plane=self.plane,
                directory=self.data_dir / "kubenode",
                name=KUBELET_NODE_NAME,
                bridge=f"kn{self.box_id}",
                # away from the process node's /24, which is picked from the same id
                subnet=pick_subnet(int(self.box_id, 16) % 256 + 128),
                sandbox_image=local_images.ensure_pause(),
                importer=local_images.import_into_containerd,
                images=[local_images.ensure_base(), *images],
                taints=taints,
            )
            node.start()
            self.kubelet_node = node
        return self.kubelet_node

    def stop_kubelet_node(self) -> None:
        if self.kubelet_node:
            self.kubelet_node.stop()
            self.kubelet_node = None

    def ensure_storage_class(self, body: dict[str, Any]) -> None:
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException

        assert self.plane is not None
        with config.new_client_from_config(config_file=str(self.plane.kubeconfig)) as api:
            try:
                client.StorageV1Api(api).create_storage_class(body)
            except ApiException as err:
                if err.status != 409:
                    raise

    def log_tails(self) -> str:
        parts = [self.plane.log_tails()] if self.plane else []
        if self.node and self.node.component:
            parts.append(f"--- node ({self.node.component.log_path}):\n{tail(self.node.component.log_path)}")
        if self.kubelet_node:
            parts.append(self.kubelet_node.log_tails())
        return "\n".join(parts)

    def stop(self) -> None:
        if self.prometheus:
            self.prometheus.stop()
        if self.node:
            self.node.stop()
        self.stop_kubelet_node()
        if self.plane:
            self.plane.stop()
