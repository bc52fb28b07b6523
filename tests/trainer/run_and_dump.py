"""Run the trainer as a library and save this rank's final parameters: ``run_and_dump.py OUT ARGS...``.

Tests compare the files across ranks and runs; the trainer itself never writes per-rank files.
"""

from __future__ import annotations

import os
import sys

import torch

from ddp_trainer import train
from ddp_trainer.config import parse
from ddp_trainer.launch import read_launch

if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    launch = read_launch(os.environ)
    train.setup_logging(launch.rank)
    result = train.run(parse(argv, os.environ), launch)
    state = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
    torch.save({"state": state, "steps_run": len(result.timings)}, os.path.join(out, f"rank{launch.rank}.pt"))
