"""Runs the trainer, unchanged, and times it from outside with the same window as the reference loops.

    python -m bench.trainer_probe --warmup 3 --measure 12 -- --model resnet18 --image-size 64
    torchrun --standalone --nproc-per-node 2 -m bench.trainer_probe -- --model resnet18

It does what ``python -m ddp_trainer`` does (parse the flags and the environment, then
``train.run``), with one hook: after the trainer closes each step (``StepTimer.finish``) the window
notes the time. So the window holds whole iterations of the trainer's loop, its bookkeeping
included, measured by the same clock as the plain loop's. Rank 0 emits one ``BENCH_RESULT`` line.
With the trainer's ``--no-step-timing`` the hook sits on ``UntimedSteps.finish`` instead.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

from bench import loops
from bench.common import Window, emit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--measure", type=int, default=12)
    parser.add_argument("--sync-check", action="store_true", help="count host-device syncs inside the window")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help="after --: the trainer's flags")
    args = parser.parse_args()
    trainer_args = [a for a in args.trainer_args if a != "--"]

    from ddp_trainer import timing, train
    from ddp_trainer.config import parse
    from ddp_trainer.launch import read_launch

    cfg = parse([*trainer_args, f"--steps={args.warmup + args.measure}"], os.environ)
    launch = read_launch(os.environ)
    train.setup_logging(launch.rank)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", launch.local_rank) if on_gpu else torch.device("cpu")
    syncs = loops.SyncCounter(device) if args.sync_check and launch.rank == 0 else None
    window = Window(
        args.warmup,
        args.measure,
        sync=torch.cuda.synchronize if on_gpu else lambda: None,
        on_open=syncs.start if syncs else lambda: None,
        on_close=syncs.stop if syncs else lambda: None,
    )

    for timer in (timing.StepTimer, timing.UntimedSteps):
        _note_finish(timer, window)

    result = train.run(cfg, launch)
    if launch.rank != 0:
        return
    measured = [t for t in result.timings if t.step > args.warmup and t.timed]
    out: dict[str, Any] = {
        **window.figures(cfg.optim.batch_size, launch.world_size),
        "world_size": launch.world_size,
        # the trainer's own per-phase timing of each measured step (CUDA events on GPU)
        "fwd_bwd_ms": [1000 * (t.phase_seconds["forward"] + t.phase_seconds["backward"]) for t in measured],
    }
    if syncs is not None:
        out |= {"syncs_in_window": syncs.count, "sync_sites": syncs.where}
    emit(out)


def _note_finish(timer: type[Any], window: Window) -> None:
    """After ``timer.finish`` closes a step, the window notes the time."""
    finish = timer.finish

    def finish_and_note(self: Any, step: int, samples: int, loss: torch.Tensor) -> None:
        finish(self, step, samples, loss)
        window.step_done(step)

    timer.finish = finish_and_note


if __name__ == "__main__":
    main()
