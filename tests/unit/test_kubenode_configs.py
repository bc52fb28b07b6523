"""The kubelet node's configuration files and host-state diff, as data: what this machine needs is in them."""

from __future__ import annotations

import dataclasses
import ipaddress
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.kubenode import hoststate
from ddpjob_box.kubenode.configs import (
    KubeletSettings,
    NodeLayout,
    cni_conflist,
    containerd_toml,
    corefile,
    kube_proxy_configuration,
    kubelet_configuration,
)

LAYOUT = NodeLayout(Path("/data/box/kubenode"), Path("/cache/node-stores/0"))
SUBNET = ipaddress.IPv4Network("10.244.7.0/24")


def test_containerd_config_is_valid_toml_with_what_this_machine_needs() -> None:
    config = tomllib.loads(containerd_toml(LAYOUT, "localhost/ddpjob/pause:k"))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    runc = cri["containerd"]["runtimes"]["runc"]
    assert config["version"] == 2
    # the image store is leased from the cache; everything else is the node's own
    assert config["root"] == "/cache/node-stores/0" and config["state"].startswith("/data/box/kubenode/")
    assert config["grpc"]["address"] == str(LAYOUT.containerd_socket)
    # root lacks CAP_SYS_RESOURCE: without this every sandbox fails
    assert cri["restrict_oom_score_adj"] is True
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["sandbox_image"] == "localhost/ddpjob/pause:k"
    assert runc["options"]["BinaryName"] == "/usr/sbin/runc"  # crun fails on hybrid cgroups
    assert runc["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"] == str(LAYOUT.cni_conf_dir)
    assert config["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith("/data/")


def test_containerd_sockets_fit_a_unix_socket_address_whatever_the_data_dir() -> None:
    deep = NodeLayout(Path("/tmp/" + "x" * 200), Path("/cache/node-stores/0"))
    assert len(str(deep.containerd_socket)) < 108
    assert deep.socket_dir != LAYOUT.socket_dir


def test_the_cni_network_is_one_bridge_with_host_local_addresses_and_no_masquerade() -> None:
    (bridge,) = cni_conflist(LAYOUT, "kn1", SUBNET)["plugins"]
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"], bridge["ipMasq"]) == ("bridge", "kn1", True, False)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.7.0/24", "gateway": "10.244.7.1"}]]
    assert bridge["ipam"]["dataDir"].startswith("/data/")


def test_kubelet_runs_on_hybrid_cgroups_without_swap_checks_or_privileges_it_lacks() -> None:
    settings = KubeletSettings(
        node_ip="10.244.7.1",
        port=1,
        healthz_port=2,
        ca_file=Path("/ca.crt"),
        serving_cert=Path("/k.crt"),
        serving_key=Path("/k.key"),
        cluster_dns="10.244.7.1",
        cgroup_root="/ddpjob-kubelet-n",
        taints=("t",),
    )
    config = kubelet_configuration(LAYOUT, settings)
    assert (config["cgroupDriver"], config["failSwapOn"], config["failCgroupV1"]) == ("cgroupfs", False, False)
    assert (config["oomScoreAdj"], config["readOnlyPort"]) == (0, 0)
    assert config["cgroupRoot"] == "/ddpjob-kubelet-n"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["containerRuntimeEndpoint"] == f"unix://{LAYOUT.containerd_socket}"
    assert config["registerWithTaints"] == [{"key": "t", "effect": "NoSchedule"}]
    for key in ("podLogsDir", "volumePluginDir"):
        assert config[key].startswith("/data/")


def test_kube_proxy_is_told_to_leave_conntrack_sysctls_and_route_localnet_alone() -> None:
    config = kube_proxy_configuration(Path("/kc"), "n", "10.244.7.1", SUBNET, 1, 2)
    assert config["conntrack"] == {
        "maxPerCore": 0,
        "min": 0,
        "tcpEstablishedTimeout": "0s",
        "tcpCloseWaitTimeout": "0s",
    }
    assert config["iptables"]["localhostNodePorts"] is False
    assert config["oomScoreAdj"] == 0


def test_coredns_binds_only_the_node_address_and_serves_cluster_local_from_the_apiserver() -> None:
    text = corefile("10.244.7.1", 1, 2, Path("/kc"))
    assert "bind 10.244.7.1" in text
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa" in text
    assert "kubeconfig /kc box" in text


def _state(**changes: Any) -> hoststate.HostState:
    base = hoststate.HostState(
        sysctls={"vm.overcommit_memory": "0"},
        chains={"iptables/filter": []},
        cgroups=[],
        files={"/var/lib/kubelet": None, "/run/netns": []},
        mounts=[],
        interfaces=[],
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (_state(), []),
        (_state(sysctls={"vm.overcommit_memory": "1"}), ["sysctl vm.overcommit_memory: 0 -> 1"]),
        (_state(chains={"iptables/filter": ["KUBE-FIREWALL"]}), ["iptables/filter: new chains ['KUBE-FIREWALL']"]),
        (_state(cgroups=["memory/kubepods"]), ["new cgroups: ['memory/kubepods']"]),
        (_state(mounts=["/data/x/shm"]), ["new mounts: ['/data/x/shm']"]),
        (_state(interfaces=["kn1"]), ["new interfaces: ['kn1']"]),
        (
            _state(files={"/var/lib/kubelet": ["device-plugins"], "/run/netns": []}),
            ["/var/lib/kubelet was absent and now exists (1 entries)"],
        ),
        (_state(files={"/var/lib/kubelet": None, "/run/netns": ["cni-1"]}), ["/run/netns: new entries ['cni-1']"]),
    ],
)
def test_compare_names_each_difference_from_the_snapshot(after: hoststate.HostState, expected: list[str]) -> None:
    assert hoststate.compare(_state(), after) == expected


@pytest.mark.parametrize(
    ("path", "ours"),
    [("/run/netns/cni-1234", True), ("/run/netns/ddpj-abc-1", False), ("/run/netns", False), ("/var/lib/x", True)],
)
def test_another_boxs_namespaces_in_run_netns_are_not_the_nodes(path: str, ours: bool) -> None:
    assert hoststate._ours(path) is ours
