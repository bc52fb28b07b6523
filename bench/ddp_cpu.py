"""Benchmark 3: DDP on CPU with gloo, 1 and 2 ranks: our trainer against the textbook torchrun script.

    python -m bench.ddp_cpu
    python -m bench.ddp_cpu --preset classic --threads 8   # on a bigger machine

Both programs run under ``torchrun --standalone`` at the same settings, with the same number of
CPU threads per rank (``--threads``, OMP_NUM_THREADS; one core per rank is the CPU analogue of one
GPU per rank, so 2 ranks fit the 2 cores of the machine the README figures come from). The four variants
(2 programs x 2 world sizes) alternate, their order flipping every repetition.

Reports: trainer / textbook img/s per world size (target >= 1.0), weak-scaling efficiency from 1
to 2 ranks (img/s at 2 over twice img/s at 1, batch per rank fixed), and the classic benchmark's
table of per-iteration forward+backward milliseconds for each world size.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import workload
from bench.common import (
    RESULTS_DIR,
    Spread,
    alternate,
    compare,
    log,
    machine,
    need_trainer,
    percentile,
    publish,
    ratio_lines,
    ratio_targets,
    run_child,
    table,
)

NAME = "ddp_cpu"
TARGET = 1.0
PROGRAMS = {"trainer": "bench.trainer_probe", "textbook": "bench.textbook_ddp"}


def torchrun(world_size: int) -> list[str]:
    # --standalone: a rendezvous on a free local port, so concurrent runs on the machine never collide
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}"]


def command(program: str, world_size: int, w: workload.Workload) -> list[str]:
    if program == "trainer":
        return [*torchrun(world_size), "-m", PROGRAMS[program], f"--warmup={w.warmup}", f"--measure={w.measure}",
                "--", *w.trainer_args()]  # fmt: skip
    return [*torchrun(world_size), "-m", PROGRAMS[program], *w.loop_args()]


def summarize(
    runs: dict[str, list[dict[str, Any]]], sizes: Sequence[int]
) -> tuple[dict[int, dict[str, Spread]], dict[str, dict[str, Spread]], list[list[Any]]]:
    """Trainer/textbook ratios per world size, weak-scaling efficiency per program, and the classic table's rows.

    Efficiency by the wall clock: img/s at n ranks over n times img/s at 1. By CPU time: images per
    CPU-second of a rank at n ranks over the same at 1 (the extra CPU work communication costs).
    """
    ratios = {ws: compare(runs, f"trainer x{ws}", f"textbook x{ws}") for ws in sizes}
    efficiency: dict[str, dict[str, Spread]] = {}
    if len(sizes) >= 2:
        one, many = sizes[0], sizes[1]
        for p in PROGRAMS:
            small, big = runs[f"{p} x{one}"], runs[f"{p} x{many}"]
            efficiency[p] = {
                "img_per_s": Spread.of(
                    [b["img_per_s"] / (a["img_per_s"] * many / one) for a, b in zip(small, big, strict=True)]
                ),
                "img_per_cpu_s": Spread.of(
                    [b["img_per_cpu_s"] / a["img_per_cpu_s"] for a, b in zip(small, big, strict=True)]
                ),
            }
    rows = []
    for ws in sizes:
        for p in PROGRAMS:
            rs = runs[f"{p} x{ws}"]
            ms = [x for r in rs for x in r["fwd_bwd_ms"]]
            median = Spread.of([r["img_per_s"] for r in rs]).median
            cpu = Spread.of([r["img_per_cpu_s"] for r in rs]).median
            rows.append([ws, p, *(f"{percentile(ms, q):.1f}" for q in (50, 75, 90, 95)), f"{median:.1f}",
                         f"{median / ws:.1f}", f"{cpu:.1f}"])  # fmt: skip
    return ratios, efficiency, rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    need_trainer("python -m bench.ddp_cpu")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser)
    parser.add_argument("--world-sizes", default="1,2", help="comma-separated; efficiency compares the first two")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)
    sizes = [int(s) for s in args.world_sizes.split(",")]

    log(f"{NAME}: {w.describe()}, world sizes {sizes}, {args.repeats} rounds")

    def variant(program: str, ws: int) -> Callable[[], dict[str, Any]]:
        return lambda: run_child(command(program, ws, w), env=w.env)

    runs = alternate(args.repeats, {f"{p} x{ws}": variant(p, ws) for ws in sizes for p in PROGRAMS})
    ratios, efficiency, classic_rows = summarize(runs, sizes)
    headers = ["world size", "program", "p50", "p75", "p90", "p95", "img/s", "img/s/rank", "img per CPU-s of a rank"]
    lines = [
        f"### DDP on CPU, gloo ({w.describe()})",
        "",
        "Per-iteration forward+backward in ms (backward includes the overlapped all-reduce), over every measured "
        f"step of {args.repeats} runs; throughputs are medians of the runs:",
        "",
        table(headers, classic_rows),
        "",
    ]
    for ws, r in ratios.items():
        lines += ratio_lines(f"trainer / textbook at {ws} rank(s)", r, TARGET, args.repeats)
    for p, e in efficiency.items():
        lines.append(f"- weak-scaling efficiency {sizes[0]} -> {sizes[1]} ranks, {p}: wall clock "
                     f"**{e['img_per_s'].show()}**, CPU time per image **{e['img_per_cpu_s'].show()}**")  # fmt: skip
    markdown = "\n".join(lines)
    data = {"name": NAME, "workload": asdict(w), "machine": machine(), "runs": runs,
            "trainer_over_textbook": {str(k): v for k, v in ratios.items()},
            "weak_scaling_efficiency": efficiency, "target": TARGET}  # fmt: skip
    targets = [t for ws, r in ratios.items() for t in ratio_targets(f"trainer / textbook DDP, {ws} rank(s)", r, TARGET)]
    targets += [(f"weak-scaling efficiency 1 -> 2, {p} (wall clock)", e["img_per_s"].median, "(reported)", "")
                for p, e in efficiency.items()]  # fmt: skip
    return publish(NAME, data, markdown, args.out, targets)


if __name__ == "__main__":
    main()
