"""Pod networking: a bridge per box, a network namespace and veth pair per pod.

Every name carries the box's id, so a box only ever removes what it created.
The hosts file of a namespace lives in /etc/netns/<ns>/hosts, which
``ip netns exec`` bind-mounts over /etc/hosts; it is rewritten in place so the
bind mount of an already running pod sees the change.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpjob_box.errors import BoxError

NETNS_ETC = Path("/etc/netns")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("ip") is None:
        raise BoxError("the 'ip' command is missing: run 'apt-get install -y iproute2'")
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise BoxError(f"'ip {' '.join(args)}' failed: {proc.stderr.strip()} (the local node needs root)")
    return proc


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in ip("-4", "-o", "addr", "show").stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    return nets


def pick_subnet(seed: int) -> ipaddress.IPv4Network:
    """A /24 under 10.244.0.0/16 that no interface on this machine uses."""
    used = _used_networks()
    for offset in range(256):
        candidate = ipaddress.IPv4Network(f"10.244.{(seed + offset) % 256}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise BoxError("no free /24 under 10.244.0.0/16 for pod IPs: remove stale bridges ('ip -br addr')")


@dataclass(frozen=True)
class Bridge:
    name: str
    subnet: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def create(self) -> None:
        if ip("link", "show", self.name, check=False).returncode == 0:
            return  # adopted after a node restart
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.name)
        ip("link", "set", self.name, "up")

    def delete(self) -> None:
        ip("link", "del", self.name, check=False)


@dataclass(frozen=True)
class PodNetwork:
    """The network namespace of one pod; ``key`` is a short hex id unique within the box."""

    prefix: str
    key: str
    address: str
    bridge: Bridge

    @property
    def netns(self) -> str:
        return f"{self.prefix}{self.key}"

    @property
    def host_veth(self) -> str:
        return f"vh{self.key}"[:15]

    @property
    def etc_dir(self) -> Path:
        return NETNS_ETC / self.netns

    def exists(self) -> bool:
        return (Path("/run/netns") / self.netns).exists()

    def create(self, hostname: str) -> None:
        if self.exists():
            return
        ip("netns", "add", self.netns)
        peer = f"vp{self.key}"[:15]
        ip("link", "add", self.host_veth, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", self.netns)
        ip("link", "set", self.host_veth, "master", self.bridge.name, "up")
        ip("-n", self.netns, "link", "set", peer, "name", "eth0")
        ip("-n", self.netns, "addr", "add", f"{self.address}/{self.bridge.subnet.prefixlen}", "dev", "eth0")
        ip("-n", self.netns, "link", "set", "eth0", "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        ip("-n", self.netns, "route", "add", "default", "via", self.bridge.gateway)
        self.etc_dir.mkdir(parents=True, exist_ok=True)
        (self.etc_dir / "hostname").write_text(hostname + "\n")
        self.write_hosts([])

    def write_hosts(self, entries: Iterable[tuple[str, Sequence[str]]]) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{address}\t{' '.join(names)}" for address, names in entries]
        text = "# managed by the ddpjob local node\n" + "\n".join(lines) + "\n"
        path = self.etc_dir / "hosts"
        # In place, never by rename: running pods hold a bind mount of this inode.
        with open(path, "a+") as handle:
            handle.seek(0)
            if handle.read() == text:
                return
            handle.seek(0)
            handle.truncate()
            handle.write(text)

    def delete(self) -> None:
        ip("link", "del", self.host_veth, check=False)
        ip("netns", "del", self.netns, check=False)
        shutil.rmtree(self.etc_dir, ignore_errors=True)


def namespaces_with_prefix(prefix: str) -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]
