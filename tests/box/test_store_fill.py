"""The setup's fill of the node stores (kubenode.store_fill), with a real containerd: a node that then leases a
filled store imports nothing, and a store a running node holds, or a killed node left dirty, is not touched. And the
OCI layout the fill links from: plain tar layers, none written twice."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpjob_box import images
from ddpjob_box.kubenode import store, store_fill
from ddpjob_box.kubenode.configs import CONTAINERD_NAMESPACE
from tests import workers


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The node stores under the test's directory; the images stay in the machine's cache. Held as a node holds
    the host (shared): containerd mounts layers while it unpacks them, which a test comparing the host must not
    see."""
    root = tmp_path / "stores"
    monkeypatch.setattr(store, "stores_dir", lambda: root)
    with workers.host_lock(request.config, exclusive=False):
        yield root


def test_a_node_on_a_filled_store_finds_its_images_and_a_running_nodes_store_is_left_alone(
    stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a layout of its own: another worker's first export into the machine's layout may write the blobs this test
    # checks the links of
    monkeypatch.setattr(images, "layout_dir", lambda: tmp_path / "layout")
    pause = images.ensure_pause(quiet=True)
    running = store.lease()  # slot 0: a node runs on it
    try:
        filled = store_fill.fill(1, [pause], images.import_into_containerd, tmp_path / "fill")
    finally:
        running.release(clean=True)
    assert filled == [stores / "1"]
    layout_blobs = images.layout_dir() / "blobs" / "sha256"
    layers = [d.split(":")[1] for d in images._manifest_blobs(images.layout_dir(), images.export_layout(pause))[2:]]
    copied = [d for d in layers if not (layout_blobs / d).samefile(stores / "1" / images.CONTENT_BLOBS / d)]
    assert layers and not copied, "the image's layers were copied into the store, not linked from the layout"
    assert [p.name for p in (stores / "0").iterdir()] == [], "the running node's store was written to"
    node = store.lease()  # the next node: slot 0 is free again, so take slot 1 as a second node would
    second = store.lease()
    try:
        assert second.path == stores / "1" and not second.dirty
        with store_fill.containerd_on(second.path, pause, tmp_path / "node") as socket:
            assert images.import_into_containerd(pause, socket, second.path) is False, (
                "the node had to import its image"
            )
    finally:
        second.release(clean=True)
        node.release(clean=True)


def test_a_store_a_killed_node_left_dirty_is_left_to_the_next_node(stores: Path, tmp_path: Path) -> None:
    killed = store.lease()
    killed.lock.close()  # died holding it: the in-use mark stays
    imported: list[str] = []
    filled = store_fill.fill(1, ["pause"], lambda name, socket, root: imported.append(name), tmp_path / "fill")
    assert (filled, imported) == ([], [])
    again = store.lease()
    try:
        assert again.dirty, "the fill cleaned the mark a killed node left"
    finally:
        again.release(clean=True)


def test_an_image_whose_unpack_was_stopped_is_unpacked_again(stores: Path, tmp_path: Path) -> None:
    pause = images.ensure_pause(quiet=True)
    lease = store.lease()
    try:
        with store_fill.containerd_on(lease.path, pause, tmp_path / "node") as socket:
            images.import_into_containerd(pause, socket, lease.path)
            top = images.top_snapshot(images.export_layout(pause))
            ctr = ["ctr", "--address", str(socket), "-n", CONTAINERD_NAMESPACE, "snapshots"]
            subprocess.run([*ctr, "rm", top], check=True)  # what an import stopped before its last layer leaves
            assert images.import_into_containerd(pause, socket, lease.path) is True, (
                "the image's name alone was taken as imported"
            )
            listed = subprocess.run([*ctr, "ls"], check=True, capture_output=True, text=True).stdout
            assert top in listed, "the import did not unpack the image again"
            assert images.import_into_containerd(pause, socket, lease.path) is False
    finally:
        lease.release(clean=True)


def test_the_layout_holds_plain_tar_layers_and_an_export_again_writes_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain tar, so containerd unpacks without gunzipping; and a layer the layout holds is not written again, so
    a source change re-exports the trainer's small top layer, not its dependencies."""
    monkeypatch.setattr(images, "layout_dir", lambda: tmp_path / "layout")
    pause = images.ensure_pause(quiet=True)
    digest = images.export_layout(pause)
    layout = images.layout_dir()
    manifest = json.loads(images._blob(layout, digest).read_text())
    assert {layer["mediaType"] for layer in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar"}
    blobs = [images._blob(layout, layer["digest"]) for layer in manifest["layers"]]
    for blob in blobs:
        with blob.open("rb") as data:
            assert data.read(2) != b"\x1f\x8b", f"{blob.name} is gzip"
    written = [blob.stat().st_ino for blob in blobs]
    ident = images.image_id(pause)
    assert ident is not None
    (layout / "digests" / ident).unlink()  # forgotten: the export runs again
    assert images.export_layout(pause) == digest
    assert [blob.stat().st_ino for blob in blobs] == written, "the export wrote again a layer the layout held"
