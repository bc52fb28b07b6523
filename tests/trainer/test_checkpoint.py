"""Checkpoints are atomic: only renamed-into-place files count, and a damaged one is skipped."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from ddp_trainer import checkpoint


def state(step: int) -> dict[str, Any]:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return {
        "format": checkpoint.FORMAT,
        "step": step,
        "epoch": 0,
        "batch_in_epoch": step,
        "world_size": 1,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": torch.amp.GradScaler("cpu", enabled=False).state_dict(),
        "rng": [checkpoint.rng_state(torch.device("cpu"))],
    }


def test_a_saved_checkpoint_loads_back_with_the_same_contents(tmp_path: Path) -> None:
    saved = state(7)
    checkpoint.save(str(tmp_path), saved, keep=3)
    loaded = checkpoint.load_latest(str(tmp_path), torch.device("cpu"))
    assert loaded is not None and loaded["step"] == 7
    for name, value in saved["model"].items():
        assert torch.equal(loaded["model"][name], value)
    assert os.listdir(tmp_path) == ["step-000000007.pt"]


def test_the_newest_checkpoint_wins_and_only_the_newest_few_are_kept(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        checkpoint.save(str(tmp_path), state(step), keep=2)
    assert sorted(os.listdir(tmp_path)) == ["step-000000006.pt", "step-000000008.pt"]
    loaded = checkpoint.load_latest(str(tmp_path), torch.device("cpu"))
    assert loaded is not None and loaded["step"] == 8


def test_a_temp_file_from_a_killed_write_is_never_loaded_and_is_cleaned_up(tmp_path: Path) -> None:
    checkpoint.save(str(tmp_path), state(2), keep=3)
    torch.save(state(4), tmp_path / ".step-000000004.pt.tmp-12345")  # complete, but never renamed
    loaded = checkpoint.load_latest(str(tmp_path), torch.device("cpu"))
    assert loaded is not None and loaded["step"] == 2
    checkpoint.remove_stale_temps(str(tmp_path))
    assert os.listdir(tmp_path) == ["step-000000002.pt"]


def test_a_torn_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    checkpoint.save(str(tmp_path), state(2), keep=3)
    newest = checkpoint.save(str(tmp_path), state(4), keep=3)
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    loaded = checkpoint.load_latest(str(tmp_path), torch.device("cpu"))
    assert loaded is not None and loaded["step"] == 2


def test_a_file_that_is_not_a_trainer_checkpoint_is_skipped(tmp_path: Path) -> None:
    checkpoint.save(str(tmp_path), state(2), keep=3)
    torch.save({"step": 4}, tmp_path / "step-000000004.pt")
    loaded = checkpoint.load_latest(str(tmp_path), torch.device("cpu"))
    assert loaded is not None and loaded["step"] == 2


def test_no_directory_or_no_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    assert checkpoint.load_latest(str(tmp_path / "absent"), torch.device("cpu")) is None
    assert checkpoint.load_latest(str(tmp_path), torch.device("cpu")) is None


def test_rng_states_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    random.seed(1)
    torch.manual_seed(1)
    saved = state(1)
    expected = (random.random(), torch.rand(3))
    checkpoint.save(str(tmp_path), saved, keep=1)
    random.seed(99)
    torch.manual_seed(99)
    loaded = checkpoint.load_latest(str(tmp_path), torch.device("cpu"))
    assert loaded is not None
    checkpoint.set_rng_state(loaded["rng"][0], torch.device("cpu"))
    assert random.random() == expected[0]
    assert torch.equal(torch.rand(3), expected[1])
