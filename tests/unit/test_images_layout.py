"""The images cache's OCI layout: an earlier version's layout is removed, the current one kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpjob_box import images


def test_the_earlier_gzip_layout_is_dropped_and_the_current_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDPJOB_CACHE", str(tmp_path))
    assert images.layout_dir().name not in images.EARLIER_LAYOUTS
    for layout in (images.images_dir() / "oci", images.layout_dir()):
        (layout / "blobs" / "sha256").mkdir(parents=True)
        (layout / "blobs" / "sha256" / "0123").write_bytes(b"layer")
    images.drop_earlier_layouts()
    assert not (images.images_dir() / "oci").exists()
    assert (images.layout_dir() / "blobs" / "sha256" / "0123").read_bytes() == b"layer"
