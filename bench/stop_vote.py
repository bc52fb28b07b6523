"""What save-on-stop's per-step vote costs: the trainer at 2 ranks with the vote, against the same without it.

    python -m bench.stop_vote                       # resnet18, 64 px, batch 16 per rank, gloo on CPU
    python -m bench.stop_vote --model tinycnn --image-size 16 --batch-size 8   # a step of a few ms: the worst case

With a checkpoint directory, every rank all-reduces one integer through gloo at each step boundary, so that all stop
at the same step when one is asked to (trainer/ddp_trainer/train.py). Both variants run the trainer unchanged
under ``torchrun --standalone``, with the same checkpoint directory and no periodic saves (``--checkpoint-interval
0``, so nothing is written inside the window); ``no vote`` sets ``--stop-grace-seconds 0``, which turns
save-on-stop, and with it the vote, off. They alternate, their order flipping every repetition. Target: with /
without >= 0.98 img/s, the same bar as the trainer against the plain loop.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import ddp_cpu, workload
from bench.common import (
    RESULTS_DIR,
    alternate,
    compare,
    log,
    machine,
    need_trainer,
    publish,
    ratio_lines,
    ratio_targets,
    run_child,
    throughput_report,
)

NAME = "stop_vote"
TARGET = 0.98
VARIANTS = {"vote": ["--stop-grace-seconds=30"], "no vote": ["--stop-grace-seconds=0"]}


def command(w: workload.Workload, world_size: int, checkpoint_dir: Path, stop: Sequence[str]) -> list[str]:
    """bench.ddp_cpu's trainer under torchrun, with a checkpoint directory that is never written inside the window."""
    return [*ddp_cpu.command("trainer", world_size, w), f"--checkpoint-dir={checkpoint_dir}", "--checkpoint-interval=0",
            *stop]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    need_trainer("python -m bench.stop_vote")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser)
    parser.add_argument("--world-size", type=int, default=2, help="ranks (the vote is a no-op at 1)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)
    log(f"{NAME}: {w.describe()}, {args.world_size} ranks, {args.repeats} pairs")

    with tempfile.TemporaryDirectory(prefix="ddpjob-stop-vote-") as tmp:

        def variant(name: str) -> Callable[[], dict[str, Any]]:
            # A directory per run: the trainer saves at its end, and a run must not resume from the last one's.
            def run() -> dict[str, Any]:
                directory = Path(tempfile.mkdtemp(dir=tmp))
                return run_child(command(w, args.world_size, directory, VARIANTS[name]), env=w.env)

            return run

        runs = alternate(args.repeats, {name: variant(name) for name in VARIANTS})
    ratios = compare(runs, "vote", "no vote")
    markdown = throughput_report(
        f"### Save-on-stop's vote ({w.describe()}, {args.world_size} ranks, gloo)",
        runs,
        ratio_lines("with the vote / without", ratios, TARGET, args.repeats),
    )
    data = {"name": NAME, "workload": asdict(w), "world_size": args.world_size, "machine": machine(), "runs": runs,
            "vote_over_no_vote": ratios, "target": TARGET}  # fmt: skip
    return publish(NAME, data, markdown, args.out, ratio_targets("save-on-stop's vote", ratios, TARGET))


if __name__ == "__main__":
    main()
