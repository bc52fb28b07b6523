"""torch.compile that never fails a job: a model that does not compile trains eagerly, after one warning line.

Compilation is lazy: it happens in the first call, so that is where a failure shows and is caught.
The backward graph is compiled in that same call (``force_non_lazy_backward_lowering``), not in the
first backward: a failure after DDP has started reducing gradients could not be undone, one inside
the forward can. The module sits inside the DDP wrapper, so falling back happens within one DDP
forward, and DDP's own collectives (the buffer broadcast) run once either way, on every rank.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._functorch.config
from torch import nn

log = logging.getLogger("ddp_trainer")

Compile = Callable[[nn.Module], Callable[..., Any]]


@dataclass
class Compilation:
    """What the first call cost and how it ended; a run without --compile keeps the zeros."""

    seconds: float = 0.0  # wall time of the first compiled call: the forward and backward graphs
    failed: str = ""  # the first line of the error, once compilation has failed


class CompileOrEager(nn.Module):
    """Calls ``compile(module)``; after the first failure, ``module`` itself, for the rest of the run."""

    _compiled: Callable[..., Any]

    def __init__(self, module: nn.Module, compile: Compile = lambda m: torch.compile(m)) -> None:
        super().__init__()
        self.module = module
        self.compilation = Compilation()
        # A plain attribute, not a submodule: the parameters are registered once, under `module`.
        object.__setattr__(self, "_compiled", compile(module))
        self._first = True

    def forward(self, *args: Any) -> Any:
        if self.compilation.failed:
            return self.module(*args)
        started = time.perf_counter()
        try:
            with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
                out = self._compiled(*args)
        except Exception as err:  # any failure to compile: the job trains on, eagerly
            self.compilation.failed = _first_line(err)
            log.warning("torch.compile failed, training eagerly: %s", self.compilation.failed)
            out = self.module(*args)
        if self._first:
            self._first = False
            self.compilation.seconds = time.perf_counter() - started
        return out


def _first_line(err: BaseException) -> str:
    """The error's type and the first line of its root cause (dynamo wraps a backend's error in its own)."""
    cause = err
    while (inner := getattr(cause, "inner_exception", None) or cause.__cause__) is not None:
        cause = inner
    text = str(cause).strip()
    said = f"{type(cause).__name__}: {text.splitlines()[0]}" if text else type(cause).__name__
    return said if cause is err else f"{type(err).__name__} ({said})"
