"""Pure builders of the node's configuration files: containerd, the CNI network and kubelet.

Every path a component would otherwise take from the host's defaults is moved
under the node's directory, so two boxes never share state and teardown knows
where everything is.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CNI_BIN_DIR = "/usr/lib/cni"
SOCKETS_ROOT = Path("/run/ddpjob")
# kubelet's longest socket under its root dir; the whole path must fit a unix socket address (107 bytes).
KUBELET_SOCKET = "plugins_registry/kubelet-plugin-reg.sock"
CLUSTER_DOMAIN = "cluster.local"
# The containerd namespace of the CRI plugin: kubelet's pods and the images they run live there.
CONTAINERD_NAMESPACE = "k8s.io"
SNAPSHOTTER = "overlayfs"
"""The CRI plugin's snapshotter: where the images' unpacked layers live."""


@dataclass(frozen=True)
class NodeLayout:
    """Where one node keeps everything: under its own directory, but for containerd's image store, which is
    leased from a cache that outlives the node (``kubenode.store``)."""

    root: Path
    containerd_root: Path
    # where its socket directory goes: another root keeps a containerd from counting as a node's (store_fill)
    sockets_root: Path = SOCKETS_ROOT

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def socket_dir(self) -> Path:
        """containerd's sockets, in a short directory of their own: a unix socket path has at most 107 bytes,
        which a data directory nested in a test's temporary directory can use up by itself."""
        return self.sockets_root / hashlib.sha256(str(self.root).encode()).hexdigest()[:12]

    @property
    def containerd_socket(self) -> Path:
        return self.socket_dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def volume_plugins(self) -> Path:
        return self.root / "volume-plugins"


def containerd_toml(layout: NodeLayout, sandbox_image: str) -> str:
    """containerd 1.6, config version 2, CRI with runc on cgroupfs."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runc = f"{cri}.containerd.runtimes.runc"
    state = layout.containerd_state
    return f"""version = 2
root = "{layout.containerd_root}"
state = "{state}"
# Plugins for other hosts' storage only log errors here.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.socket_dir / "ttrpc.sock"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{layout.root / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{sandbox_image}"
  # Root lacks CAP_SYS_RESOURCE here: without this every sandbox fails ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  # Pod network namespaces under the state dir, not in /run/netns, which `ip netns add` makes a shared mount.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true

[{cri}.containerd]
  snapshotter = "{SNAPSHOTTER}"
  default_runtime_name = "runc"

[{runc}]
  runtime_type = "io.containerd.runc.v2"

[{runc}.options]
  # crun fails on hybrid cgroups; name runc and keep its state with ours.
  BinaryName = "/usr/sbin/runc"
  Root = "{state / "runc"}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{layout.cni_conf_dir}"
  max_conf_num = 1
"""


def cni_conflist(layout: NodeLayout, bridge: str, subnet: ipaddress.IPv4Network) -> dict[str, Any]:
    """One bridge per node with host-local addresses from the node's /24; the bridge is the pods' gateway."""
    gateway = str(subnet.network_address + 1)
    return {
        "cniVersion": "1.0.0",
        "name": "ddpjob-box",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "hairpinMode": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.cni_ipam_dir),
                    "ranges": [[{"subnet": str(subnet), "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
        ],
    }


@dataclass(frozen=True)
class KubeletSettings:
    node_ip: str
    port: int
    healthz_port: int
    ca_file: Path
    serving_cert: Path
    serving_key: Path
    cluster_dns: str
    # The node's own cgroup root (kubepods goes under it), so two kubelets on one host never share pods' cgroups
    cgroup_root: str = "/"
    # NoSchedule taint keys the node registers with, so only pods that tolerate them land there
    taints: tuple[str, ...] = ()


def kubelet_configuration(layout: NodeLayout, s: KubeletSettings) -> dict[str, Any]:
    """A KubeletConfiguration for a shared 2-core VM: cgroupfs on hybrid v1, no swap check, nothing evicted
    or garbage-collected until the disk is nearly full, and the API served only to clients of the box CA."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": s.node_ip,
        "port": s.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": s.healthz_port,
        "tlsCertFile": str(s.serving_cert),
        "tlsPrivateKeyFile": str(s.serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(s.ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": s.cgroup_root,
        "failSwapOn": False,
        "failCgroupV1": False,
        # The default (-999) needs CAP_SYS_RESOURCE, which root lacks here.
        "oomScoreAdj": 0,
        "clusterDNS": [s.cluster_dns],
        "clusterDomain": CLUSTER_DOMAIN,
        "podLogsDir": str(layout.pod_logs),
        "volumePluginDir": str(layout.volume_plugins),
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # No systemd-logind to hold a shutdown inhibitor.
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "logging": {"format": "text"},
        "registerWithTaints": [{"key": key, "effect": "NoSchedule"} for key in s.taints],
    }


def kubeconfig(server: str, ca_file: Path, cert: Path, key: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "box",
        "clusters": [{"name": "box", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "box", "context": {"cluster": "box", "user": "node"}}],
    }


def to_json(obj: dict[str, Any]) -> str:
    """kubelet reads YAML, and JSON is YAML."""
    return json.dumps(obj, indent=2) + "\n"


def corefile(listen: str, health_port: int, ready_port: int, kubeconfig_path: Path) -> str:
    """CoreDNS answering for cluster.local from the apiserver (so ``<pod>.<headless service>`` resolves) on the
    node's bridge address, and forwarding everything else to the host's resolver."""
    return f""".:53 {{
    bind {listen}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig_path} box
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
}}
"""


def kube_proxy_configuration(
    kubeconfig_path: Path, node_name: str, node_ip: str, pod_cidr: ipaddress.IPv4Network, healthz: int, metrics: int
) -> dict[str, Any]:
    """kube-proxy in iptables mode that leaves the host's conntrack sysctls and route_localnet alone."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path)},
        "hostnameOverride": node_name,
        "bindAddress": node_ip,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        "mode": "iptables",
        "clusterCIDR": str(pod_cidr),
        "detectLocalMode": "ClusterCIDR",
        # The default (-999) needs CAP_SYS_RESOURCE, which root lacks here.
        "oomScoreAdj": 0,
        # Zero means "do not set": the node must not change the host's conntrack table size or timeouts.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        # NodePorts on 127.0.0.1 would need route_localnet=1 on every interface.
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        "nodePortAddresses": [f"{node_ip}/32"],
    }
