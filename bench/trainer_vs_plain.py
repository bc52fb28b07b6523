"""Benchmark 1: the trainer against the plain single-process loop, same model, batch, precision, format.

    python -m bench.trainer_vs_plain                 # resnet18, 64 px, batch 16 on CPU: a few minutes
    python -m bench.trainer_vs_plain --preset classic

Both run alone (no process group), one process per run, alternated. Target: trainer/plain img/s >= 0.98.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import workload
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

NAME = "trainer_vs_plain"
TARGET = 0.98


def trainer_probe(w: workload.Workload, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bench.trainer_probe", f"--warmup={w.warmup}", f"--measure={w.measure}",
            *extra, "--", *w.trainer_args()]  # fmt: skip


def plain_loop(w: workload.Workload) -> list[str]:
    return [sys.executable, "-m", "bench.plain_loop", *w.loop_args()]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    need_trainer("python -m bench.trainer_vs_plain")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)

    log(f"{NAME}: {w.describe()}, {args.repeats} pairs")
    runs = alternate(
        args.repeats,
        {
            "trainer": lambda: run_child(trainer_probe(w), env=w.env),
            "plain loop": lambda: run_child(plain_loop(w), env=w.env),
        },
    )
    ratios = compare(runs, "trainer", "plain loop")
    markdown = throughput_report(
        f"### Trainer vs plain loop ({w.describe()})",
        runs,
        ratio_lines("trainer / plain loop", ratios, TARGET, args.repeats),
    )
    data = {"name": NAME, "workload": asdict(w), "machine": machine(), "runs": runs, "ratios": ratios,
            "target": TARGET}  # fmt: skip
    return publish(NAME, data, markdown, args.out, ratio_targets("trainer / plain loop", ratios, TARGET))


if __name__ == "__main__":
    main()
