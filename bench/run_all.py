"""``make bench``: every benchmark at its default size, one after the other, then a summary of the targets.

    python -m bench.run_all                       # about 15 minutes on a 2-core VM
    python -m bench.run_all --only trainer_vs_plain,ddp_cpu

Each benchmark writes ``bench/results/<name>.json`` and ``.md``; this adds ``bench/results/summary.md``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import ddp_cpu, gpu_recipe, instrumentation, operator_scale, trainer_vs_plain
from bench.common import RESULTS_DIR, log, machine, stop_on_sigterm, table

BENCHMARKS: dict[str, Callable[[Sequence[str] | None], dict[str, Any]]] = {
    "trainer_vs_plain": trainer_vs_plain.main,
    "instrumentation": instrumentation.main,
    "ddp_cpu": ddp_cpu.main,
    "operator_scale": operator_scale.main,
    "gpu_recipe": gpu_recipe.main,
}


def _value(v: float) -> str:
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")

    sections, rows, skipped = [], [], []
    for name in names:
        started = time.monotonic()
        log(f"== {name}")
        result = BENCHMARKS[name](["--out", str(args.out)])
        log(f"== {name}: {time.monotonic() - started:.0f}s")
        if result.get("skipped"):
            skipped.append(f"- {name}: {result['skipped']}")
            continue
        sections.append(result["markdown"])
        rows += [[label, _value(value), target, v] for label, value, target, v in result["targets"]]

    m = machine()
    summary = "\n\n".join([
        "## Benchmark summary",
        f"Taken {m['date']} on {m['cpus']} CPUs ({m['cpu']}), GPU: {m.get('gpu', 'none')}, torch {m.get('torch')}, "
        f"load average at the end {m['load_average']}.",
        table(["figure", "median", "target", "verdict"], rows),
        *skipped,
        *sections,
    ])  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    raise SystemExit(main())
