"""containerd's content and snapshot store, kept across boxes like kind keeps its node image.

A fresh store costs a full import of the images it runs (the trainer is 5.8 GB unpacked: minutes and
disk for every box). So a node leases a store from ``$DDPJOB_CACHE/images/node-stores/<slot>``: one
node at a time per slot (an exclusive ``flock`` held while the node runs), the first free slot wins,
and a second node running beside the first (two nodes on one host) takes the next.

What a store keeps between nodes is images only. A node purges its containers before it lets the
store go (``StoreLease.release(clean=True)``). A node that died before that leaves its ``.in-use``
mark, and the next lease of that slot is ``dirty``: the node that takes it removes the dead node's
containers before its kubelet starts, and wipes the store only if they cannot all be removed. Wiping it
every time cost the next node a full import of the trainer, about 2 minutes (the suite kills nodes on
purpose: every later node paid it).
"""

from __future__ import annotations

import fcntl
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ddpjob_box.errors import BoxError
from ddpjob_box.toolchain import cache_dir

SLOTS = 9
"""The most nodes a host runs at once: make test's three box groups (tests/workers.py: 2, 4 and 3)."""
IN_USE = ".in-use"
# Per-sandbox and per-container files of the CRI plugin: state of the node that used the store, not images.
CRI_STATE = ("io.containerd.grpc.v1.cri/sandboxes", "io.containerd.grpc.v1.cri/containers")


def stores_dir() -> Path:
    return cache_dir() / "images" / "node-stores"


@dataclass
class StoreLease:
    """One slot's directory, held until ``release``."""

    path: Path
    lock: IO[str]
    # The last node to use it died, or kept containers: its images stand, its containers must go before use.
    dirty: bool = False

    def drop_cri_state(self) -> None:
        """Remove the last node's sandbox and container files (containerd stopped, its containers removed)."""
        for sub in CRI_STATE:
            shutil.rmtree(self.path / sub, ignore_errors=True)

    def wipe(self) -> None:
        """Empty the store (containerd stopped): the node then imports its images afresh."""
        shutil.rmtree(self.path)
        self.path.mkdir()
        (self.path / IN_USE).touch()

    def release(self, *, clean: bool) -> None:
        """Let the slot go; ``clean`` says the node removed every container, so the next node may reuse it."""
        if clean:
            self.drop_cri_state()
            (self.path / IN_USE).unlink(missing_ok=True)
        self.lock.close()


def lease(slots: int = SLOTS) -> StoreLease:
    """The first free slot, ``dirty`` when the last node to use it did not clean up."""
    root = stores_dir()
    root.mkdir(parents=True, exist_ok=True)
    for slot in range(slots):
        lock = open(root / f"{slot}.lock", "w")  # noqa: SIM115 (held open: the lock lives as long as the lease)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        path = root / str(slot)
        dirty = (path / IN_USE).exists()
        path.mkdir(exist_ok=True)
        (path / IN_USE).touch()
        return StoreLease(path, lock, dirty=dirty)
    raise BoxError(
        f"all {slots} containerd stores under {root} are in use by running nodes; stop a box (ddpjob cluster down)"
    )
