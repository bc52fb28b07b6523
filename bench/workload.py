"""The training workload every throughput benchmark runs, and the flags that choose it.

The default is CPU-friendly: a full benchmark takes a few minutes on two cores. ``--preset classic``
is the classic benchmark's ResNet-50 at 224 px, batch 128; ``--preset gpu`` the GPU recipe.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"model": "resnet18", "image_size": 64, "batch_size": 16, "warmup": 3, "measure": 12},
    "classic": {"model": "resnet50", "image_size": 224, "batch_size": 128, "warmup": 5, "measure": 20},
    "gpu": {"model": "resnet50", "image_size": 224, "batch_size": 256, "amp": "bf16", "channels_last": True,
            "num_workers": 10, "warmup": 20, "measure": 100},
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Workload:
    model: str = "resnet18"
    image_size: int = 64
    batch_size: int = 16
    amp: str = "none"
    channels_last: bool = False
    num_workers: int = 0
    warmup: int = 3
    measure: int = 12
    threads: int = 1
    """CPU threads per process (OMP_NUM_THREADS). One: on a shared machine a team of threads stalls
    whenever another tenant preempts one of them, which makes the wall clock swing tenfold."""

    @property
    def steps(self) -> int:
        return self.warmup + self.measure

    @property
    def env(self) -> dict[str, str]:
        return {"OMP_NUM_THREADS": str(self.threads)}

    def _model_args(self) -> list[str]:
        """The flags the trainer and the reference loops spell the same way."""
        return [
            f"--model={self.model}",
            f"--image-size={self.image_size}",
            f"--batch-size={self.batch_size}",
            f"--amp={self.amp}",
            "--channels-last" if self.channels_last else "--no-channels-last",
            f"--num-workers={self.num_workers}",
        ]

    def trainer_args(self) -> list[str]:
        """The same workload as ``python -m ddp_trainer`` flags (synthetic data, no checkpoints)."""
        return [
            *self._model_args(),
            f"--steps={self.steps}",
            "--data=synthetic",
            f"--synthetic-samples={self.samples}",
            "--lr-schedule=constant",
            f"--log-interval={self.steps}",
        ]

    def loop_args(self) -> list[str]:
        """The same workload as flags of ``bench.plain_loop`` and ``bench.textbook_ddp``."""
        return [
            *self._model_args(),
            f"--warmup={self.warmup}",
            f"--measure={self.measure}",
        ]

    @property
    def samples(self) -> int:
        """Enough synthetic samples for every step on up to 8 ranks, so no run crosses an epoch boundary."""
        return self.batch_size * self.steps * 8

    def describe(self) -> str:
        fmt = ", channels_last" if self.channels_last else ""
        return (
            f"{self.model}, {self.image_size} px, batch {self.batch_size} per rank, amp {self.amp}{fmt}, "
            f"{self.num_workers} loader workers, {self.threads} thread(s) per process, "
            f"{self.warmup} warm-up + {self.measure} measured steps"
        )


def add_arguments(parser: argparse.ArgumentParser, *, preset: str = "cpu") -> None:
    defaults = Workload(**PRESETS[preset])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=preset, help="start from these sizes")
    parser.add_argument("--model", choices=["resnet18", "resnet50", "tinycnn"], help=f"default {defaults.model}")
    parser.add_argument("--image-size", type=int, help=f"default {defaults.image_size}")
    parser.add_argument("--batch-size", type=int, help=f"per rank; default {defaults.batch_size}")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], help=f"default {defaults.amp}")
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--num-workers", type=int, help=f"DataLoader workers; default {defaults.num_workers}")
    parser.add_argument("--warmup", type=int, help=f"steps before the window; default {defaults.warmup}")
    parser.add_argument("--measure", type=int, help=f"steps in the window; default {defaults.measure}")
    parser.add_argument("--threads", type=int, help=f"OMP_NUM_THREADS per process; default {defaults.threads}")
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs (at least 5 for reported figures)")


def from_arguments(args: argparse.Namespace) -> Workload:
    chosen = Workload(**PRESETS[args.preset])
    overrides = {f.name: getattr(args, f.name) for f in fields(Workload) if getattr(args, f.name, None) is not None}
    return replace(chosen, **overrides)
