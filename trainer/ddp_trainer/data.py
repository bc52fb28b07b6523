"""Data sources and the loader. Nothing is downloaded; missing data is a permanent error.

Every sample is a pure function of (seed, epoch, index): synthetic images are generated from
that seed, and augmentation runs under it. So the batches do not depend on the number of
workers, and a run resumed mid-epoch sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from ddp_trainer.config import DataConfig
from ddp_trainer.errors import DataError

Sample = tuple[torch.Tensor, int]
Transform = Callable[[Any], torch.Tensor]

SYNTHETIC_CLASSES = 1000
_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics, as torchvision uses


def _sample_seed(seed: int, epoch: int, index: int) -> int:
    return (seed * 1_000_003 + epoch) * 2_147_483_647 + index & 0x7FFF_FFFF_FFFF_FFFF


class SyntheticImages(Dataset[Sample]):
    """Random 3xHxW images with random labels, as in the classic benchmark; fixed per index."""

    def __init__(self, *, samples: int, image_size: int, num_classes: int, seed: int) -> None:
        self.samples, self.image_size, self.num_classes, self.seed = samples, image_size, num_classes, seed
        self.epoch = 0  # unused: synthetic data is the same every epoch

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> Sample:
        g = torch.Generator().manual_seed(_sample_seed(self.seed, 0, index))
        image = torch.randn(3, self.image_size, self.image_size, generator=g)
        return image, int(torch.randint(self.num_classes, (), generator=g))


class Seeded(Dataset[Sample]):
    """Runs a dataset's random augmentation under a seed derived from (seed, epoch, index)."""

    def __init__(self, inner: Dataset[Sample], *, length: int, num_classes: int, seed: int) -> None:
        self.inner, self.length, self.num_classes, self.seed = inner, length, num_classes, seed
        self.epoch = 0  # set before each epoch's iterator is created; workers get a copy

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Sample:
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
            torch.manual_seed(_sample_seed(self.seed, self.epoch, index))
            return self.inner[index]


class CifarBatches(Dataset[Sample]):
    """CIFAR-10 from the python-pickle batch files (``data_batch_1`` .. ``data_batch_5``)."""

    def __init__(self, directory: str, transform: Transform) -> None:
        names = sorted(n for n in os.listdir(directory) if n.startswith("data_batch_"))
        if not names:
            raise DataError(
                f"--data-dir (TRAIN_DATA_DIR) {directory!r} has no CIFAR-10 data_batch_* files; "
                "point it at the extracted cifar-10-batches-py directory"
            )
        images: list[torch.Tensor] = []
        labels: list[int] = []
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as f:
                    # The official format is a pickle; only point this at files you trust.
                    batch = pickle.load(f, encoding="bytes")
                pixels = bytearray(batch[b"data"])  # bytes or a numpy uint8 array: both expose a buffer
                images.append(torch.frombuffer(pixels, dtype=torch.uint8).view(-1, 3, 32, 32))
                labels.extend(int(label) for label in batch[b"labels"])
            except (OSError, pickle.UnpicklingError, KeyError, EOFError, RuntimeError, TypeError) as err:
                raise DataError(f"CIFAR-10 file {path!r} is unreadable ({err}); replace it") from None
        self.images = torch.cat(images)
        self.labels = labels
        self.transform = transform
        if len(self.labels) != len(self.images):
            raise DataError(
                f"CIFAR-10 files in {directory!r} have {len(self.labels)} labels for "
                f"{len(self.images)} images; replace them"
            )

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Sample:
        return self.transform(self.images[index]), self.labels[index]


class ResumableSampler(Sampler[int]):
    """A DistributedSampler that can start part-way into an epoch, to resume mid-epoch."""

    def __init__(self, inner: DistributedSampler[int]) -> None:
        self.inner = inner
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.inner.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.inner)[self.start :])

    def __len__(self) -> int:
        return len(self.inner) - self.start


@dataclass
class Data:
    dataset: Seeded | SyntheticImages
    sampler: ResumableSampler
    loader: DataLoader[Sample]
    num_classes: int

    def epoch(self, epoch: int, skip_batches: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of one epoch, skipping those already trained on."""
        self.dataset.epoch = epoch
        self.sampler.set_epoch(epoch, skip_batches * self.batch_size)
        return iter(self.loader)

    @property
    def batch_size(self) -> int:
        assert self.loader.batch_size is not None
        return self.loader.batch_size

    @property
    def batches_per_epoch(self) -> int:
        """Full batches per rank per epoch (the ragged last one is dropped so ranks stay in step)."""
        return len(self.sampler.inner) // self.batch_size


def _train_transform(image_size: int, *, from_tensor: bool) -> Transform:
    from torchvision import transforms as T

    if from_tensor:  # CIFAR: uint8 CHW tensors, 32x32
        steps: list[Any] = [T.RandomCrop(32, padding=4)]
        if image_size != 32:
            steps.append(T.Resize(image_size, antialias=True))
        steps += [T.RandomHorizontalFlip(), T.ConvertImageDtype(torch.float32)]
    else:  # image files
        steps = [T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), T.ToTensor()]
    transform: Transform = T.Compose([*steps, T.Normalize(_MEAN, _STD)])
    return transform


def _source(cfg: DataConfig, image_size: int, num_classes: int, seed: int) -> Seeded | SyntheticImages:
    if cfg.data == "synthetic":
        classes = num_classes or SYNTHETIC_CLASSES
        return SyntheticImages(samples=cfg.synthetic_samples, image_size=image_size, num_classes=classes, seed=seed)
    if cfg.data == "cifar10":
        directory = cfg.data_dir
        nested = os.path.join(directory, "cifar-10-batches-py")
        cifar = CifarBatches(
            nested if os.path.isdir(nested) else directory, _train_transform(image_size, from_tensor=True)
        )
        return Seeded(cifar, length=len(cifar), num_classes=num_classes or 10, seed=seed)
    from torchvision.datasets import ImageFolder

    try:
        folder = ImageFolder(cfg.data_dir, transform=_train_transform(image_size, from_tensor=False))
    except (FileNotFoundError, OSError) as err:
        raise DataError(
            f"--data-dir (TRAIN_DATA_DIR) {cfg.data_dir!r} is not an image folder ({err}); "
            "it needs one subdirectory of images per class"
        ) from None
    return Seeded(folder, length=len(folder), num_classes=num_classes or len(folder.classes), seed=seed)


def build(
    cfg: DataConfig,
    *,
    image_size: int,
    num_classes: int,
    batch_size: int,
    seed: int,
    rank: int,
    world_size: int,
    pin_memory: bool,
) -> Data:
    dataset = _source(cfg, image_size, num_classes, seed)
    if len(dataset) < batch_size * world_size:
        raise DataError(
            f"the {cfg.data} data has {len(dataset)} samples, fewer than one batch on every rank "
            f"({batch_size} x {world_size}); lower --batch-size (TRAIN_BATCH_SIZE) or add data"
        )
    # The same seed on every rank: the ranks must agree on the permutation they split.
    sampler = ResumableSampler(DistributedSampler(dataset, world_size, rank, shuffle=True, seed=seed))
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=pin_memory,
        drop_last=True,
    )
    return Data(dataset=dataset, sampler=sampler, loader=loader, num_classes=dataset.num_classes)
