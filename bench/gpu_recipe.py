"""Benchmark 5: the GPU recipe: ResNet-50, bf16 autocast, channels_last, batch 256, on one GPU.

    python -m bench.gpu_recipe --repeats 3      # needs a GPU; without one it says so in one line and exits 2
    python -m bench.gpu_recipe --num-workers 14 # if the data column shows the loader cannot keep up
    python -m bench.gpu_recipe --device cpu --model tinycnn --image-size 16 --batch-size 4 --amp none \\
        --no-channels-last --num-workers 0 --warmup 1 --measure 1 --repeats 1   # the CPU smoke run of the tests

Alternates three programs, one process per run: our trainer under ``torchrun --nproc-per-node 1``
(one rank, so no DDP wrapper), the plain loop (one process, no launcher), and the trainer again with
``--compile``. In each, the measured window opens and closes with a ``torch.cuda.synchronize()``
(two per run, so it holds exactly the device work of its steps), and in between
``torch.cuda.set_sync_debug_mode("warn")`` reports every host-device synchronization, which the run
counts. A compiled run's first step holds the compilation; it is a warm-up step, outside the window.

Targets (issue 29): trainer / plain loop >= 0.99, the ratio of the runs taken side by side; the
compiled trainer >= 4,900 img/s on an H200, >= 4,300 on an H100 (SXM), with no verdict on another
device; no host-device synchronization inside either trainer's window. Stretch, on an H200: the
compiled trainer >= 5,500 img/s. The stretch candidates (a fused SGD step, CUDA graphs, batches made
on the GPU) are not trainer options, so nothing here switches them.

``--device cpu`` runs the same three programs on the CPU (CUDA hidden from them): a smoke run of the
script, its figures no measure of the recipe. On CPU the sync counter counts the ops that would make
the host wait for a device, host tensors' reads included (``bench.loops.SyncCounter``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import workload
from bench.common import (
    RESULTS_DIR,
    Spread,
    Target,
    alternate,
    log,
    machine,
    need_trainer,
    paired_ratios,
    publish,
    run_child,
    table,
    verdict,
)
from bench.ddp_cpu import torchrun

NAME = "gpu_recipe"
NO_GPU = "gpu_recipe: no GPU here (torch.cuda.is_available() is False): nothing measured; run it on a CUDA machine"
RATIO_TARGET = 0.99
# The compiled trainer's img/s, by the device name torch reports. Taken on the SXM parts lent here
# ("NVIDIA H200", "NVIDIA H100 80GB HBM3"); the PCIe and NVL parts run at lower power, a GH200 is another machine.
COMPILED_TARGETS: tuple[tuple[str, float], ...] = ((r"\bH200\b(?!.*\bNVL\b)", 4900.0), (r"\bH100\b.*\bHBM3\b", 4300.0))
STRETCH_TARGETS: tuple[tuple[str, float], ...] = ((r"\bH200\b(?!.*\bNVL\b)", 5500.0),)

TRAINER = "trainer (torchrun, 1 rank)"
PLAIN = "plain loop"
COMPILED = "trainer --compile"


def target_for(device: str, targets: Sequence[tuple[str, float]]) -> float | None:
    """The target of the first pattern the device name matches; None on a device no target was set for."""
    return next((value for pattern, value in targets if re.search(pattern, device)), None)


def rows(runs: Mapping[str, list[dict[str, Any]]]) -> list[list[Any]]:
    """One row per program: img/s median (range), and the most host-device syncs one run's window saw."""
    return [
        [name, Spread.of([r["img_per_s"] for r in rs]).show(1), max(r["syncs_in_window"] for r in rs)]
        for name, rs in runs.items()
    ]


def summarize(runs: Mapping[str, list[dict[str, Any]]], device: str) -> tuple[list[str], list[Target]]:
    """The verdict lines under the table, and the targets for ``run_all``'s summary."""
    ips = {name: [r["img_per_s"] for r in rs] for name, rs in runs.items()}
    ratio = paired_ratios(ips[TRAINER], ips[PLAIN])
    compiled = Spread.of(ips[COMPILED]).median
    syncs = max(r["syncs_in_window"] for name in (TRAINER, COMPILED) for r in runs[name])
    sites = sorted({s for name in (TRAINER, COMPILED) for r in runs[name] for s in r["sync_sites"]})
    lines: list[str] = []
    targets: list[Target] = []

    def judged(label: str, shown: str, value: float, target: float, *, at_most: bool = False, where: str = "") -> None:
        met = verdict(value, target, at_most=at_most)
        lines.append(f"- {label}: **{shown}**; target {'' if at_most else '>= '}{target:g}{where}: **{met}**")
        targets.append((f"GPU: {label}", value, f"{'' if at_most else '>= '}{target:g}", met))

    judged("trainer / plain loop", ratio.show(), ratio.median, RATIO_TARGET)
    img_target, stretch = target_for(device, COMPILED_TARGETS), target_for(device, STRETCH_TARGETS)
    if img_target is None:
        lines.append(f"- compiled trainer img/s: **{compiled:.0f}**; no target for {device}")
    else:
        judged("compiled trainer img/s", f"{compiled:.0f}", compiled, img_target, where=f" on {device}")
    if stretch is not None:
        judged("compiled trainer img/s, stretch", f"{compiled:.0f}", compiled, stretch)
    lines.append(f"- compiled trainer / trainer: {paired_ratios(ips[COMPILED], ips[TRAINER]).show()} (no target)")
    judged("host-device syncs in a trainer's window (most in one run)", str(syncs), syncs, 0, at_most=True)
    if sites:
        lines[-1] += f" (at {', '.join(sites)})"
    return lines, targets


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    need_trainer("python -m bench.gpu_recipe")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser, preset="gpu")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke run of the script, with CUDA hidden from the programs")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)

    import torch

    env = dict(w.env)
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the programs pick the GPU whenever they see one
        device = "CPU (smoke run)"
    elif not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return {"name": NAME, "markdown": "", "targets": [], "skipped": NO_GPU}
    else:
        device = torch.cuda.get_device_name(0)

    log(f"{NAME}: {w.describe()} on {device}, {args.repeats} repetitions")
    plain = [sys.executable, "-m", "bench.plain_loop", "--sync-check", *w.loop_args()]
    trainer = [*torchrun(1), "-m", "bench.trainer_probe", "--sync-check", f"--warmup={w.warmup}",
               f"--measure={w.measure}", "--", *w.trainer_args()]  # fmt: skip
    runs = alternate(
        args.repeats,
        {
            TRAINER: lambda: run_child(trainer, env=env),
            PLAIN: lambda: run_child(plain, env=env),
            COMPILED: lambda: run_child([*trainer, "--compile"], env=env),
        },
    )
    lines, targets = summarize(runs, device)
    markdown = "\n".join([
        f"### GPU recipe ({w.describe()}, {device})",
        "",
        table(["program", "img/s, median (range)", "host-device syncs in the window (most in a run)"], rows(runs)),
        "",
        *lines,
    ])  # fmt: skip
    data = {"name": NAME, "workload": asdict(w), "machine": machine(), "device": device, "runs": runs,
            "targets": targets}  # fmt: skip
    return publish(NAME, data, markdown, args.out, targets)


if __name__ == "__main__":
    raise SystemExit(2 if main().get("skipped") else 0)
