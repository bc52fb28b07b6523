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
    Spread,
    alternate,
    log,
    machine,
    paired_ratios,
    run_child,
    table,
    verdict,
    write_results,
)

NAME = "trainer_vs_plain"
TARGET = 0.98


def trainer_probe(w: workload.Workload, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bench.trainer_probe", f"--warmup={w.warmup}", f"--measure={w.measure}",
            *extra, "--", *w.trainer_args()]  # fmt: skip


def plain_loop(w: workload.Workload) -> list[str]:
    return [sys.executable, "-m", "bench.plain_loop", *w.loop_args()]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)

    log(f"{NAME}: {w.describe()}, {args.repeats} pairs")
    runs = alternate(
        args.repeats,
        {"trainer": lambda: run_child(trainer_probe(w)), "plain loop": lambda: run_child(plain_loop(w))},
    )
    ips = {name: [r["img_per_s"] for r in rs] for name, rs in runs.items()}
    ratio = paired_ratios(ips["trainer"], ips["plain loop"])
    rows = [[name, Spread.of(v).show(1), f"{Spread.of([r['step_ms'] for r in runs[name]]).median:.1f}"]
            for name, v in ips.items()]  # fmt: skip
    markdown = "\n".join([
        f"### Trainer vs plain loop ({w.describe()})",
        "",
        table(["program", "img/s, median (range)", "step ms, median"], rows),
        "",
        f"trainer / plain loop: **{ratio.show()}** over {args.repeats} pairs; "
        f"target >= {TARGET}: **{verdict(ratio.median, TARGET)}**",
    ])  # fmt: skip
    data = {"name": NAME, "workload": asdict(w), "machine": machine(), "runs": runs, "ratio": ratio,
            "target": TARGET, "verdict": verdict(ratio.median, TARGET)}  # fmt: skip
    write_results(NAME, data, markdown, args.out)
    print(markdown)
    return {"name": NAME, "markdown": markdown, "targets": [("trainer / plain loop", ratio.median, f">= {TARGET}",
                                                            verdict(ratio.median, TARGET))]}  # fmt: skip


if __name__ == "__main__":
    main()
