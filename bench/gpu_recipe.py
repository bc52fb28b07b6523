"""Benchmark 5: the GPU recipe: ResNet-50, bf16 autocast, channels_last, batch 256, on one GPU.

    python -m bench.gpu_recipe                  # needs a GPU; without one it says so and exits 0
    python -m bench.gpu_recipe --num-workers 14 # if the data column shows the loader cannot keep up

Alternates the plain loop (one process, no DDP) and our trainer under ``torchrun
--nproc-per-node 1`` (DDP on one GPU, NCCL), one process per run. In both, the measured window
opens and closes with a ``torch.cuda.synchronize()`` (two per run, so it holds exactly the
device work of its steps), and in between ``torch.cuda.set_sync_debug_mode("warn")`` reports every
host-device synchronization, which the run counts.

Targets (taken on one H100): the trainer >= 3,500 img/s; trainer (DDP, 1 GPU) / plain loop >= 0.98;
no host-device synchronization inside the trainer's window.
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
from bench.ddp_cpu import torchrun

NAME = "gpu_recipe"
NO_GPU = "gpu_recipe: no GPU here (torch.cuda.is_available() is False): nothing measured; run it on a CUDA machine"
IMG_TARGET = 3500.0
RATIO_TARGET = 0.98


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser, preset="gpu")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)

    import torch

    if not torch.cuda.is_available():
        print(NO_GPU)
        return {"name": NAME, "markdown": "", "targets": [], "skipped": NO_GPU}
    gpu = torch.cuda.get_device_name(0)

    log(f"{NAME}: {w.describe()} on {gpu}, {args.repeats} pairs")
    plain = [sys.executable, "-m", "bench.plain_loop", "--sync-check", *w.loop_args()]
    trainer = [*torchrun(1), "-m", "bench.trainer_probe", "--sync-check", f"--warmup={w.warmup}",
               f"--measure={w.measure}", "--", *w.trainer_args()]  # fmt: skip
    runs = alternate(
        args.repeats,
        {
            "trainer, DDP on 1 GPU": lambda: run_child(trainer, env=w.env),
            "plain loop": lambda: run_child(plain, env=w.env),
        },
    )
    ips = {name: [r["img_per_s"] for r in rs] for name, rs in runs.items()}
    trainer_ips = Spread.of(ips["trainer, DDP on 1 GPU"])
    ratio = paired_ratios(ips["trainer, DDP on 1 GPU"], ips["plain loop"])
    syncs = {name: max(r["syncs_in_window"] for r in rs) for name, rs in runs.items()}
    sites = sorted({s for r in runs["trainer, DDP on 1 GPU"] for s in r["sync_sites"]})
    rows = [[name, Spread.of(v).show(1), syncs[name]] for name, v in ips.items()]
    markdown = "\n".join([
        f"### GPU recipe ({w.describe()}, {gpu})",
        "",
        table(["program", "img/s, median (range)", "host-device syncs in the window (most in a run)"], rows),
        "",
        f"- trainer img/s: **{trainer_ips.median:.0f}**; target >= {IMG_TARGET:g}: "
        f"**{verdict(trainer_ips.median, IMG_TARGET)}**",
        f"- trainer (DDP, 1 GPU) / plain loop: **{ratio.show()}**; target >= {RATIO_TARGET}: "
        f"**{verdict(ratio.median, RATIO_TARGET)}**",
        f"- syncs per trainer run inside the window: **{syncs['trainer, DDP on 1 GPU']}**; target 0: "
        f"**{verdict(syncs['trainer, DDP on 1 GPU'], 0, at_most=True)}**"
        + (f" (at {', '.join(sites)})" if sites else ""),
    ])  # fmt: skip
    data = {"name": NAME, "workload": asdict(w), "machine": machine(), "runs": runs, "trainer_img_per_s": trainer_ips,
            "ratio": ratio, "syncs": syncs}  # fmt: skip
    write_results(NAME, data, markdown, args.out)
    print(markdown)
    targets = [
        ("GPU: trainer img/s", trainer_ips.median, f">= {IMG_TARGET:g}", verdict(trainer_ips.median, IMG_TARGET)),
        ("GPU: trainer DDP 1 GPU / plain loop", ratio.median, f">= {RATIO_TARGET}",
         verdict(ratio.median, RATIO_TARGET)),
        ("GPU: syncs in the trainer's window", syncs["trainer, DDP on 1 GPU"], "0",
         verdict(syncs["trainer, DDP on 1 GPU"], 0, at_most=True)),
    ]  # fmt: skip
    return {"name": NAME, "markdown": markdown, "targets": targets}


if __name__ == "__main__":
    main()
