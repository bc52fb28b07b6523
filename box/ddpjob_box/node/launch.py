"""Pure: the command line that enters a pod's namespaces and execs its container."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def mount_order(mounts: Sequence[Mount]) -> list[Mount]:
    """Parents before the mounts nested in them; a mount that would hide another's source goes after it."""
    ordered = sorted(mounts, key=lambda m: m.target.count("/"))
    hides = [m for m in ordered if any(_under(o.source, m.target) for o in mounts if o is not m)]
    return [m for m in ordered if m not in hides] + hides


def launch_argv(
    netns: str, hostname: str, mounts: Sequence[Mount], working_dir: str | None, argv: Sequence[str]
) -> list[str]:
    """``ip netns exec`` gives the network and /etc/hosts; ``unshare`` a hostname and private mounts.

    Every step execs, so the container's pid is the pid the shim started.
    """
    script = [f"hostname {shlex.quote(hostname)}"]
    for mount in mount_order(mounts):
        script.append(f"mount --bind {shlex.quote(mount.source)} {shlex.quote(mount.target)}")
        if mount.read_only:
            script.append(f"mount -o remount,bind,ro {shlex.quote(mount.target)}")
    if working_dir:
        script.append(f"cd {shlex.quote(working_dir)}")
    script.append('exec "$@"')
    return [
        "ip",
        "netns",
        "exec",
        netns,
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-ec",
        " && ".join(script),
        hostname,
        *argv,
    ]
