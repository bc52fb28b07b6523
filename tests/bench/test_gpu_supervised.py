"""bench.gpu_supervised on CPU: the manifest's trainer command under its supervisor (tinycnn and gloo in place of
ResNet-50 and NCCL), its child killed after a checkpoint and replaced, and the supervised/unsupervised pair."""

from __future__ import annotations

import json
from pathlib import Path

from bench import gpu_supervised


def test_the_manifests_command_is_read_and_its_options_replaced_in_place() -> None:
    args, env = gpu_supervised.manifest_trainer()
    assert "--model=resnet50" in args and "--compile" in args and env["NCCL_DEBUG"] == "WARN"
    changed = gpu_supervised.with_args(args, steps="40", compile=None, crash_at_step="20")
    assert "--steps=40" in changed and "--compile" not in changed and changed[-1] == "--crash-at-step=20"
    assert gpu_supervised.with_args(args, steps="40").index("--steps=40") == args.index("--steps=5000"), "in place"


def test_the_cpu_smoke_run_kills_the_child_which_resumes_from_its_checkpoint_and_pairs_the_throughputs(
    tmp_path: Path,
) -> None:
    argv = ["--device", "cpu", "--steps", "12", "--crash-at-step", "6", "--throughput-steps", "8", "--repeats", "1"]
    assert gpu_supervised.main([*argv, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu_supervised.json").read_text())
    killed = data["killed_child"]
    assert killed["ok"] and killed["summary"]["restarts"] == 1 and killed["summary"]["step"] == 12, killed
    assert "resumed from step 6" in killed["resumed"] and killed["kill_to_next_step_s"] > 0
    assert "killed by SIGKILL: restarting the gang in place" in killed["restarting_line"]
    assert [len(v) for v in data["throughput"]["img_per_s"].values()] == [1, 1]
