"""A real node: containerd with runc, a CNI bridge, and kubelet registered with the box's apiserver.

Start order: snapshot the host, make the bridge (kubelet's node IP must be on an
interface before it starts), containerd, the images it runs, the CNI network,
then kubelet. Stop order is the reverse, and kubelet does not drain pods when it
stops, so the node kills what runs in its pods' cgroups and the containerd shims
itself, then puts the host back as the snapshot found it.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from ddpjob_box import toolchain
from ddpjob_box.controlplane import SERVICE_CIDR, ControlPlane
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode import hoststate, store
from ddpjob_box.kubenode.configs import (
    KUBELET_SOCKET,
    SOCKETS_ROOT,
    KubeletSettings,
    NodeLayout,
    cni_conflist,
    corefile,
    kube_proxy_configuration,
    kubeconfig,
    kubelet_configuration,
    to_json,
)
from ddpjob_box.kubenode.containerd import Importer, start_containerd
from ddpjob_box.kubenode.leftovers import (
    HOST_RECORD,
    RECORD,
    cgroup_pids,
    kill_pods,
    live_nodes,
    processes,
    remove_containers,
    restore,
)
from ddpjob_box.pki import issue_cert
from ddpjob_box.ports import free_port
from ddpjob_box.processes import Component, Supervisor, children, tail, wait_until

# The tenth address of the service range, as kubeadm gives CoreDNS.
CLUSTER_DNS = str(ipaddress.IPv4Network(SERVICE_CIDR).network_address + 10)
SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
# Held by the node that runs kube-proxy, for as long as it runs: Service rules are host-wide (kube-proxy rewrites
# the KUBE-SERVICES chain with its own cluster's Services), so a second box's kube-proxy would send this box's
# pods to the other box's apiserver (seen: "x509: certificate signed by unknown authority" in Kueue's pod).
PROXY_LOCK = SOCKETS_ROOT / "kube-proxy.lock"


@dataclass
class KubeletNode:
    plane: ControlPlane
    directory: Path
    name: str
    bridge: str
    subnet: ipaddress.IPv4Network
    sandbox_image: str
    importer: Importer
    images: Sequence[str] = ()
    taints: tuple[str, ...] = ()
    # Labels the kubelet registers the node with (its place in the box's topology: ddpjob_box.topology)
    labels: Mapping[str, str] = field(default_factory=dict)
    # Extended resources the node advertises (e.g. {"example.com/slot": 4}), as a device plugin would
    extended_resources: Mapping[str, int] = field(default_factory=dict)
    # CoreDNS on the bridge address, named in kubelet's clusterDNS, so pods resolve services and pods by name
    with_dns: bool = True
    # kube-proxy, plus a forwarder from the bridge to the apiserver, so pods reach kubernetes.default.svc
    with_proxy: bool = True
    # Another node's CoreDNS (its gateway) for the pods, where this node runs none: one CoreDNS for the whole box
    cluster_dns: str = ""
    # The kubelet reaches the apiserver through a forwarder of its own, which ``cut_network`` stops (and drops the
    # pods' packets to the apiserver): a partition from the control plane, its pods still reaching each other
    cuttable: bool = False
    kubelet_link: Component | None = None
    coredns: Component | None = None
    kube_proxy: Component | None = None
    api_forwarder: Component | None = None
    containerd: Component | None = None
    kubelet: Component | None = None
    # Starts each of the components above again when it exits on its own, as systemd restarts a real node's
    # kubelet and containerd, and kubelet its CoreDNS and kube-proxy pods (said in the plane's ``restarted``)
    supervisor: Supervisor | None = None
    before: hoststate.HostState | None = None
    # containerd's image store, leased from the cache while the node runs (kubenode.store)
    lease: store.StoreLease | None = None
    proxy_lock: IO[str] | None = None
    # What restore could not undo at the last stop; empty when the host is as it was.
    leftovers: list[str] = field(default_factory=list)

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.directory, self.lease.path if self.lease else self.directory / "containerd" / "root")

    @property
    def cgroup_root(self) -> str:
        # named by the bridge, which is unique per box: two boxes on one host both call their node box-node
        return f"/{hoststate.CGROUP_PREFIXES[1]}{self.bridge}"

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def start(self) -> None:
        if os.geteuid() != 0:
            raise BoxError("a kubelet node needs root (cgroups, mounts, network): run as root (sudo make ...)")
        for tool, package in (("containerd", "containerd"), ("runc", "runc"), ("ip", "iproute2")):
            if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
                raise BoxError(f"{tool} is missing: run 'apt-get install -y {package}' (or 'make system-packages')")
        if not Path("/usr/lib/cni/bridge").exists():
            raise BoxError("the CNI plugins are missing: run 'apt-get install -y containernetworking-plugins'")
        longest = self.layout.kubelet_root / KUBELET_SOCKET
        if len(str(longest)) > 107:
            raise BoxError(
                f"the data directory's path is too long for kubelet's unix sockets ({longest} has "
                f"{len(str(longest))} bytes, the limit is 107): choose a shorter --data-dir"
            )
        if self.with_proxy:
            self.proxy_lock = claim_service_rules(self.directory)
        bins = toolchain.ensure(toolchain.kubernetes_node_build())
        if self.with_dns:
            bins |= toolchain.ensure(toolchain.coredns_build())
        self.directory.mkdir(parents=True, exist_ok=True)
        self.before = hoststate.snapshot(self.directory, self.bridge)
        self.lease = store.lease()
        # Written before anything changes the host, so a box killed outright can still be undone (recover).
        (self.directory / RECORD).write_text(
            json.dumps(
                {
                    "bridge": self.bridge,
                    "cgroup_root": self.cgroup_root,
                    "store": str(self.lease.path),
                    "before": asdict(self.before),
                }
            )
        )
        if not live_nodes(self.layout) or not HOST_RECORD.exists():
            # the first node on the host keeps the host's state for the last one to stop
            SOCKETS_ROOT.mkdir(parents=True, exist_ok=True)
            HOST_RECORD.write_text(json.dumps(asdict(self.before)))
        try:
            self._make_bridge()
            if self.with_dns:
                self._start_coredns(bins["coredns"])
            self._start_containerd()
            if self.lease.dirty:
                self._purge_store()
            for image in dict.fromkeys([self.sandbox_image, *self.images]):
                self.importer(image, self.layout.containerd_socket, self.layout.containerd_root)
            self._write_cni()
            self._start_kubelet(bins["kubelet"])
            if self.with_proxy:
                self._start_kube_proxy(bins["kube-proxy"])
        except BaseException:
            self.stop()
            raise
        self.supervisor = Supervisor(self.components, self.plane.say_restarted)

    @property
    def components(self) -> list[Component]:
        """The node's processes that are started: each of them serves until the node stops."""
        found = (self.coredns, self.containerd, self.kubelet_link, self.kubelet, self.kube_proxy, self.api_forwarder)
        return [c for c in found if c]

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC, fixed and locally administered. Left to the kernel, a bridge takes the lowest
        MAC of its ports, so it changed as pods came and went; every pod's ARP entry for the gateway then
        pointed at a MAC nobody had, and traffic to the host (polls' answers, CoreDNS, the apiserver) was
        lost for up to a minute, until the entry expired (the chaos soak's polls timed out so)."""
        digest = hashlib.sha256(self.bridge.encode()).digest()
        return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))

    def _make_bridge(self) -> None:
        # The CNI bridge plugin would make it at the first pod, but kubelet needs its node IP on an interface.
        _ip("link", "add", self.bridge, "address", self.bridge_mac, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _start_coredns(self, binary: Path) -> None:
        health, ready = free_port(), free_port()
        path = self.directory / "Corefile"
        path.write_text(corefile(self.gateway, health, ready, self.plane.kubeconfig))
        self.coredns = Component(
            "coredns", [str(binary), "-conf", str(path)], self.plane.logs_dir / f"coredns-{self.name}.log"
        )
        self.coredns.start()
        wait_until("CoreDNS /ready", lambda: _http_ok(f"http://127.0.0.1:{ready}/ready"), 60, watch=[self.coredns])

    def _start_containerd(self) -> None:
        self.containerd = start_containerd(
            self.layout, self.sandbox_image, self.plane.logs_dir / f"containerd-{self.name}.log"
        )

    def _purge_store(self) -> None:
        """Remove the containers a killed node left in the leased store, keeping its images, and start
        containerd again without their CRI state; wipe the store if they cannot all be removed."""
        assert self.containerd is not None and self.lease is not None
        purged = remove_containers(self.layout.containerd_socket)
        self.containerd.stop()
        if purged:
            self.lease.drop_cri_state()
        else:
            self.lease.wipe()
        self._start_containerd()

    def _write_cni(self) -> None:
        layout = self.layout
        layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        layout.cni_ipam_dir.mkdir(parents=True, exist_ok=True)
        conflist = cni_conflist(layout, self.bridge, self.subnet)
        (layout.cni_conf_dir / "10-ddpjob-box.conflist").write_text(json.dumps(conflist, indent=2) + "\n")

    def _start_kubelet(self, binary: Path) -> None:
        layout, pki = self.layout, self.plane.data_dir / "pki"
        cert = f"kubelet-{self.name}"
        issue_cert(pki, cert, f"/CN={self.name}", server=True, ips=[self.gateway, "127.0.0.1"], dns=[self.name])
        issue_cert(pki, f"{cert}-client", f"/O=system:nodes/CN=system:node:{self.name}", server=False)
        client = (pki / f"{cert}-client.crt", pki / f"{cert}-client.key")
        server = self._start_kubelet_link() if self.cuttable else self.plane.server
        layout.kubelet_kubeconfig.write_text(to_json(kubeconfig(server, self.plane.ca_file, *client)))
        settings = KubeletSettings(
            node_ip=self.gateway,
            port=free_port(),
            healthz_port=free_port(),
            ca_file=self.plane.ca_file,
            serving_cert=pki / f"{cert}.crt",
            serving_key=pki / f"{cert}.key",
            cluster_dns=self.cluster_dns or (self.gateway if self.with_dns else CLUSTER_DNS),
            cgroup_root=self.cgroup_root,
            taints=self.taints,
        )
        layout.kubelet_config.write_text(to_json(kubelet_configuration(layout, settings)))
        for path in (layout.kubelet_root, layout.pod_logs, layout.volume_plugins):
            path.mkdir(parents=True, exist_ok=True)
        # kubelet refuses a cgroup root that does not exist in every hierarchy it uses
        for hierarchy in hoststate.hierarchies():
            (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        self.kubelet = Component(
            "kubelet",
            [
                str(binary),
                f"--config={layout.kubelet_config}",
                f"--kubeconfig={layout.kubelet_kubeconfig}",
                f"--root-dir={layout.kubelet_root}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.gateway}",
                *([f"--node-labels={','.join(f'{k}={v}' for k, v in self.labels.items())}"] if self.labels else []),
                "--v=1",
            ],
            self.plane.logs_dir / f"kubelet-{self.name}.log",
        )
        self.kubelet.start()
        watch = [c for c in (self.containerd, self.kubelet) if c]
        wait_until(f"node {self.name} to be Ready", self.ready, 120, watch=watch)
        if self.extended_resources:
            self.advertise(self.extended_resources)

    def _start_kubelet_link(self) -> str:
        """The kubelet's own way to the apiserver (``cuttable``): a forwarder on loopback; its address."""
        assert self.plane.apiserver_port is not None
        log_path = self.plane.logs_dir / f"kubelet-link-{self.name}.log"
        self.kubelet_link, port = start_link("kubelet-link", f"node {self.name}'s", self.plane.apiserver_port, log_path)
        return f"https://127.0.0.1:{port}"

    def cut_network(self) -> None:
        """A partition between the node and the control plane: neither its kubelet nor its pods reach the apiserver
        (the kubelet's link is stopped, and the pods' packets to the apiserver's port, where kubernetes.default.svc
        leads, are dropped: requests hang as across a cut cable, connections already open included); the pods keep
        running and keep reaching each other. ``heal_network`` ends it."""
        if self.kubelet_link is None or self.kubelet_link.pid is None:
            raise BoxError(f"node {self.name} was not started cuttable: its network cannot be cut")
        os.kill(self.kubelet_link.pid, signal.SIGSTOP)
        if not _iptables("-C", *self._pods_cut()):
            _iptables("-I", *self._pods_cut(), check=True)

    def heal_network(self) -> None:
        if self.kubelet_link is not None and self.kubelet_link.pid is not None:
            os.kill(self.kubelet_link.pid, signal.SIGCONT)
        while self.cuttable and _iptables("-C", *self._pods_cut()):
            _iptables("-D", *self._pods_cut(), check=True)

    def _pods_cut(self) -> list[str]:
        """The rule of a cut: the node's pods' packets to the apiserver's port dropped on their way into the host."""
        return [
            "INPUT", "-s", str(self.subnet), "-p", "tcp", "--dport", str(self.plane.apiserver_port),
            "-m", "comment", "--comment", f"ddpjob-box: node {self.name} ({self.bridge}) cut", "-j", "DROP",
        ]  # fmt: skip

    def power_cut(self) -> None:
        """The node loses power: its kubelet, containerd, every shim and every process of its pods SIGKILLed at once,
        so nothing writes a last status. ``power_on`` boots it again, with what its disks kept."""
        for component in (self.kubelet, self.containerd):
            if component is not None:
                component.kill()
        if self.before is not None:
            kill_pods(self.before, self.layout.containerd_socket, self.cgroup_root)

    def power_on(self) -> None:
        """containerd, then the kubelet, as the node's boot would start them; returns once the node is Ready."""
        assert self.containerd is not None and self.kubelet is not None
        self.heal_network()
        self.containerd.start()
        wait_until("containerd to serve", lambda: _ctr_ok(self.layout.containerd_socket), 30, watch=[self.containerd])
        self.kubelet.start()
        wait_until(f"node {self.name} to be Ready", self.ready, 120, watch=[self.containerd, self.kubelet])

    def advertise(self, resources: Mapping[str, int]) -> None:
        """Set extended resources in the node's capacity (kubelet keeps them, and derives allocatable)."""
        capacity = {name: str(count) for name, count in resources.items()}
        self._api_write("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": {"capacity": capacity}})
        wanted = set(capacity.items())

        def allocatable() -> bool:
            node = self._api_get(f"/api/v1/nodes/{self.name}") or {}
            return wanted <= set(((node.get("status") or {}).get("allocatable") or {}).items())

        watch = [c for c in (self.kubelet,) if c]
        wait_until(f"node {self.name} to advertise {capacity}", allocatable, 60, watch=watch)

    def _start_kube_proxy(self, binary: Path) -> None:
        pki, port = self.plane.data_dir / "pki", self.plane.apiserver_port
        assert port is not None
        self.api_forwarder = Component.box_module(
            "apiserver-forwarder",
            "ddpjob_box.kubenode.apiproxy",
            [self.gateway, str(port), str(port)],
            self.plane.logs_dir / f"apiserver-forwarder-{self.name}.log",
        )
        self.api_forwarder.start()
        # The apiserver runs with --endpoint-reconciler-type=none: the box says where the kubernetes Service goes.
        # Replaced, not just created: a slice of the same name left by an earlier node would route
        # kubernetes.default.svc to that node's gateway, which no longer exists (pods' connections time out).
        # Owned by the Node: deleting the Node (a crashed node's, say) makes the garbage collector delete
        # the slice, or it would keep sending a share of kubernetes.default.svc to a dead gateway.
        self._api_write("DELETE", f"{SLICES}/kubernetes-{self.name}")
        registered = self._api_get(f"/api/v1/nodes/{self.name}")
        if registered is None:
            log = self.plane.logs_dir / f"kubelet-{self.name}.log"
            raise BoxError(f"node {self.name} is Ready but not registered; see {log}")
        self._api_write("POST", SLICES, self._api_slice(str(registered["metadata"]["uid"])))
        cert = f"kube-proxy-{self.name}"
        issue_cert(pki, cert, "/CN=system:kube-proxy", server=False)
        kubeconfig_path = self.directory / "kube-proxy.kubeconfig"
        kubeconfig_path.write_text(
            to_json(kubeconfig(self.plane.server, self.plane.ca_file, pki / f"{cert}.crt", pki / f"{cert}.key"))
        )
        healthz = free_port()
        config = kube_proxy_configuration(kubeconfig_path, self.name, self.gateway, self.subnet, healthz, free_port())
        config_path = self.directory / "kube-proxy-config.yaml"
        config_path.write_text(to_json(config))
        self.kube_proxy = Component(
            "kube-proxy",
            [str(binary), f"--config={config_path}", "--v=1"],
            self.plane.logs_dir / f"kube-proxy-{self.name}.log",
        )
        self.kube_proxy.start()
        wait_until(
            "kube-proxy /healthz",
            lambda: _http_ok(f"http://127.0.0.1:{healthz}/healthz"),
            60,
            watch=[self.kube_proxy, self.api_forwarder],
        )
        # Healthy is not yet synced: a pod started now must find kubernetes.default.svc already routed.
        wait_until(
            "kube-proxy to route the kubernetes Service",
            _kubernetes_service_routed,
            60,
            watch=[self.kube_proxy, self.api_forwarder],
        )

    def _api_slice(self, node_uid: str) -> dict[str, Any]:
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"kubernetes-{self.name}",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node_uid}],
                "labels": {
                    "kubernetes.io/service-name": "kubernetes",
                    "endpointslice.kubernetes.io/managed-by": "ddpjob-box",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.gateway], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.plane.apiserver_port, "protocol": "TCP"}],
        }

    def ready(self) -> bool:
        node = self._api_get(f"/api/v1/nodes/{self.name}")
        conditions = node.get("status", {}).get("conditions", []) if node else []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _api_get(self, path: str) -> dict[str, Any] | None:
        ctx = ssl.create_default_context(cafile=str(self.plane.ca_file))
        request = urllib.request.Request(
            self.plane.server + path, headers={"Authorization": f"Bearer {self.plane.admin_token}"}
        )
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=5) as response:
                body = json.loads(response.read())
                return body if isinstance(body, dict) else None
        except (OSError, ValueError):
            return None

    def _api_write(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        """POST, PATCH (a merge patch) or DELETE as the box admin; a 409 on create and a 404 on delete are
        what was wanted."""
        ctx = ssl.create_default_context(cafile=str(self.plane.ca_file))
        request = urllib.request.Request(
            self.plane.server + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Authorization": f"Bearer {self.plane.admin_token}",
                "Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json",
            },
        )
        try:
            urllib.request.urlopen(request, context=ctx, timeout=5).close()
        except urllib.error.HTTPError as err:
            if err.code not in (404, 409):
                raise BoxError(f"{method} {path} failed: {err.code} {err.read()[:200]!r}") from None

    def _forget(self) -> None:
        """Remove the node's objects from the apiserver, if it is still up."""
        try:
            self._api_write(
                "DELETE", f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes-{self.name}"
            )
            self._api_write("DELETE", f"/api/v1/nodes/{self.name}")
        except (OSError, BoxError):
            pass  # the control plane is already gone

    def stop(self) -> None:
        """Stop kubelet, kill the pods' processes and the shims, stop containerd, and restore the host."""
        if self.supervisor is not None:
            self.supervisor.stop()  # none of what follows is started again
            self.supervisor = None
        self.heal_network()  # a stopped link would hold up its own stop
        for component in (self.kube_proxy, self.api_forwarder, self.kubelet, self.kubelet_link):
            if component:
                component.stop()
        if self.kubelet:
            self._forget()
        if self.before is not None:
            kill_pods(self.before, self.layout.containerd_socket, self.cgroup_root)
        # The store keeps images for the next node; containers only if they could not all be removed. Only a
        # containerd that runs can remove them: asking a stopped one (a second stop) waited out 20 s of retries,
        # each `ctr` call waiting for its socket, about 50 s in all.
        clean = (
            self.containerd is not None and self.containerd.alive() and remove_containers(self.layout.containerd_socket)
        )
        if self.containerd:
            self.containerd.stop()
        if self.lease:
            self.lease.release(clean=clean)
            self.lease = None
        if self.coredns:
            self.coredns.stop()
        if self.proxy_lock is not None:
            # Removed while still held, so the last node leaves /run/ddpjob empty for leftovers.restore to remove.
            PROXY_LOCK.unlink(missing_ok=True)
            self.proxy_lock.close()
            self.proxy_lock = None
        if self.before is not None:
            self.leftovers = restore(self.before, self.layout, self.bridge, self.cgroup_root)
            if self.leftovers:
                print(f"kubelet node {self.name}: teardown left {'; '.join(self.leftovers)}", flush=True)
            (self.directory / RECORD).unlink(missing_ok=True)
            self.before = None

    def container_pid(self, container_id: str) -> int:
        """The host PID of a running container's first process, found by its cgroup under this node's root;
        ``container_id`` is a pod status's ``containerID`` (``containerd://<id>``). Tests signal it from
        outside, as an OOM killer or a hung driver would: inside its PID namespace it is PID 1, which
        ignores SIGKILL and SIGSTOP from its own namespace."""
        ident = container_id.split("://")[-1]
        pids = hoststate.CGROUP_ROOT / "pids" / self.cgroup_root.lstrip("/")
        # os.walk, not Path.glob("**"): other pods' cgroups go while it walks, and glob raises on those.
        for top, dirs, _ in os.walk(pids):
            if top == str(pids):
                dirs[:] = [d for d in dirs if d.startswith("kubepods")]
            if ident in dirs:
                first = first_process({pid: _status(pid) for pid in cgroup_pids(Path(top) / ident)})
                if first is not None:
                    return first
        raise BoxError(f"no process of container {ident} under {pids}: is it running?")

    def training_pid(self, container_id: str) -> int:
        """The host PID of a trainer container's training process: under the trainer's supervisor (``MAX_RESTARTS``
        above 0), the child of its fork server, which the supervisor restarts in place; else the container's first
        process (``container_pid``). What an OOM killer or a crash ends."""
        main = self.container_pid(container_id)
        for child in children(main):
            if b"multiprocessing.forkserver" in _cmdline(child):
                training = sorted(children(child))
                if training:
                    return training[0]
        return main

    def log_tails(self) -> str:
        return "\n".join(f"--- {c.name} ({c.log_path}):\n{tail(c.log_path)}" for c in self.components)


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BoxError(f"'ip {' '.join(args)}' failed: {proc.stderr.strip()}")


