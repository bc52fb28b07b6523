"""What the two reference programs share: flags, model, data and the per-step body.

They are written the way the classic tutorials write them (a DataLoader, then forward, loss,
zero_grad, backward, step), with nothing of the trainer's: no timer, no metrics, no scheduler.
The synthetic data does the same work per sample as the trainer's, so data cost is equal.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any, TextIO

import torch
from torch import nn
from torch.utils.data import Dataset

from bench.common import Window, device_sync

AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "resnet50", "tinycnn"])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--measure", type=int, default=12)
    parser.add_argument("--sync-check", action="store_true", help="count host-device syncs inside the window (GPU)")


class RandomImages(Dataset[tuple[torch.Tensor, int]]):
    """Random images and labels, fixed per index: the classic benchmark's synthetic data."""

    def __init__(self, samples: int, image_size: int, num_classes: int = 1000) -> None:
        self.samples, self.image_size, self.num_classes = samples, image_size, num_classes

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(index)
        image = torch.randn(3, self.image_size, self.image_size, generator=g)
        return image, int(torch.randint(self.num_classes, (), generator=g))


def build_model(name: str, num_classes: int = 1000) -> nn.Module:
    if name == "tinycnn":
        from ddp_trainer.models import TinyCNN  # the model only; nothing of the trainer's loop

        return TinyCNN(num_classes)
    import torchvision

    model: nn.Module = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    return model


def memory_format(args: argparse.Namespace) -> torch.memory_format:
    return torch.channels_last if args.channels_last else torch.contiguous_format


class SyncCounter:
    """Counts the host-device synchronizations ``torch.cuda.set_sync_debug_mode`` reports while on."""

    def __init__(self) -> None:
        self.count = 0
        self.where: dict[str, int] = {}
        self._previous: Callable[..., Any] | None = None

    def start(self) -> None:
        self._previous = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        if self._previous is not None:
            warnings.showwarning = self._previous

    def _show(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if "synchroniz" in str(message):
            self.count += 1
            key = f"{filename}:{lineno}"
            self.where[key] = self.where.get(key, 0) + 1
        elif self._previous is not None:
            self._previous(message, category, filename, lineno, file, line)


def window(args: argparse.Namespace, device: torch.device, syncs: SyncCounter | None) -> Window:
    return Window(
        args.warmup,
        args.measure,
        sync=device_sync(device.type),
        on_open=syncs.start if syncs else lambda: None,
        on_close=syncs.stop if syncs else lambda: None,
    )


def result(
    args: argparse.Namespace, w: Window, world_size: int, fwd_bwd_ms: list[float], syncs: SyncCounter | None
) -> dict[str, Any]:
    out: dict[str, Any] = {**w.figures(args.batch_size, world_size), "world_size": world_size, "fwd_bwd_ms": fwd_bwd_ms}
    if syncs is not None:
        out |= {"syncs_in_window": syncs.count, "sync_sites": syncs.where}
    return out
