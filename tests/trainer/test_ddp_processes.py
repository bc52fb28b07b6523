"""Real processes, gloo on CPU, two ranks, a tiny model: the behaviour the issue asks to be shown."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler

from ddp_trainer import data, models
from ddpjob_contract.exits import EXIT_OK

from .procs import TINY, dumper, explain, processes, run_ranks

STEPS = 3
COMMON = (*TINY, "--lr-schedule", "constant", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4")


def load_ranks(out: Path, world: int = 2) -> list[dict[str, torch.Tensor]]:
    return [torch.load(out / f"rank{r}.pt", weights_only=True)["state"] for r in range(world)]


def one_process_on_the_concatenated_batches(steps: int, accum: int) -> dict[str, torch.Tensor]:
    """Plain SGD in this process on rank 0's batch followed by rank 1's, step after step."""
    torch.manual_seed(0)  # the trainer's default seed, set before it builds the model
    model = models.build("tinycnn", data.SYNTHETIC_CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    dataset = data.SyntheticImages(samples=64, image_size=16, num_classes=data.SYNTHETIC_CLASSES, seed=0)
    orders = []
    for rank in range(2):
        sampler: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(0)
        orders.append(list(sampler))
    per_step = 4 * accum
    for step in range(steps):
        indices = [i for order in orders for i in order[step * per_step : (step + 1) * per_step]]
        images = torch.stack([dataset[i][0] for i in indices])
        labels = torch.tensor([dataset[i][1] for i in indices])
        loss = nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return model.state_dict()


@pytest.mark.parametrize("accum", [1, 2])
def test_two_ranks_end_with_identical_parameters_equal_to_one_process_on_the_concatenated_batch(
    tmp_path: Path, accum: int
) -> None:
    with processes() as procs:
        done = run_ranks(
            procs,
            dumper(tmp_path, *COMMON, "--steps", str(STEPS), "--grad-accum-steps", str(accum)),
        )
    assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)
    rank0, rank1 = load_ranks(tmp_path)
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), f"{name} differs between ranks"

    expected = one_process_on_the_concatenated_batches(STEPS, accum)
    torch.manual_seed(0)
    initial = models.build("tinycnn", data.SYNTHETIC_CLASSES).state_dict()
    for name, value in expected.items():
        assert not torch.equal(value, initial[name]), f"{name} did not train; the comparison would be empty"
        torch.testing.assert_close(rank0[name], value, rtol=1e-4, atol=1e-6, msg=f"{name} differs")


def test_a_run_killed_after_step_k_resumes_to_the_same_parameters_as_an_uninterrupted_run(tmp_path: Path) -> None:
    # 64 samples / 2 ranks / batch 4 = 8 steps per epoch; 10 steps cross an epoch boundary, and
    # the kill at step 5 loses step 5 (last checkpoint at 4), so the resumed run redoes it mid-epoch.
    args = (*TINY, "--steps", "10", "--deterministic", "--checkpoint-interval", "2")
    straight, crashed, resumed = tmp_path / "straight", tmp_path / "crashed", tmp_path / "resumed"
    for d in (straight, crashed, resumed):
        d.mkdir()
    with processes() as procs:
        done = run_ranks(procs, dumper(straight, *args, "--checkpoint-dir", str(straight / "ckpt")))
        assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)

        ckpt = str(crashed / "ckpt")
        done = run_ranks(procs, dumper(crashed, *args, "--checkpoint-dir", ckpt, "--crash-at-step", "5"))
        assert [d.returncode for d in done] == [-9, -9], explain(done)
        assert not list(crashed.glob("rank*.pt")), "the crashed run must not have finished"

        done = run_ranks(procs, dumper(resumed, *args, "--checkpoint-dir", ckpt))
        assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)

    assert "resumed from step 4" in done[0].stdout
    assert torch.load(resumed / "rank0.pt", weights_only=True)["steps_run"] == 6
    expected = load_ranks(straight)
    for rank, got in enumerate(load_ranks(resumed)):
        for name, value in expected[rank].items():
            assert torch.equal(got[name], value), f"rank {rank}: {name} differs after resume"
