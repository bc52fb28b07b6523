"""The whole box: control plane, a real node (kubelet with containerd), Prometheus and, when asked, Kueue,
started and stopped as one."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from ddpjob_box import images as local_images
from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.kubenode.subnet import pick_subnet
from ddpjob_box.kueue import Kueue
from ddpjob_box.kwok import SimulatedNodes
from ddpjob_box.processes import Component
from ddpjob_box.prometheus import Prometheus
from ddpjob_box.provisioner import SHARED_STORAGE_CLASS, STORAGE_CLASS, storage_class
from ddpjob_box.topology import Level, node_labels, resource_flavor, topology_object

NODE_NAME = "box-node"
SLOT_RESOURCE = "example.com/slot"
"""An extended resource the box's node advertises, as a device plugin would: for scheduling tests and demos."""
DEFAULT_SLOTS = 4
KUEUE_SLOTS = 8
"""With Kueue, the node has more slots than the tests' ClusterQueues grant (4): Kueue's quota, not the scheduler,
is then what holds a job back."""


@dataclass
class Box:
    data_dir: Path
    with_node: bool = True
    with_prometheus: bool = True
    # Kueue from its own chart, its manager on the node (ddpjob_box.kueue); needs the node
    with_kueue: bool = False
    # SLOT_RESOURCE on the node: DEFAULT_SLOTS, or KUEUE_SLOTS with Kueue
    slots: int | None = None
    # Nodes: the first one runs kube-proxy and the box's one CoreDNS; the others, named box-node-1..., use them
    node_count: int = 1
    # KWOK's simulated GPU hosts (ddpjob_box.kwok), beside the real nodes, in the same racks and blocks
    simulated_nodes: int = 0
    kueue_pods_ready_timeout: str = ""
    """Kueue's waitForPodsReady timeout, when not the box's 60 s (``bench.scale``: Kueue's own 5m)."""
    # The nodes' places in racks and blocks (``--topology``, ddpjob_box.topology); with Kueue, its Topology too
    topology: tuple[Level, ...] = ()
    # kube-proxy on the first node (ClusterIP Services); False: none, so another box on the host may run one
    with_proxy: bool = True
    # Flags of the controller-manager (a shorter --node-monitor-grace-period for node-loss tests, as kind users do)
    controller_manager_args: Sequence[str] = ()
    apiserver_port: int | None = None
    reset: bool = False
    # the apiserver audits every request of the clients outside the control plane (ddpjob_box.audit), for benchmarks
    audit_requests: bool = False
    # service accounts (namespace:name) whose every request is audited too (an operator run from its chart)
    audit_accounts: tuple[str, ...] = ()
    box_id: str = field(default_factory=lambda: secrets.token_hex(3))
    plane: ControlPlane | None = None
    node: KubeletNode | None = None
    extra_nodes: list[KubeletNode] = field(default_factory=list)
    provisioner: Component | None = None
    simulated: SimulatedNodes | None = None
    prometheus: Prometheus | None = None
    kueue: Kueue | None = None
    # Nodes started so far: each gets its own bridge and /24. A node started where an earlier one of this box
    # ran, on the same gateway, left pods unable to reach kubernetes.default.svc (connections timed out).
    nodes_started: int = 0

    def __enter__(self) -> Box:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        if self.with_kueue and not self.with_node:
            raise BoxError("Kueue runs on the box's node: drop --no-node to use --kueue")
        node_labels(self.topology, self.node_count)  # a topology the nodes cannot fill is refused before anything
        self.plane = ControlPlane(
            data_dir=self.data_dir,
            apiserver_port=self.apiserver_port,
            reset=self.reset,
            audit_requests=self.audit_requests,
            audit_accounts=self.audit_accounts,
            extra_args={"kube-controller-manager": list(self.controller_manager_args)},
        )
        try:
            self.plane.start()
            if self.with_node:
                kueue_image = [local_images.ensure_kueue()] if self.with_kueue else []
                shipped = [*local_images.shipped_images(), *kueue_image]
                self.start_nodes(self.node_count, images=shipped, slots=self.node_slots(), proxy=self.with_proxy)
            if self.simulated_nodes:
                self.start_simulated_nodes()
            if self.with_kueue:
                self.start_kueue()
            if self.with_prometheus:
                self.start_prometheus()
        except BaseException:
            self.stop()
            raise

    def node_slots(self) -> int:
        if self.slots is not None:
            return self.slots
        return KUEUE_SLOTS if self.with_kueue else DEFAULT_SLOTS

    def start_node(
        self,
        *,
        images: Sequence[str] = (),
        taints: tuple[str, ...] = (),
        slots: int = DEFAULT_SLOTS,
        proxy: bool = True,
        cuttable: bool = False,
        labels: dict[str, str] | None = None,
    ) -> KubeletNode:
        """Start the box's node on first use: kubelet, containerd and runc, running the local base image and
        ``images`` (built locally, imported into its containerd), and only pods that tolerate ``taints``.
        It advertises ``slots`` of SLOT_RESOURCE, an extended resource for scheduling tests (not a GPU).
        ``proxy`` False: no kube-proxy, so no ClusterIP Service works, and another box's node may run one."""
        assert self.plane is not None
        if self.node is None:
            node = KubeletNode(
                plane=self.plane,
                directory=self.data_dir / "kubenode",
                name=NODE_NAME,
                bridge=f"kn{self.box_id}{self.nodes_started}",
                subnet=pick_subnet(int(self.box_id, 16) % 256 + 16 * self.nodes_started),
                sandbox_image=local_images.ensure_pause(),
                importer=local_images.import_into_containerd,
                images=[local_images.ensure_base(), *images],
                taints=taints,
                labels=labels if labels is not None else node_labels(self.topology, self.node_count)[0],
                extended_resources={SLOT_RESOURCE: slots},
                with_proxy=proxy,
                cuttable=cuttable,
            )
            self.nodes_started += 1
            node.start()
            self.node = node
            self._start_provisioner()
        return self.node

    @property
    def nodes(self) -> list[KubeletNode]:
        """Every node started, the first one first."""
        return [*([self.node] if self.node else []), *self.extra_nodes]

    def node_named(self, name: str) -> KubeletNode:
        found = [n for n in self.nodes if n.name == name]
        if not found:
            raise BoxError(f"the box has no node {name}: it has {', '.join(n.name for n in self.nodes) or 'none'}")
        return found[0]

    def start_nodes(
        self,
        count: int,
        *,
        images: Sequence[str] = (),
        taints: tuple[str, ...] = (),
        slots: int = DEFAULT_SLOTS,
        proxy: bool = True,
    ) -> list[KubeletNode]:
        """The box's nodes, started one after another until there are ``count``: the first as ``start_node``; each
        other named ``box-node-<i>``, with its own kubelet, containerd, cgroup root, bridge and /24, no kube-proxy
        or CoreDNS of its own (the first one's serve the box), and a kubelet link a test can cut (``cut_network``).
        Pods on different nodes reach each other through the host's routes between the bridges."""
        labels = node_labels(self.topology, count)
        first = self.start_node(
            images=images, taints=taints, slots=slots, proxy=proxy, cuttable=count > 1, labels=labels[0]
        )
        while len(self.nodes) < count:
            index = len(self.nodes)
            node = KubeletNode(
                plane=first.plane,
                directory=self.data_dir / f"kubenode-{index}",
                name=f"{NODE_NAME}-{index}",
                bridge=f"kn{self.box_id}{self.nodes_started}",
                subnet=pick_subnet(int(self.box_id, 16) % 256 + 16 * self.nodes_started),
                sandbox_image=first.sandbox_image,
                importer=first.importer,
                images=first.images,
                taints=taints,
                labels=labels[index],
                extended_resources={SLOT_RESOURCE: slots},
                with_dns=False,
                with_proxy=False,
                cluster_dns=first.gateway,
                cuttable=True,
            )
            self.nodes_started += 1
            self.extra_nodes.append(node)  # before it starts: a half-started node is still stopped with the box
            node.start()
        return self.nodes

    def _start_provisioner(self) -> None:
        """The default StorageClass's provisioner: hostPath directories under the data directory."""
        assert self.plane is not None
        if self.provisioner is None:
            self.ensure_storage_class(storage_class(STORAGE_CLASS))
            self.ensure_storage_class(storage_class(SHARED_STORAGE_CLASS))
            self.provisioner = Component.box_module(
                "provisioner",
                "ddpjob_box.provisioner",
                [str(self.plane.kubeconfig), str(self.data_dir / "claims")],
                self.plane.logs_dir / "provisioner.log",
            )
            self.provisioner.start()

    def start_simulated_nodes(self) -> SimulatedNodes:
        """KWOK and its ``simulated_nodes`` GPU hosts, Ready."""
        assert self.plane is not None
        if self.simulated is None:
            simulated = SimulatedNodes(self.plane, self.data_dir / "kwok", self.simulated_nodes, self.topology)
            self.simulated = simulated  # before it starts: a half-started KWOK is still stopped with the box
            simulated.start()
        return self.simulated

    def start_kueue(self) -> Kueue:
        """Install Kueue from its chart, its manager on the box's node from the locally built image, and wait
        until it is ready (``Box.kueue.stop()`` and ``.start()`` then take it down and up again for tests)."""
        assert self.plane is not None
        if self.kueue is None:
            node = self.node or self.start_node(images=local_images.shipped_images(), slots=self.node_slots())
            started = time.monotonic()
            image = local_images.ensure_kueue()
            if local_images.import_into_containerd(image, node.layout.containerd_socket, node.layout.containerd_root):
                print(f"kueue: imported {image} into the node ({time.monotonic() - started:.0f}s)", flush=True)
            kueue = Kueue(
                kubeconfig=self.plane.kubeconfig,
                image=image,
                node=node.name,
                workdir=self.data_dir / "kueue",
                pods_ready_timeout=self.kueue_pods_ready_timeout,
            )
            # Set before the install: a half-done install is still ours to report on.
            self.kueue = kueue
            kueue.install()
            if self.topology:
                objects = [topology_object(self.topology), resource_flavor()]
                kueue.apply(yaml.safe_dump_all(objects))
        return self.kueue

    def stop_extra_nodes(self) -> None:
        """Stop every node but the first, the last started first; each leaves the apiserver (its Node deleted)."""
        while self.extra_nodes:
            self.extra_nodes.pop().stop()

    def stop_node(self) -> None:
        """Stop every node, the first (which serves the others' DNS and Services) last."""
        self.stop_extra_nodes()
        if self.node:
            self.node.stop()
            self.node = None

    def start_prometheus(self) -> Prometheus:
        """A real Prometheus that finds the training pods through the apiserver, as the chart's PodMonitor."""
        assert self.plane is not None
        if self.prometheus is None:
            prometheus = Prometheus(self.data_dir / "prometheus", self.plane.kubeconfig)
            prometheus.start()
            self.prometheus = prometheus
        return self.prometheus

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
        parts += [node.log_tails() for node in self.nodes]
        if self.kueue and self.kueue.installed:
            parts.append(f"--- kueue manager (kubectl logs):\n{self.kueue.log_tail()}")
        return "\n".join(parts)

    def stop(self) -> None:
        for component in (self.prometheus, self.provisioner, self.simulated):
            if component:
                component.stop()
        # Kueue's objects live in the plane's etcd and its pod on the node: both go below.
        self.kueue = None
        self.stop_node()
        if self.plane:
            self.plane.stop()
