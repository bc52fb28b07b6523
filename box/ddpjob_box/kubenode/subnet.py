"""A free /24 for a node's pods, under 10.244.0.0/16, away from every network this host already has."""

from __future__ import annotations

import ipaddress
import subprocess

from ddpjob_box.errors import BoxError


def used_networks() -> list[ipaddress.IPv4Network]:
    proc = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BoxError(f"'ip -4 -o addr show' failed: {proc.stderr.strip()} (install iproute2)")
    nets = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    return nets


def pick_subnet(seed: int) -> ipaddress.IPv4Network:
    """The first free /24 from ``seed`` on, so boxes with different ids start their search apart."""
    used = used_networks()
    for offset in range(256):
        candidate = ipaddress.IPv4Network(f"10.244.{(seed + offset) % 256}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise BoxError("no free /24 under 10.244.0.0/16 for pod IPs: remove stale bridges ('ip -br addr')")
