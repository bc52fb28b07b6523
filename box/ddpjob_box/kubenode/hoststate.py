"""What kubelet, containerd and the CNI plugins change on the host, snapshotted before and put back after.

kubelet sets sysctls, adds iptables chains and makes a ``kubepods`` cgroup in
every hierarchy; containerd and CNI leave mounts, network namespaces, veths
and directories behind when they are killed rather than drained. A snapshot
taken before the node starts is the reference: ``restore`` removes what is new
and resets what changed, and ``compare`` names what is still different, which
is what the teardown test asserts is nothing.

Only what a node can have made is watched (the names below), so another box or
build running on the same machine does not show up as a difference.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# kubelet sets the first three (unless protectKernelDefaults); the bridge plugin with isGateway sets ip_forward.
SYSCTLS = (
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    # kube-proxy would set these, but its configuration tells it not to; watched to prove it.
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
# Paths outside the data directory that kubelet, containerd or CNI write to even when told to use other roots.
WATCHED_DIRS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/containerd",
    "/run/containerd",
    "/run/netns",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    "/opt/containerd",
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
)
# The process node and `ip netns add` use /run/netns too; containerd's own namespaces are named cni-<uuid>.
NETNS_DIR = "/run/netns"
SHIM_ROOT = "/run/containerd"
CONTAINERD_NETNS = "cni-"
CHAIN_PREFIXES = ("KUBE-", "CNI-")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# kubelet's default cgroup root puts pods under /kubepods; the box gives each node its own root instead.
CGROUP_PREFIXES = ("kubepods", "ddpjob-kubelet-")
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle")


@dataclass(frozen=True)
class HostState:
    sysctls: dict[str, str]
    # "iptables/nat" -> the KUBE-*/CNI-* chains in it
    chains: dict[str, list[str]]
    # cgroup paths under a kubepods* or ddpjob-kubelet-* top-level directory, per hierarchy
    # ("memory/ddpjob-kubelet-box/kubepods/burstable")
    cgroups: list[str]
    # every file and directory under each watched dir; None when the dir is absent
    files: dict[str, list[str] | None]
    # mount points under the watched dirs and the node's data directory
    mounts: list[str]
    # interfaces that a CNI bridge or the node's own bridge made
    interfaces: list[str]


def snapshot(data_dir: Path, bridge: str) -> HostState:
    return HostState(
        sysctls={name: _sysctl(name) for name in SYSCTLS},
        chains=_chains(),
        cgroups=pod_cgroups(),
        # /run/netns itself may come and go with another box's namespaces: only our entries in it count
        files={d: _walk(Path(d)) if d != NETNS_DIR else _walk(Path(d)) or [] for d in WATCHED_DIRS},
        mounts=_mounts(data_dir),
        interfaces=_interfaces(bridge),
    )


def compare(before: HostState, after: HostState) -> list[str]:
    """One line per difference: what changed and how."""
    diffs = []
    for name, value in before.sysctls.items():
        if after.sysctls.get(name) != value:
            diffs.append(f"sysctl {name}: {value} -> {after.sysctls.get(name)}")
    for table in sorted(set(before.chains) | set(after.chains)):
        new = set(after.chains.get(table, [])) - set(before.chains.get(table, []))
        if new:
            diffs.append(f"{table}: new chains {sorted(new)}")
    for label, was, now in (
        ("cgroups", before.cgroups, after.cgroups),
        ("mounts", before.mounts, after.mounts),
        ("interfaces", before.interfaces, after.interfaces),
    ):
        if set(now) - set(was):
            diffs.append(f"new {label}: {sorted(set(now) - set(was))[:10]}")
    for root, was_files in before.files.items():
        now_files = after.files.get(root)
        if was_files is None and now_files is not None:
            diffs.append(f"{root} was absent and now exists ({len(now_files)} entries)")
        elif was_files is not None and now_files is not None and set(now_files) - set(was_files):
            diffs.append(f"{root}: new entries {sorted(set(now_files) - set(was_files))[:10]}")
    return diffs


def restore(
    before: HostState, data_dir: Path, bridge: str, *, cgroup_root: str = "", host_wide: bool = True
) -> list[str]:
    """Undo what is new since ``before``. The node's processes must be gone. Returns what could not be undone.

    With ``host_wide`` False (another node still runs), only what is the node's own goes: mounts under its
    data dir, the interfaces on its bridge and the cgroups under ``cgroup_root``; sysctls, chains and shared
    paths are left for the last node to stop, which restores them from the first node's snapshot.
    """
    failures: list[str] = []
    now = snapshot(data_dir, bridge)
    # Mounts first, deepest first: a netns or rootfs mount keeps veths and directories alive.
    for mount in sorted(set(now.mounts) - set(before.mounts), key=len, reverse=True):
        if subprocess.run(["umount", mount], capture_output=True).returncode != 0:
            # busy (a process we did not see go yet): detach it, the kernel frees it when the last user goes
            subprocess.run(["umount", "--lazy", mount], capture_output=True)
    # Only this node's: the pairs on its bridge (a pinned netns keeps them), then the bridge itself.
    for name in sorted(set(now.interfaces) - set(before.interfaces), key=lambda n: n == bridge):
        if name == bridge or _master(name) == bridge:
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    new_cgroups = under(set(now.cgroups) - set(before.cgroups), cgroup_root)
    failures += _remove_cgroups(sorted(new_cgroups, key=len, reverse=True))
    if not host_wide:
        return failures
    for table, chains in now.chains.items():
        new = set(chains) - set(before.chains.get(table, []))
        if new:
            failures += _delete_chains(table, new)
    for name, value in before.sysctls.items():
        if value and now.sysctls.get(name) != value:
            _write_sysctl(name, value)
    for root, was_files in before.files.items():
        now_files = now.files.get(root)
        if now_files is None:
            continue
        if root == SHIM_ROOT:
            _remove_stale_sockets(Path(root), sorted(set(now_files) - set(was_files or [])), was_files is None)
            continue
        if was_files is None:
            shutil.rmtree(root, ignore_errors=True)
            continue
        for rel in sorted(set(now_files) - set(was_files), key=len):
            path = Path(root) / rel
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    failures += compare(before, snapshot(data_dir, bridge))
    return failures


def _remove_stale_sockets(root: Path, new: list[str], remove_root: bool) -> None:
    """containerd 1.6 puts every shim's socket in /run/containerd/s whatever its state dir, so another
    containerd's live shims may be there too: remove only sockets nobody listens on, and emptied dirs."""
    for rel in sorted(new, key=len, reverse=True):
        path = root / rel
        if path.is_socket() and not listening(path):
            path.unlink(missing_ok=True)
        elif path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()
    if remove_root:
        with contextlib.suppress(OSError):
            root.rmdir()


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _sysctl(name: str) -> str:
    try:
        return (Path("/proc/sys") / name.replace(".", "/")).read_text().strip()
    except OSError:
        return ""


