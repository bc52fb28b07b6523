"""The node's containerd store, leased from the cache: one node per slot, images kept, a dirty store marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpjob_box.kubenode import store


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDPJOB_CACHE", str(tmp_path))
    return tmp_path


def test_a_second_node_beside_the_first_gets_its_own_store() -> None:
    first, second = store.lease(), store.lease()
    try:
        assert first.path != second.path
    finally:
        first.release(clean=True)
        second.release(clean=True)


def test_a_clean_release_keeps_the_images_for_the_next_node_and_drops_the_last_nodes_sandboxes() -> None:
    first = store.lease()
    (first.path / "io.containerd.content.v1.content").mkdir()
    (first.path / "io.containerd.grpc.v1.cri" / "sandboxes" / "abc").mkdir(parents=True)
    first.release(clean=True)
    again = store.lease()
    try:
        assert again.path == first.path
        assert (again.path / "io.containerd.content.v1.content").is_dir()
        assert not (again.path / "io.containerd.grpc.v1.cri" / "sandboxes").exists()
    finally:
        again.release(clean=True)


def test_a_store_whose_node_died_keeps_its_images_and_is_leased_dirty_until_a_clean_release() -> None:
    first = store.lease()
    assert not first.dirty
    (first.path / "io.containerd.content.v1.content").mkdir()
    (first.path / "io.containerd.grpc.v1.cri" / "containers" / "abc").mkdir(parents=True)
    first.release(clean=False)  # what a killed node amounts to: the lock goes with the process, the mark stays
    again = store.lease()
    try:
        assert (again.path, again.dirty) == (first.path, True)
        assert (again.path / "io.containerd.content.v1.content").is_dir(), "its images stand"
        again.drop_cri_state()  # the node removed the dead node's containers
        assert not (again.path / "io.containerd.grpc.v1.cri" / "containers").exists()
    finally:
        again.release(clean=True)
    after = store.lease()
    after.release(clean=True)
    assert not after.dirty


def test_a_dirty_store_whose_containers_cannot_be_removed_is_wiped() -> None:
    lease = store.lease()
    try:
        (lease.path / "io.containerd.content.v1.content").mkdir()
        lease.wipe()
        assert list(lease.path.iterdir()) == [lease.path / store.IN_USE]
    finally:
        lease.release(clean=True)


def test_when_every_slot_is_taken_the_error_says_what_to_stop() -> None:
    held = [store.lease(slots=2) for _ in range(2)]
    try:
        with pytest.raises(store.BoxError, match="in use by running nodes; stop a box"):
            store.lease(slots=2)
    finally:
        for lease in held:
            lease.release(clean=True)


def test_a_store_filled_by_linking_shares_the_images_files_but_copies_containerds_databases(tmp_path: Path) -> None:
    from ddpjob_box.kubenode.store_fill import CONTENT, clone

    source, target = tmp_path / "0", tmp_path / "1"
    blob = source / CONTENT / "blobs" / "sha256" / "aa"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"layer")
    meta = source / "io.containerd.metadata.v1.bolt" / "meta.db"
    meta.parent.mkdir(parents=True)
    meta.write_bytes(b"bolt")
    (source / store.IN_USE).touch()
    image_file = source / "io.containerd.snapshotter.v1.overlayfs" / "snapshots" / "1" / "fs" / "var" / "lib.db"
    image_file.parent.mkdir(parents=True)
    image_file.write_bytes(b"an image's file")
    partial = source / CONTENT / "ingest" / "abc" / "data"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"half")
    target.mkdir()
    clone(source, target)
    linked_file = target / image_file.relative_to(source)
    assert linked_file.stat().st_ino == image_file.stat().st_ino, "an image's own .db file is the image's: linked"
    assert not (target / CONTENT / "ingest" / "abc").exists(), "an import under way is not shared"
    assert not target.with_name("1.clone").exists()
    linked = target / CONTENT / "blobs" / "sha256" / "aa"
    assert linked.stat().st_ino == blob.stat().st_ino, "one copy of the images on disk"
    copied = target / "io.containerd.metadata.v1.bolt" / "meta.db"
    assert copied.read_bytes() == b"bolt" and copied.stat().st_ino != meta.stat().st_ino, "written in place: a copy"
    assert (target / store.IN_USE).stat().st_ino != (source / store.IN_USE).stat().st_ino
