"""What the two reference programs share: flags, model, data and the per-step body.

They are written the way the classic tutorials write them (a DataLoader, then forward, loss,
zero_grad, backward, step), with nothing of the trainer's: no timer, no metrics, no scheduler.
The synthetic data does the same work per sample as the trainer's, so data cost is equal.
"""

from __future__ import annotations

import argparse
import os
import traceback
import warnings
from collections.abc import Callable
from typing import Any, TextIO

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
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
    parser.add_argument("--sync-check", action="store_true", help="count host-device syncs inside the window")


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


GPU = torch.device("cuda")


class SyncCounter:
    """Counts the host-device synchronizations between ``start()`` and ``stop()``, and where they happen.

    On a GPU, what ``torch.cuda.set_sync_debug_mode("warn")`` reports: every implicit synchronization
    (``.item()``, a copy to the host, ``nonzero``...), at the cost of one flag test per call. On CPU
    nothing waits for a device, so it counts the calls that would: the ops whose result the host must
    read (``HOST_READS``), seen through a dispatch mode. That is how a CPU test shows a loop's count.
    On CPU it cannot tell a device value from a host one, so it also counts reads a GPU run makes of
    host tensors (a dataset's ``int(torch.randint(...))``, the CPU timer's ``float(loss)``), and every
    op pays a Python call: read its sites, and time nothing with it on.

    The window's own synchronizations are not counted: ``Window`` calls ``start()`` after its opening
    ``synchronize`` and ``stop()`` before its closing one, and ``stop()`` turns the counting off first.
    So a loop that never waits for the device counts 0, and "0 host-device syncs per step" can be shown.
    """

    def __init__(self, device: torch.device = GPU) -> None:
        self.count = 0
        self.where: dict[str, int] = {}
        self.on_gpu = device.type == "cuda"
        self._counting = False
        self._previous: Callable[..., Any] | None = None
        self._reads = _HostReads(self._saw)

    def start(self) -> None:
        """Counting begins once the mode is on: a warning the switch itself raises is not the loop's (on an H200,
        torch 2.11 raised one per run, attributed to the line of ``set_sync_debug_mode``)."""
        if self.on_gpu:
            self._previous = warnings.showwarning
            warnings.simplefilter("always")
            warnings.showwarning = self._show
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._reads.__enter__()  # type: ignore[no-untyped-call]
        self._counting = True

    def stop(self) -> None:
        self._counting = False
        if self.on_gpu:
            torch.cuda.set_sync_debug_mode("default")
            if self._previous is not None:
                warnings.showwarning = self._previous
        else:
            self._reads.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    def _saw(self, site: str) -> None:
        if self._counting:
            self.count += 1
            self.where[site] = self.where.get(site, 0) + 1

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
            self._saw(f"{filename}:{lineno}")
        elif self._previous is not None:
            self._previous(message, category, filename, lineno, file, line)


# Ops whose output the host reads, so that on a GPU they wait for the device: `.item()`, `float()` and
# `bool()` reach `_local_scalar_dense`; the others size their output by the data.
HOST_READS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::equal"})


class _HostReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Reports each op of ``HOST_READS``, with the first caller outside torch and this file."""

    def __init__(self, saw: Callable[[str], None]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.saw = saw

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func._schema.name in HOST_READS:
            self.saw(_caller())
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(torch_dir) and frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno}"
    return "?"


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
