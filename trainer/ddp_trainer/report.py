"""The end-of-run summary in the classic benchmark format: throughput and ms per iteration."""

from __future__ import annotations

from collections.abc import Sequence

from ddp_trainer.config import Config
from ddp_trainer.metrics import PHASES, Saved, StepTiming
from ddpjob_contract import exits

COLUMNS = ("model", "world", "batch/rank", "img/s", "img/s/rank", "step ms", *(f"{p} ms" for p in PHASES))


def warmup_steps(n: int, *, compiled: bool = False) -> int:
    """Steps left out of the means: the first 10%, at most 10, so start-up cost does not skew them.

    A compiled run always leaves out its first step, which holds the compilation (seconds to minutes).
    """
    return min(10, max(n // 10, 1 if compiled and n > 1 else 0))


def _measured(timings: Sequence[StepTiming], compiled: bool) -> tuple[Sequence[StepTiming], float]:
    """The steps the means cover (warm-up left out), and this rank's samples per second over them."""
    kept = timings[warmup_steps(len(timings), compiled=compiled) :]
    seconds = sum(t.step_seconds for t in kept)
    return kept, sum(t.samples for t in kept) / seconds if seconds > 0 else 0.0


def exit_summary(
    steps: int,
    timings: Sequence[StepTiming],
    *,
    compiled: bool = False,
    restarts: int = 0,
    checkpoint: Saved | None = None,
) -> dict[str, float]:
    """This rank's final numbers, for its termination message: the same means as the summary table.

    ``step`` is the run's final step (a resumed run counts from its checkpoint); ``samples`` are those
    this process trained on. An untimed run (--no-step-timing) has no mean step time and no rate.
    """
    out: dict[str, float] = {exits.SUMMARY_STEP: steps, exits.SUMMARY_SAMPLES: sum(t.samples for t in timings)}
    if timings and timings[-1].timed:
        kept, per_rank = _measured(timings, compiled)
        out[exits.SUMMARY_STEP_SECONDS] = round(sum(t.step_seconds for t in kept) / len(kept), 6)
        out[exits.SUMMARY_SAMPLES_PER_SECOND] = round(per_rank, 3)
    if restarts:
        out[exits.SUMMARY_RESTARTS] = restarts
    if checkpoint is not None:
        out[exits.SUMMARY_CHECKPOINT_STEP] = checkpoint.step
        if checkpoint.saved_at > 0:
            out[exits.SUMMARY_CHECKPOINT_TIME] = round(checkpoint.saved_at, 3)
        if checkpoint.save_seconds is not None:
            out[exits.SUMMARY_CHECKPOINT_SAVE_SECONDS] = round(checkpoint.save_seconds, 3)
    return out


def summary_lines(cfg: Config, world_size: int, backend: str, device: str, timings: Sequence[StepTiming]) -> list[str]:
    if not timings:
        return ["summary: no steps run"]
    if not timings[-1].timed:
        return [f"summary: {len(timings)} steps, not timed (--no-step-timing)"]
    kept, per_rank = _measured(timings, cfg.model.compile)
    skip = len(timings) - len(kept)

    def ms(values: Sequence[float]) -> str:
        return f"{1000 * sum(values) / len(values):.1f}"

    row = (
        cfg.model.model,
        str(world_size),
        str(cfg.optim.batch_size),
        f"{per_rank * world_size:.1f}",
        f"{per_rank:.1f}",
        ms([t.step_seconds for t in kept]),
        *(ms([t.phase_seconds.get(p, 0.0) for t in kept]) for p in PHASES),
    )
    return [
        f"summary: {len(kept)} steps measured ({skip} warm-up left out), {cfg.model.image_size}px images, "
        f"amp {cfg.optim.amp}, strategy {cfg.dist.strategy}, backend {backend}, device {device}",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        "| " + " | ".join(row) + " |",
    ]
