"""The GPU recipe's script: its targets per device, its table, its CPU smoke run, and its one line without a GPU.

No test here asserts a timing: the CPU figures check the script, not the recipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import common, ddp_cpu, gpu_recipe

SMOKE = ["--device", "cpu", "--model", "tinycnn", "--image-size", "16", "--batch-size", "4", "--amp", "none",
         "--no-channels-last", "--num-workers", "0", "--warmup", "1", "--measure", "1", "--repeats", "1"]  # fmt: skip


@pytest.mark.parametrize(
    ("device", "compiled", "stretch"),
    [
        ("NVIDIA H200", 4900.0, 5500.0),
        ("NVIDIA H100 80GB HBM3", 4300.0, None),
        ("NVIDIA H100 PCIe", None, None),  # lower power than the SXM part the target was set on
        ("NVIDIA H200 NVL", None, None),
        ("NVIDIA GH200 480GB", None, None),
        ("NVIDIA A100-SXM4-80GB", None, None),
        ("CPU (smoke run)", None, None),
    ],
)
def test_the_compiled_trainer_is_held_to_the_target_of_the_device_torch_names(
    device: str, compiled: float | None, stretch: float | None
):
    assert gpu_recipe.target_for(device, gpu_recipe.COMPILED_TARGETS) == compiled
    assert gpu_recipe.target_for(device, gpu_recipe.STRETCH_TARGETS) == stretch


def _run(img_per_s: float, syncs: int = 0, sites: dict[str, int] | None = None) -> dict[str, Any]:
    return {"img_per_s": img_per_s, "syncs_in_window": syncs, "sync_sites": sites or {}}


RUNS = {
    gpu_recipe.TRAINER: [_run(4450.0), _run(4400.0), _run(4460.0)],
    gpu_recipe.PLAIN: [_run(4455.0), _run(4450.0), _run(4470.0)],
    gpu_recipe.COMPILED: [_run(5000.0), _run(4990.0, 1, {"train.py:9": 1}), _run(5010.0)],
}


def test_on_an_h200_the_ratio_the_compiled_trainer_its_stretch_and_the_syncs_each_get_a_verdict():
    lines, targets = gpu_recipe.summarize(RUNS, "NVIDIA H200")
    assert [(label, verdict) for label, _, _, verdict in targets] == [
        ("GPU: trainer / plain loop", "met"),  # the pairs' ratios 0.999, 0.989, 0.998: median 0.998
        ("GPU: compiled trainer img/s", "met"),
        ("GPU: compiled trainer img/s, stretch", "MISSED"),
        ("GPU: host-device syncs in a trainer's window (most in one run)", "MISSED"),  # the compiled one's counts
    ]
    assert targets[0][1] == pytest.approx(4460 / 4470)
    assert lines[0].startswith("- trainer / plain loop: **0.998 (0.989-0.999)**; target >= 0.99")
    assert "target >= 4900 on NVIDIA H200: **met**" in lines[1]
    assert lines[-1].endswith(": **1**; target 0: **MISSED** (at train.py:9)")
    assert lines[2] == "- compiled trainer img/s, stretch: **5000**; target >= 5500: **MISSED**"


def test_on_a_device_without_a_target_the_compiled_figure_is_reported_without_a_verdict():
    lines, targets = gpu_recipe.summarize(RUNS, "NVIDIA A100-SXM4-80GB")
    assert "- compiled trainer img/s: **5000**; no target for NVIDIA A100-SXM4-80GB" in lines
    assert [label for label, *_ in targets] == [
        "GPU: trainer / plain loop",
        "GPU: host-device syncs in a trainer's window (most in one run)",
    ]


def test_the_table_has_a_row_per_program_with_its_spread_and_most_syncs():
    assert gpu_recipe.rows(RUNS) == [
        [gpu_recipe.TRAINER, "4450.0 (4400.0-4460.0)", 0],
        [gpu_recipe.PLAIN, "4455.0 (4450.0-4470.0)", 0],
        [gpu_recipe.COMPILED, "5000.0 (4990.0-5010.0)", 1],
    ]


def test_the_cpu_smoke_run_times_the_trainer_the_plain_loop_and_the_compiled_trainer(tmp_path: Path):
    result = gpu_recipe.main([*SMOKE, "--out", str(tmp_path)])
    data = json.loads((tmp_path / "gpu_recipe.json").read_text())
    assert list(data["runs"]) == [gpu_recipe.TRAINER, gpu_recipe.PLAIN, gpu_recipe.COMPILED]
    assert all(r["img_per_s"] > 0 and "syncs_in_window" in r for rs in data["runs"].values() for r in rs)
    assert data["device"] == "CPU (smoke run)"
    assert "no target for CPU (smoke run)" in result["markdown"]
    assert (tmp_path / "gpu_recipe.md").read_text().startswith("### GPU recipe (")


def test_without_a_gpu_the_recipe_says_so_in_one_line_and_exits_2(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_recipe", "--out", str(tmp_path)],
        cwd=common.REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == gpu_recipe.NO_GPU
    assert not (tmp_path / "gpu_recipe.json").exists()


def test_the_textbook_script_counts_syncs_on_the_device_it_trains_on(tmp_path: Path):
    argv = [*ddp_cpu.torchrun(1), "-m", "bench.textbook_ddp", "--sync-check", "--model", "tinycnn",
            "--image-size", "16", "--batch-size", "4", "--warmup", "1", "--measure", "1"]  # fmt: skip
    result = common.run_child(argv, env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}, timeout=300)
    # on CPU it counts the host reads a GPU would wait for; the synthetic dataset's labels are such reads
    assert result["syncs_in_window"] > 0, result
