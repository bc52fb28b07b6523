"""A model that fails to compile trains eagerly, after exactly one warning line; a job never fails for it.

Compilation is made to fail deterministically by backends that raise (``ddp_probe.FAILING_BACKENDS``):
in the forward compiler, or in the backward compiler, which torch runs lazily at the first backward
unless told otherwise. No C compiler is involved.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ddp_trainer import compiling, data, models
from ddpjob_contract.exits import EXIT_OK

from .ddp_probe import FAILING_BACKENDS
from .procs import TINY, explain, processes, run_ranks
from .test_ddp_at_no_cost import probe


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def train_steps(model: nn.Module, forward: nn.Module, steps: int = 3) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        images, labels = torch.randn(4, 3, 16, 16), torch.randint(data.SYNTHETIC_CLASSES, (4,))
        loss = nn.functional.cross_entropy(forward(images), labels)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("fails_in", ["forward", "backward"])
def test_a_model_that_fails_to_compile_trains_eagerly_after_one_warning_line(
    fails_in: str, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = models.build("tinycnn", data.SYNTHETIC_CLASSES)
    eager = copy.deepcopy(model)
    wrapped = compiling.CompileOrEager(model, functools.partial(torch.compile, backend=FAILING_BACKENDS[fails_in]))
    with caplog.at_level(logging.DEBUG):
        losses = train_steps(model, wrapped)
    assert losses == train_steps(eager, eager)
    for name, value in eager.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "torch.compile failed, training eagerly: "
        "BackendCompilerFailed (RuntimeError: this backend refuses to compile (a test's))"
    ]
    assert wrapped.compilation.failed


def test_a_model_that_compiles_says_how_long_its_first_call_took(caplog: pytest.LogCaptureFixture) -> None:
    model = models.build("tinycnn", data.SYNTHETIC_CLASSES)
    wrapped = compiling.CompileOrEager(model, functools.partial(torch.compile, backend="aot_eager"))
    with caplog.at_level(logging.WARNING):
        train_steps(model, wrapped)
    assert caplog.records == []
    assert wrapped.compilation.failed == "" and wrapped.compilation.seconds > 0


def test_two_ranks_whose_model_fails_to_compile_train_exactly_as_without_compile(tmp_path: Path) -> None:
    args = (*TINY, "--steps", "3", "--lr-schedule", "constant")
    eager, failed = tmp_path / "eager", tmp_path / "failed"
    eager.mkdir()
    failed.mkdir()
    with processes() as procs:
        done = run_ranks(procs, probe(eager, *args), world=2)
        assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)
        done = run_ranks(procs, probe(failed, *args, "--compile"), world=2, PROBE_COMPILE_FAILS="backward")
        assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)
    for rank, d in enumerate(done):
        lines = (d.stdout + d.stderr).splitlines()
        assert len([line for line in lines if "torch.compile failed" in line]) == 1, explain(done)
        assert len([line for line in lines if "step 1 includes compilation" in line]) == 1, explain(done)
        assert "Traceback" not in d.stderr, explain(done)
        want = torch.load(eager / f"rank{rank}.pt", weights_only=True)["state"]
        got = torch.load(failed / f"rank{rank}.pt", weights_only=True)["state"]
        for name, value in want.items():
            assert torch.equal(got[name], value), f"rank {rank}: {name} differs from the eager run"
