"""Fill the cache's node stores with the images a node runs, during the setup, beside the Go builds.

A node's first start on a machine imports its images into the containerd store it leases (``kubenode.store``):
for the trainer's 5.8 GB that was a minute and a half of a cold ``make demo``, spent after the Go builds, and of a
cold ``make test``'s first node in each box group. The setup does that import while the Go builds still compile,
through a containerd of its own on each store, started with the node's own configuration, so the node later finds
its images there and imports nothing. A store in use by a running node is not touched (its lock is held); a store
a killed node left dirty is left to the next node, which cleans it.

``python -m ddpjob_box.kubenode.store_fill --stores N``: what ``make setup`` runs after the images (N: the nodes
its command runs side by side).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from ddpjob_box import images as local_images
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode import store
from ddpjob_box.kubenode.configs import NodeLayout
from ddpjob_box.kubenode.containerd import Importer, start_containerd
from ddpjob_box.overlap import stop_like_ctrl_c


def node_images() -> list[str]:
    """What a box's node imports (``Box.start_node``): the pause image, the base, the operator and the trainer."""
    return list(
        dict.fromkeys(
            [
                local_images.ensure_pause(quiet=True),
                local_images.ensure_base(quiet=True),
                *local_images.shipped_images(),
            ]
        )
    )


def fill(stores: int, names: Sequence[str], importer: Importer, work: Path) -> list[Path]:
    """Import ``names`` into each of the first ``stores`` free node stores; returns the stores filled. The
    sandbox (pause) image is ``names[0]``."""
    filled: list[Path] = []
    with ExitStack() as held:
        leases: list[store.StoreLease] = []
        for _ in range(stores):
            try:
                lease = store.lease()
            except BoxError as err:  # running nodes hold the rest: theirs hold the images already
                print(f"filling {len(leases)} node stores, not {stores}: {err}", flush=True)
                break
            held.callback(lease.release, clean=not lease.dirty)
            leases.append(lease)
        for number, lease in enumerate(leases):
            if lease.dirty:
                print(f"node store {lease.path} was left by a killed node: its next node cleans it", flush=True)
                continue
            if filled and not (lease.path / CONTENT).exists():
                print(f"node store {lease.path.name}: linked to {filled[0].name}'s images", flush=True)
                clone(filled[0], lease.path)
            with containerd_on(lease.path, names[0], work / str(number)) as socket:
                for name in names:
                    print(f"importing {name} into node store {lease.path.name}", flush=True)
                    importer(name, socket, lease.path)
            filled.append(lease.path)
    return filled


CONTENT = "io.containerd.content.v1.content"
"""containerd's content store in a node store: present once any image was imported."""


DATABASES = ("io.containerd.metadata.v1.bolt/meta.db", "io.containerd.snapshotter.v1.overlayfs/metadata.db")
"""What containerd writes in place in a store: copied, never linked."""
NOT_SHARED = (
    f"{CONTENT}/ingest",
    "tmpmounts",
    "io.containerd.grpc.v1.introspection",
    "io.containerd.runtime.v1.linux",
    "io.containerd.runtime.v2.task",
    *store.CRI_STATE,
)
"""Work in progress and one containerd's own state (an import's partial blobs, temporary mounts, its UUID, tasks,
the CRI's sandboxes and containers): left out of a clone, made afresh by its containerd."""


def clone(source: Path, target: Path) -> None:
    """Fill the empty store ``target`` from the filled store ``source`` without a second copy of the images (6 GB a
    store): every file hard-linked, as containerd never changes a content blob or a committed snapshot once
    written (a container writes in a snapshot of its own, and a removal only unlinks), but its databases copied,
    which it writes in place. Made beside the target and renamed into place, so a clone cut short leaves no store
    that shares a database. Both stores must be stopped (no containerd on either)."""
    staging = target.with_name(target.name + ".clone")
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run(["cp", "-al", str(source), str(staging)], check=True)
    for name in NOT_SHARED:
        shutil.rmtree(staging / name, ignore_errors=True)
    for name in DATABASES:
        path = staging / name
        if path.exists():
            path.unlink()  # the link to the source's database goes; a copy takes its place
            shutil.copy2(source / name, path)
    (staging / store.IN_USE).unlink(missing_ok=True)  # a link to the source's mark: this store's own is made anew
    (staging / store.IN_USE).touch()
    shutil.rmtree(target)
    staging.rename(target)


FILL_SOCKETS_ROOT = Path("/run/ddpjob-fill")
"""The fill's containerd sockets: outside the host's socket root, where a running node would count its containerd as
another node's (``leftovers.live_nodes``)."""


@contextmanager
def containerd_on(root: Path, sandbox_image: str, work: Path) -> Iterator[Path]:
    """A containerd on the store at ``root``, configured as a node's is (its state, sockets and log under
    ``work``); yields its socket and stops it after."""
    layout = NodeLayout(work, root, sockets_root=FILL_SOCKETS_ROOT)
    containerd = start_containerd(layout, sandbox_image, work / "containerd.log")
    try:
        yield layout.containerd_socket
    finally:
        containerd.stop()
        shutil.rmtree(layout.socket_dir, ignore_errors=True)
        with suppress(OSError):
            FILL_SOCKETS_ROOT.rmdir()  # only when no other fill's sockets are there


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ddpjob_box.kubenode.store_fill", description=__doc__)
    parser.add_argument("--stores", type=int, default=1, help="how many node stores to fill (default 1)")
    args = parser.parse_args(argv)
    stop_like_ctrl_c()
    if shutil.which("containerd") is None:
        print("ddpjob: containerd is missing: run 'make system-packages'", file=sys.stderr)
        sys.exit(2)
    try:
        with tempfile.TemporaryDirectory(prefix="ddpjob-store-fill-") as work:
            filled = fill(args.stores, node_images(), local_images.import_into_containerd, Path(work))
    except BoxError as err:
        print(f"ddpjob: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"node stores ready: {', '.join(str(path) for path in filled) or 'none'}", flush=True)


if __name__ == "__main__":
    main()