def _write_sysctl(name: str, value: str) -> None:
    (Path("/proc/sys") / name.replace(".", "/")).write_text(value + "\n")


def _chains() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for binary in IPTABLES:
        if shutil.which(binary) is None:
            continue
        for table in TABLES:
            proc = subprocess.run([binary, "-w", "-t", table, "-S"], capture_output=True, text=True)
            chains = [
                line.split()[1]
                for line in proc.stdout.splitlines()
                if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIXES)
            ]
            found[f"{binary}/{table}"] = sorted(chains)
    return found


def _delete_chains(table_key: str, chains: set[str]) -> list[str]:
    """Remove every rule that jumps to one of ``chains``, then flush and delete the chains themselves."""
    binary, table = table_key.split("/")
    rules = subprocess.run([binary, "-w", "-t", table, "-S"], capture_output=True, text=True).stdout.splitlines()
    for rule in rules:
        parts = shlex.split(rule)  # comments are quoted and hold spaces
        if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in chains:
            subprocess.run([binary, "-w", "-t", table, "-D", *parts[1:]], capture_output=True)
    for chain in chains:
        subprocess.run([binary, "-w", "-t", table, "-F", chain], capture_output=True)
    failures = []
    for chain in chains:
        proc = subprocess.run([binary, "-w", "-t", table, "-X", chain], capture_output=True, text=True)
        if proc.returncode != 0:
            failures.append(f"{binary} -t {table} -X {chain}: {proc.stderr.strip()}")
    return failures


def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy: the v1 controllers, systemd's and the unified one (hybrid mode)."""
    if not CGROUP_ROOT.is_dir():
        return []
    # cgroup v1 may name co-mounted hierarchies twice (cpu -> cpu,cpuacct); the link adds nothing
    return sorted(h for h in CGROUP_ROOT.iterdir() if h.is_dir() and not h.is_symlink())


def under(cgroups: Iterable[str], cgroup_root: str) -> set[str]:
    """The cgroups (as ``pod_cgroups`` names them: ``<hierarchy>/<top>/...``) under a node's own ``cgroup_root``;
    all of them for "" (a record written before nodes had roots of their own)."""
    top = cgroup_root.strip("/")
    return {c for c in cgroups if not top or c.split("/")[1:2] == [top]}


def pod_cgroups() -> list[str]:
    found: list[str] = []
    for hierarchy in hierarchies():
        for prefix in CGROUP_PREFIXES:
            for top in hierarchy.glob(f"{prefix}*"):
                for dirpath, _, _ in os.walk(top):
                    found.append(str(Path(dirpath).relative_to(CGROUP_ROOT)))
    return sorted(found)


def _remove_cgroups(paths: list[str]) -> list[str]:
    failures = []
    for rel in paths:
        path = CGROUP_ROOT / rel
        for attempt in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as err:
                if attempt == 49:
                    failures.append(f"cgroup {path}: {err.strerror}")
                time.sleep(0.1)  # a process that was just killed leaves its cgroup a moment later
    return failures


def _ours(path: str) -> bool:
    """False for what others put in /run/netns (another box's pod namespaces, the directory's own bind mount)."""
    if path == NETNS_DIR:
        return False
    if path.startswith(NETNS_DIR + "/"):
        return path[len(NETNS_DIR) + 1 :].startswith(CONTAINERD_NETNS)
    return True


def _walk(root: Path) -> list[str] | None:
    if not root.is_dir():
        return None
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            if _ours(str(path)):
                found.append(str(path.relative_to(root)))
    return sorted(found)


def _mounts(data_dir: Path) -> list[str]:
    roots = (str(data_dir), *WATCHED_DIRS)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == root or point.startswith(root + "/") for root in roots) and _ours(point):
            found.append(point)
    return sorted(found)


def _master(interface: str) -> str:
    try:
        return os.path.basename(os.readlink(f"/sys/class/net/{interface}/master"))
    except OSError:
        return ""


def _interfaces(bridge: str) -> list[str]:
    names = os.listdir("/sys/class/net")
    # CNI's bridge plugin names the host end of each pod's pair veth<hex>
    return sorted(n for n in names if n == bridge or n.startswith("veth") or n.startswith("cni"))
