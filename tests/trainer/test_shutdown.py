"""A rank leaves its process group for good before the interpreter exits (the SIGABRT at exit).

DDP imports ``torch.distributed.nn`` on first use. Imported after ``init_process_group``, its functions'
``group=group.WORLD`` defaults keep the default group alive: ``destroy_process_group()`` then frees
nothing, and gloo's threads run on into interpreter finalization, where a finished rank now and then
died with SIGABRT. These tests look at the process's own threads after the trainer's shutdown.
"""

from __future__ import annotations

import sys

from .procs import explain, processes, run_ranks

# The trainer's own calls, in the order train.run makes them; then the threads this process still has.
PROGRAM = """
import os, torch
from ddp_trainer import distributed
from ddp_trainer.config import DistConfig
from ddp_trainer.launch import read_launch

d = distributed.setup(read_launch(os.environ), DistConfig())
{after_setup}
model, ddp = distributed.wrap(torch.nn.Linear(8, 1), d, DistConfig())
model(torch.randn(4, 8)).sum().backward()
d.gather(d.rank)
del model, ddp
d.finish()
names = sorted(open(f"/proc/self/task/{{t}}/comm").read().strip() for t in os.listdir("/proc/self/task"))
print("threads:", " ".join(names), flush=True)
{exit}
"""

# What the trainer did before: torch.distributed.nn's functions first defined once the group exists (DDP
# imported the module then). Running the module's code again now binds their defaults to the group.
LATE_IMPORT = "import importlib, torch.distributed.nn.functional as f; importlib.reload(f)"
# With the group still alive, interpreter finalization is the abort this module is about (1 run in 7 or
# so, seen in CI): the late-import ranks leave without it, once their threads are listed.
SKIP_FINALIZATION = "os._exit(0)"


def _threads_after_finish(after_setup: str, exit: str = "") -> list[str]:
    program = PROGRAM.format(after_setup=after_setup, exit=exit)
    with processes() as procs:
        done = run_ranks(procs, [sys.executable, "-c", program])
    assert all(d.returncode == 0 for d in done), explain(done)
    return [next(line for line in d.stdout.splitlines() if line.startswith("threads:")) for d in done]


def test_after_finish_no_gloo_thread_is_left_running_in_any_rank() -> None:
    for line in _threads_after_finish(after_setup=""):
        assert "gloo" not in line, f"the process group outlived destroy_process_group: {line}"


def test_the_group_outlives_destroy_process_group_when_ddp_imports_torch_distributed_nn_late() -> None:
    # The other half: the check above fails on the order the trainer used to have, so it can fail.
    lines = _threads_after_finish(after_setup=LATE_IMPORT, exit=SKIP_FINALIZATION)
    assert all("gloo" in line for line in lines), lines
