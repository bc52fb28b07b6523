"""DDP at no cost: no wrapper for one rank, bucket views for two, and checkpoints that load across both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ddp_trainer import checkpoint, data, models
from ddpjob_contract.exits import EXIT_OK

from .procs import TINY, dumper, explain, processes, run_ranks, trainer

PROBE = Path(__file__).with_name("ddp_probe.py")
STEPS = ("--steps", "3", "--lr-schedule", "constant")


def probe(out: Path, *args: str) -> list[str]:
    return [*trainer()[:1], str(PROBE), str(out), *args]


def reports(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_one_rank_under_a_launcher_trains_without_a_ddp_wrapper(tmp_path: Path) -> None:
    with processes() as procs:
        done = run_ranks(procs, probe(tmp_path, *TINY, *STEPS), world=1)
    assert [d.returncode for d in done] == [EXIT_OK], explain(done)
    (report,) = reports(tmp_path, 1)
    assert report["steps"] == 3
    assert report["ddp_built"] == []


def test_two_ranks_keep_their_gradients_in_ddp_buckets_at_every_step(tmp_path: Path) -> None:
    with processes() as procs:
        done = run_ranks(procs, probe(tmp_path, *TINY, *STEPS), world=2)
    assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)
    for report in reports(tmp_path, 2):
        # tinycnn's 6 gradients fit one bucket: as bucket views they share its storage, step after step
        # (the trainer sets them to None between steps, and DDP points them back into the bucket).
        assert report["params"] == 6
        assert report["grad_storages"] == [1, 1, 1]
        assert report["ddp_built"] == [{"gradient_as_bucket_view": True, "static_graph": False}]


def test_static_graph_is_an_opt_in(tmp_path: Path) -> None:
    with processes() as procs:
        done = run_ranks(procs, probe(tmp_path, *TINY, *STEPS, "--static-graph"), world=2)
    assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)
    for report in reports(tmp_path, 2):
        assert report["ddp_built"] == [{"gradient_as_bucket_view": True, "static_graph": True}]


def _checkpoint_model(directory: Path) -> dict[str, torch.Tensor]:
    state = checkpoint.load_latest(str(directory), torch.device("cpu"))
    assert state is not None
    model: dict[str, torch.Tensor] = state["model"]
    return model


def _dumped(out: Path, rank: int) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(out / f"rank{rank}.pt", weights_only=True)["state"]
    return state


def test_a_checkpoint_saved_without_ddp_loads_into_ddp_and_back_with_identical_tensors(tmp_path: Path) -> None:
    """Saved by one rank (no wrapper), loaded by two (DDP); saved by two, loaded by one.

    A run given --steps equal to the checkpoint's step trains nothing: its dumped model is what it loaded.
    """
    bare_keys = set(models.build("tinycnn", data.SYNTHETIC_CLASSES).state_dict())
    args = (*TINY, "--steps", "2", "--lr-schedule", "constant")
    for saver, loader in ((1, 2), (2, 1)):
        ckpt, out = tmp_path / f"from{saver}" / "ckpt", tmp_path / f"to{loader}"
        out.mkdir(parents=True)
        with processes() as procs:
            done = run_ranks(procs, dumper(ckpt.parent, *args, "--checkpoint-dir", str(ckpt)), world=saver)
            assert all(d.returncode == EXIT_OK for d in done), explain(done)
            done = run_ranks(procs, dumper(out, *args, "--checkpoint-dir", str(ckpt)), world=loader)
            assert all(d.returncode == EXIT_OK for d in done), explain(done)
        saved = _checkpoint_model(ckpt)
        assert set(saved) == bare_keys, f"saved by {saver} rank(s): the keys are not the bare model's"
        for rank in range(loader):
            loaded = _dumped(out, rank)
            assert set(loaded) == bare_keys
            for name, value in saved.items():
                assert torch.equal(loaded[name], value), f"saved by {saver}, loaded by {loader}: {name} differs"
