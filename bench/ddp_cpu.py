"""Benchmark 3: DDP on CPU with gloo, 1 and 2 ranks: our trainer against the textbook torchrun script.

    python -m bench.ddp_cpu
    python -m bench.ddp_cpu --preset classic --threads-per-rank 8   # on a bigger machine

Both programs run under ``torchrun --standalone`` at the same settings, with the same number of
CPU threads per rank (``OMP_NUM_THREADS``; one core per rank is the CPU analogue of one GPU per
rank, so 2 ranks fit the 2 cores of the machine the README figures come from). The four variants
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
    log,
    machine,
    paired_ratios,
    percentile,
    run_child,
    table,
    verdict,
    write_results,
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
) -> tuple[dict[int, Spread], dict[str, Spread], list[list[Any]]]:
    """Trainer/textbook ratio per world size, weak-scaling efficiency per program, and the classic table's rows."""
    ips = {name: [r["img_per_s"] for r in rs] for name, rs in runs.items()}
    ratios = {ws: paired_ratios(ips[f"trainer x{ws}"], ips[f"textbook x{ws}"]) for ws in sizes}
    efficiency: dict[str, Spread] = {}
    if len(sizes) >= 2:
        one, many = sizes[0], sizes[1]
        for p in PROGRAMS:
            pairs = zip(ips[f"{p} x{many}"], ips[f"{p} x{one}"], strict=True)
            efficiency[p] = Spread.of([a / (b * many / one) for a, b in pairs])
    rows = []
    for ws in sizes:
        for p in PROGRAMS:
            ms = [x for r in runs[f"{p} x{ws}"] for x in r["fwd_bwd_ms"]]
            median = Spread.of(ips[f"{p} x{ws}"]).median
            rows.append([ws, p, *(f"{percentile(ms, q):.1f}" for q in (50, 75, 90, 95)), f"{median:.1f}",
                         f"{median / ws:.1f}"])  # fmt: skip
    return ratios, efficiency, rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser)
    parser.add_argument("--world-sizes", default="1,2", help="comma-separated; efficiency compares the first two")
    parser.add_argument("--threads-per-rank", type=int, default=1, help="OMP_NUM_THREADS of every rank")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)
    sizes = [int(s) for s in args.world_sizes.split(",")]
    env = {"OMP_NUM_THREADS": str(args.threads_per_rank)}

    log(f"{NAME}: {w.describe()}, world sizes {sizes}, {args.threads_per_rank} thread(s) per rank, "
        f"{args.repeats} rounds")  # fmt: skip

    def variant(program: str, ws: int) -> Callable[[], dict[str, Any]]:
        return lambda: run_child(command(program, ws, w), env=env)

    runs = alternate(args.repeats, {f"{p} x{ws}": variant(p, ws) for ws in sizes for p in PROGRAMS})
    ratios, efficiency, classic_rows = summarize(runs, sizes)
    lines = [
        f"### DDP on CPU, gloo ({w.describe()}, {args.threads_per_rank} thread(s) per rank)",
        "",
        "Per-iteration forward+backward (backward includes the overlapped all-reduce), ms, "
        f"over every measured step of {args.repeats} runs:",
        "",
        table(["world size", "program", "p50", "p75", "p90", "p95", "img/s (median)", "img/s/rank"], classic_rows),
        "",
    ]
    for ws, r in ratios.items():
        lines.append(f"- trainer / textbook at {ws} rank(s): **{r.show()}**; target >= {TARGET}: "
                     f"**{verdict(r.median, TARGET)}**")  # fmt: skip
    for p, e in efficiency.items():
        lines.append(f"- weak-scaling efficiency {sizes[0]} -> {sizes[1]} ranks, {p}: **{e.show()}**")
    markdown = "\n".join(lines)
    data = {"name": NAME, "workload": asdict(w), "machine": machine(), "threads_per_rank": args.threads_per_rank,
            "runs": runs, "trainer_over_textbook": {str(k): v for k, v in ratios.items()},
            "weak_scaling_efficiency": efficiency, "target": TARGET}  # fmt: skip
    write_results(NAME, data, markdown, args.out)
    print(markdown)
    targets = [(f"trainer / textbook DDP, {ws} rank(s)", r.median, f">= {TARGET}", verdict(r.median, TARGET))
               for ws, r in ratios.items()]  # fmt: skip
    targets += [(f"weak-scaling efficiency, {p}", e.median, "(reported)", "") for p, e in efficiency.items()]
    return {"name": NAME, "markdown": markdown, "targets": targets}


if __name__ == "__main__":
    main()
