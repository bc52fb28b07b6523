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


# sh can redirect file descriptors 0-9 only; these hold directories a mount would hide.
_KEEP_FDS = (9, 8, 7, 6, 5)


def launch_argv(
    netns: str,
    hostname: str,
    mounts: Sequence[Mount],
    working_dir: str | None,
    argv: Sequence[str],
    keep: Sequence[str] = (),
) -> list[str]:
    """``ip netns exec`` gives the network and /etc/hosts; ``unshare`` a hostname and private mounts.

    ``keep`` names host directories the pod must still see (this checkout's environment): a volume
    mounted over one of their ancestors (an emptyDir at /tmp, say) would hide them, so each is held
    open before the mounts and bound back at its own path after them. Every step execs, so the
    container's pid is the pid the shim started.
    """
    hidden = [k for k in keep if any(_under(k, m.target) for m in mounts)]
    if len(hidden) > len(_KEEP_FDS):
        raise ValueError(f"at most {len(_KEEP_FDS)} kept directories can be hidden by mounts, not {len(hidden)}")
    script = [f"hostname {shlex.quote(hostname)}"]
    script += [f"exec {fd}< {shlex.quote(path)}" for fd, path in zip(_KEEP_FDS, hidden, strict=False)]
    for mount in mount_order(mounts):
        script.append(f"mount --bind {shlex.quote(mount.source)} {shlex.quote(mount.target)}")
        if mount.read_only:
            script.append(f"mount -o remount,bind,ro {shlex.quote(mount.target)}")
    for fd, path in zip(_KEEP_FDS, hidden, strict=False):
        # The path names the covered directory again only through the descriptor: mount must not resolve it.
        script.append(f"mkdir -p {shlex.quote(path)}")
        script.append(f"mount --no-canonicalize --bind /proc/$$/fd/{fd} {shlex.quote(path)}")
        script.append(f"exec {fd}<&-")
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
