"""What a node leaves on the host, and undoing it: its pods' processes, its shims, its containers, its socket
directory and the host state its record holds. The node (``node.KubeletNode``) undoes itself with these when it
stops, and the control plane's sweep (``controlplane.sweep_killed_boxes``) with ``recover`` for a node whose box was
killed outright."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ddpjob_box.kubenode import hoststate
from ddpjob_box.kubenode.configs import CONTAINERD_NAMESPACE, SOCKETS_ROOT, NodeLayout
from ddpjob_box.processes import exited

RECORD = "node-record.json"
"""What a running node changed on the host, in its directory (removed when it stops)."""
# The host as the first of several nodes found it, restored by the last to stop.
HOST_RECORD = SOCKETS_ROOT / "host-before.json"


def recover(directory: Path) -> bool:
    """Undo a node whose box was killed outright (its kubelet and containerd died with it, but the shims and
    pods did not); False when ``directory`` holds no record of a node that was not stopped."""
    record = directory / RECORD
    if not record.exists():
        return False
    data = json.loads(record.read_text())
    before = hoststate.HostState(**data["before"])
    # The store keeps its .in-use mark (its containers were never removed): the next node to lease it removes them.
    layout = NodeLayout(directory, Path(data.get("store", directory / "containerd" / "root")))
    cgroup_root = data.get("cgroup_root", "")
    kill_pods(before, layout.containerd_socket, cgroup_root)
    restore(before, layout, data["bridge"], cgroup_root)
    record.unlink()
    return True


def kill_pods(before: hoststate.HostState, socket: Path, cgroup_root: str) -> None:
    """SIGKILL every process in a pod cgroup made since ``before`` under the node's ``cgroup_root``, and every
    shim of the containerd at ``socket``: kubelet does not stop pods when it stops, and shims outlive containerd
    by design. Only the node's own: another node on the host (the other box group's, Kueue's) made pod cgroups
    since ``before`` too, and killing its pods' processes failed its tests with exit 137."""
    pids: set[int] = set()
    for rel in hoststate.under(set(hoststate.pod_cgroups()) - set(before.cgroups), cgroup_root):
        pids |= cgroup_pids(hoststate.CGROUP_ROOT / rel)
    pids |= {pid for pid, argv in processes() if str(socket) in argv and "containerd-shim" in argv}
    pids.discard(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while not all(exited(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def remove_containers(socket: Path) -> bool:
    """Remove every container (pods' and sandboxes', with their snapshots) from the containerd at ``socket``,
    whose shims are dead; True when none is left. containerd notices a dead shim a moment after it dies."""
    ctr = shutil.which("ctr") or "ctr"

    def left() -> list[str]:
        listing = subprocess.run(
            [ctr, "--address", str(socket), "-n", CONTAINERD_NAMESPACE, "containers", "ls", "--quiet"],
            capture_output=True,
            text=True,
        )
        return listing.stdout.split() if listing.returncode == 0 else ["(containerd did not answer)"]

    deadline = time.monotonic() + 20
    while (ids := left()) and time.monotonic() < deadline:
        for ident in ids:
            argv = [ctr, "--address", str(socket), "-n", CONTAINERD_NAMESPACE]
            subprocess.run([*argv, "tasks", "delete", "--force", ident], capture_output=True)
            subprocess.run([*argv, "containers", "delete", ident], capture_output=True)
        time.sleep(0.2)
    return not left()


def live_nodes(layout: NodeLayout) -> list[Path]:
    """The socket dirs of other nodes on this host whose containerd still answers."""
    if not SOCKETS_ROOT.is_dir():
        return []
    return [
        d
        for d in SOCKETS_ROOT.iterdir()
        if d != layout.socket_dir and hoststate.listening(d / layout.containerd_socket.name)
    ]


def restore(before: hoststate.HostState, layout: NodeLayout, bridge: str, cgroup_root: str) -> list[str]:
    """Put back what this node changed; the host-wide state too when it is the last node running."""
    failures = hoststate.restore(before, layout.root, bridge, cgroup_root=cgroup_root, host_wide=False)
    if not live_nodes(layout):
        first = hoststate.HostState(**json.loads(HOST_RECORD.read_text())) if HOST_RECORD.exists() else before
        failures = hoststate.restore(first, layout.root, bridge)
        HOST_RECORD.unlink(missing_ok=True)
    _remove_socket_dir(layout)
    return failures


def _remove_socket_dir(layout: NodeLayout) -> None:
    shutil.rmtree(layout.socket_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        SOCKETS_ROOT.rmdir()  # only when no other node's sockets are there


def cgroup_pids(path: Path) -> set[int]:
    try:
        return {int(line) for line in (path / "cgroup.procs").read_text().split()}
    except OSError:
        return set()


def processes() -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except OSError:
                continue
    return found