def _iptables(*args: str, check: bool = False) -> bool:
    """Whether ``iptables -w <args>`` succeeded; with ``check``, a BoxError saying why when it did not."""
    proc = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise BoxError(f"'iptables {' '.join(args)}' failed: {proc.stderr.strip()}")
    return proc.returncode == 0


def _kubernetes_service_routed() -> bool:
    rules = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True)
    return any("-A KUBE-SERVICES" in line and "default/kubernetes:https" in line for line in rules.stdout.splitlines())


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def first_process(statuses: Mapping[int, str]) -> int | None:
    """Of a container's processes (host PID: its ``/proc/<pid>/status``), the first: PID 1 of its own PID namespace,
    the innermost of the ``NSpid`` line's PIDs. Not the lowest host PID: host PIDs wrap (at 32768 on this machine
    kind, within an hour of tests), and a process the container started later may then have the lower one. None
    when no process there is the first of a namespace of its own (it exited, or the container shares the host's)."""
    for pid, status in statuses.items():
        nspids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(nspids) > 1 and nspids[-1] == "1":
            return pid
    return None


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def claim_service_rules(directory: Path) -> IO[str]:
    """The host's Service rules for this node's kube-proxy, or a BoxError naming the box that has them."""
    SOCKETS_ROOT.mkdir(parents=True, exist_ok=True)
    lock = open(PROXY_LOCK, "a+")  # noqa: SIM115 (held open: the claim lasts as long as the node)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another box"
        lock.close()
        raise BoxError(
            f"another box's node runs kube-proxy on this host ({holder}): Service rules are host-wide, so two "
            "would route each other's Services; stop that box first"
        ) from None
    # A box started by an older checkout does not take the lock: its kube-proxy process says it is there.
    others = [
        f"pid {pid}: {argv.strip()}" for pid, argv in processes() if argv.split(" ", 1)[0].endswith("/kube-proxy")
    ]
    if others:
        PROXY_LOCK.unlink(missing_ok=True)  # ours (we hold it): leave /run/ddpjob as it was
        lock.close()
        raise BoxError(
            f"another box's kube-proxy runs on this host ({', '.join(others)}): Service rules are host-wide, so "
            "two would route each other's Services; stop that box first"
        )
    lock.truncate(0)
    lock.write(f"pid {os.getpid()}, node directory {directory}\n")
    lock.flush()
    return lock


def start_link(name: str, whose: str, apiserver_port: int, log_path: Path) -> tuple[Component, int]:
    """A way of its own to the apiserver on loopback (``apiproxy``), which stopping (SIGSTOP) cuts as a cable would:
    the forwarder ``name``, started and listening, and its port. ``whose`` names its owner in a timeout."""
    port = free_port()
    link = Component.box_module(
        name, "ddpjob_box.kubenode.apiproxy", ["127.0.0.1", str(port), str(apiserver_port)], log_path
    )
    link.start()
    wait_until(f"{whose} link to the apiserver", lambda: _listening(port), 20, watch=[link])
    return link, port


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _ctr_ok(sock: Path) -> bool:
    ctr = shutil.which("ctr") or "ctr"
    return subprocess.run([ctr, "--address", str(sock), "version"], capture_output=True).returncode == 0
