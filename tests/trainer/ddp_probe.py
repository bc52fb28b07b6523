"""The trainer as a library, watched: ``ddp_probe.py OUT ARGS...`` writes out/rank<R>.json and out/rank<R>.pt.

The JSON says how many DDP wrappers the run built, with which options, and, at every optimizer step,
how many distinct storages the gradients live in (one per DDP bucket when they are bucket views, one
per parameter otherwise). The .pt holds the final parameters, as ``run_and_dump.py`` writes them.

With ``PROBE_COMPILE_FAILS=forward`` (or ``backward``) every ``torch.compile`` gets a backend whose
forward (or backward) compiler raises: compilation fails deterministically, with no C compiler involved.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import torch
from torch import fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ddp_trainer import distributed, train
from ddp_trainer.config import parse
from ddp_trainer.launch import read_launch

built: list[dict[str, Any]] = []
grad_storages: list[int] = []


class RecordingDDP(distributed.DistributedDataParallel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        built.append({"gradient_as_bucket_view": self.gradient_as_bucket_view, "static_graph": self.static_graph})


def count_grad_storages(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grad_storages.append(len({g.untyped_storage().data_ptr() for g in grads}))


def refuse(gm: fx.GraphModule, example_inputs: Any) -> Any:
    raise RuntimeError("this backend refuses to compile (a test's)\nsecond line of the error")


FAILING_BACKENDS = {
    "forward": refuse,
    "backward": aot_autograd(fw_compiler=boxed_nop, bw_compiler=refuse),
}

if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    fails = os.environ.get("PROBE_COMPILE_FAILS", "")
    if fails:
        torch.compile = functools.partial(torch.compile, backend=FAILING_BACKENDS[fails])  # type: ignore[assignment]
    distributed.DistributedDataParallel = RecordingDDP  # type: ignore[misc]
    register_optimizer_step_pre_hook(count_grad_storages)
    launch = read_launch(os.environ)
    train.setup_logging(launch.rank)
    result = train.run(parse(argv, os.environ), launch)
    params = sum(1 for _ in result.model.parameters())
    report = {"ddp_built": built, "grad_storages": grad_storages, "params": params, "steps": result.steps}
    with open(os.path.join(out, f"rank{launch.rank}.json"), "w") as f:
        json.dump(report, f)
    state = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
    torch.save({"state": state, "steps_run": len(result.timings)}, os.path.join(out, f"rank{launch.rank}.pt"))
