"""Remove everything a node made: its pods' processes, namespaces, hosts files, mount points and bridge."""

from __future__ import annotations

import ipaddress
import json
import signal
import time
from pathlib import Path

from ddpjob_box.node.agent import PodRecord
from ddpjob_box.node.network import NETNS_ETC, Bridge, ip, namespaces_with_prefix
from ddpjob_box.node.volumes import MountPoints


def teardown(state_dir: Path, bridge: Bridge, netns_prefix: str) -> None:
    records = [PodRecord.load(d) for d in (state_dir / "pods").glob("*") if (d / "meta.json").exists()]
    containers = [c for r in records for c in r.all_containers()]
    for c in containers:
        c.signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(c.running() for c in containers) and time.monotonic() < deadline:
        time.sleep(0.05)
    for netns in namespaces_with_prefix(netns_prefix):
        ip("netns", "del", netns, check=False)
    for etc in NETNS_ETC.glob(f"{netns_prefix}*"):
        for child in etc.iterdir():
            child.unlink()
        etc.rmdir()
    MountPoints(state_dir / "mountpoints.json").sweep(in_use=[])
    bridge.delete()


RECORD = "node.json"


def record_node(state_dir: Path, bridge: Bridge, netns_prefix: str) -> None:
    """Note what the node will create, so a run killed outright can still be cleaned up later."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / RECORD).write_text(
        json.dumps({"bridge": bridge.name, "subnet": str(bridge.subnet), "netns_prefix": netns_prefix})
    )


def teardown_recorded(state_dir: Path) -> bool:
    """Tear down a node from its record (a killed run's leftovers); False when there is no record."""
    record = state_dir / RECORD
    if not record.exists():
        return False
    data = json.loads(record.read_text())
    teardown(state_dir, Bridge(data["bridge"], ipaddress.IPv4Network(data["subnet"])), data["netns_prefix"])
    record.unlink()
    return True
