"""Data: nothing downloaded, samples fixed by (seed, epoch, index), and exact mid-epoch resume."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import Dataset, DistributedSampler

from ddp_trainer import data
from ddp_trainer.config import DataConfig
from ddp_trainer.data import ResumableSampler
from ddp_trainer.errors import DataError


def build(cfg: DataConfig, *, rank: int = 0, world_size: int = 1, batch_size: int = 2) -> data.Data:
    return data.build(
        cfg, image_size=16, num_classes=0, batch_size=batch_size, seed=0,
        rank=rank, world_size=world_size, pin_memory=False,
    )  # fmt: skip


def indices(d: data.Data, epoch: int, skip: int = 0) -> list[int]:
    d.dataset.epoch = epoch
    d.sampler.set_epoch(epoch, skip * d.batch_size)
    return list(d.sampler)


def test_a_synthetic_sample_depends_only_on_its_index() -> None:
    ds = data.SyntheticImages(samples=10, image_size=8, num_classes=5, seed=0)
    later_image, later_label = ds[7]
    for i in range(10):
        ds[i]
    image, label = ds[7]
    assert torch.equal(image, later_image) and label == later_label
    assert not torch.equal(ds[6][0], image)
    assert image.shape == (3, 8, 8) and 0 <= label < 5


def test_ranks_split_the_data_without_overlap_and_reshuffle_every_epoch() -> None:
    cfg = DataConfig(synthetic_samples=16, num_workers=0)
    ranks = [build(cfg, rank=r, world_size=2) for r in range(2)]
    epoch0 = [indices(d, 0) for d in ranks]
    assert sorted(epoch0[0] + epoch0[1]) == list(range(16))
    assert indices(ranks[0], 1) != epoch0[0]


def test_resuming_mid_epoch_yields_exactly_the_remaining_batches() -> None:
    d = build(DataConfig(synthetic_samples=16, num_workers=0))
    full = [labels.tolist() for _, labels in d.epoch(3, 0)]
    resumed = [labels.tolist() for _, labels in d.epoch(3, 5)]
    assert len(full) == d.batches_per_epoch == 8
    assert resumed == full[5:]


class Indices(Dataset[int]):
    """0..n-1: what the sampler orders (it reads only the length)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


@settings(max_examples=40, deadline=None)
@given(
    samples=st.integers(1, 50),
    world=st.integers(1, 4),
    epoch=st.integers(0, 5),
    data=st.data(),
)
def test_a_resumed_sampler_yields_the_suffix_of_the_uninterrupted_order(
    samples: int, world: int, epoch: int, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, world - 1))
    inner: DistributedSampler[int] = DistributedSampler(Indices(samples), world, rank, shuffle=True, seed=3)
    sampler = ResumableSampler(inner)
    sampler.set_epoch(epoch)
    full = list(sampler)
    start = data.draw(st.integers(0, len(full)))
    sampler.set_epoch(epoch, start)
    assert list(sampler) == full[start:]
    assert len(sampler) == len(full) - start


def test_a_dataset_smaller_than_one_batch_per_rank_is_a_data_error() -> None:
    with pytest.raises(DataError, match="--batch-size"):
        build(DataConfig(synthetic_samples=3, num_workers=0), world_size=2, batch_size=2)


def write_cifar(directory: Path, batches: int = 2, per_batch: int = 4) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for b in range(1, batches + 1):
        raw = {
            b"data": bytes(range(256)) * (per_batch * 3072 // 256),
            b"labels": [(b + i) % 10 for i in range(per_batch)],
        }
        (directory / f"data_batch_{b}").write_bytes(pickle.dumps(raw))


def test_cifar10_reads_the_local_python_batches_in_or_above_cifar_10_batches_py(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar-10-batches-py")
    d = build(DataConfig(data="cifar10", data_dir=str(tmp_path), num_workers=0))
    assert len(d.dataset) == 8 and d.num_classes == 10
    assert isinstance(d.dataset, data.Seeded) and isinstance(d.dataset.inner, data.CifarBatches)
    pixels = d.dataset.inner.images
    assert pixels.dtype == torch.uint8
    assert pixels[0, 0, 0, :4].tolist() == [0, 1, 2, 3]  # the bytes, in CHW order
    images, labels = next(d.epoch(0, 0))
    assert images.shape == (2, 3, 16, 16) and images.dtype == torch.float32
    assert all(0 <= int(label) < 10 for label in labels)


def test_a_cifar10_directory_without_batches_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data_batch_"):
        build(DataConfig(data="cifar10", data_dir=str(tmp_path), num_workers=0))


def test_augmentation_is_repeatable_per_epoch_and_index_and_leaves_the_caller_rng_alone(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    ds = build(DataConfig(data="cifar10", data_dir=str(tmp_path), num_workers=0)).dataset
    torch.manual_seed(5)
    expected_next = torch.rand(2)
    torch.manual_seed(5)
    ds.epoch = 1
    first = [ds[i][0] for i in range(8)]
    assert torch.equal(torch.rand(2), expected_next)
    assert all(torch.equal(a, ds[i][0]) for i, a in enumerate(first))
    ds.epoch = 2
    assert any(not torch.equal(a, ds[i][0]) for i, a in enumerate(first)), "augmentation must vary by epoch"


def test_imagefolder_takes_one_class_per_subdirectory(tmp_path: Path) -> None:
    for cls in ("cat", "dog", "emu"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (20, 24), (i * 40, 80, 120)).save(tmp_path / cls / f"{i}.png")
    d = build(DataConfig(data="imagefolder", data_dir=str(tmp_path), num_workers=0))
    assert d.num_classes == 3 and len(d.dataset) == 6
    images, _ = next(d.epoch(0, 0))
    assert images.shape == (2, 3, 16, 16)


def test_an_imagefolder_without_class_directories_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="one subdirectory of images per class"):
        build(DataConfig(data="imagefolder", data_dir=str(tmp_path), num_workers=0))
