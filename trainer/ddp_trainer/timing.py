"""Step timing that never adds a host-device synchronization.

On CPU the work is done when the Python call returns, so ``perf_counter`` is honest. On GPU
the host runs ahead of the device: we record CUDA events between phases and read them only
once the step's last event has completed (``Event.query()``), a step or two later. The loss is
copied to pinned host memory on the stream, so reading it later does not synchronize either.

``UntimedSteps`` (``--no-step-timing``) has the same interface and only counts steps.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch

from ddp_trainer.metrics import StepTiming

T = TypeVar("T")


@dataclass
class _Pending:
    step: int
    samples: int
    marks: list[tuple[str, torch.cuda.Event]]  # (phase that ended, event); the first is the start
    loss: torch.Tensor


class Timer(Protocol):
    """What the training loop calls: ``start``, ``mark(phase)`` after each phase, ``finish`` per step."""

    def start(self) -> None: ...
    def mark(self, phase: str) -> None: ...
    def finish(self, step: int, samples: int, loss: torch.Tensor) -> None: ...
    def poll(self) -> list[StepTiming]: ...
    def flush(self) -> list[StepTiming]: ...


def timer(device: torch.device, *, timed: bool) -> Timer:
    return StepTimer(device) if timed else UntimedSteps()


@dataclass
class StepTimer:
    """``start``, ``mark(phase)`` at the end of each phase, ``finish`` per step; ``poll`` for results."""

    device: torch.device
    _pending: deque[_Pending] = field(default_factory=deque)
    _done: list[StepTiming] = field(default_factory=list)
    _cpu_marks: list[tuple[str, float]] = field(default_factory=list)
    _gpu_marks: list[tuple[str, torch.cuda.Event]] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def start(self) -> None:
        self.mark("start")

    def mark(self, phase: str) -> None:
        """The phase named ``phase`` ends now (``start`` opens the step)."""
        if self.on_gpu:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._gpu_marks.append((phase, event))
        else:
            self._cpu_marks.append((phase, time.perf_counter()))

    def finish(self, step: int, samples: int, loss: torch.Tensor) -> None:
        """Close the step; ``loss`` is the step's loss as a 0-d tensor on the device."""
        if not self.on_gpu:
            cpu_marks, self._cpu_marks = self._cpu_marks, []
            phases, total = _phase_sums(cpu_marks, lambda a, b: b - a)
            self._done.append(_timing(step, samples, total, phases, float(loss)))
            return
        host_loss = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host_loss.copy_(loss.detach(), non_blocking=True)
        self.mark("end")  # after the copy, so the copy is done when this event is
        marks, self._gpu_marks = self._gpu_marks, []
        self._pending.append(_Pending(step, samples, marks, host_loss))

    def poll(self) -> list[StepTiming]:
        """Timings of the steps whose events have completed, oldest first; never blocks."""
        while self._pending and self._pending[0].marks[-1][1].query():  # type: ignore[no-untyped-call]
            self._done.append(self._read(self._pending.popleft()))
        done, self._done = self._done, []
        return done

    def flush(self) -> list[StepTiming]:
        """Wait for every pending step (once, at the end of training) and return all timings."""
        if self._pending:
            self._pending[-1].marks[-1][1].synchronize()
        return self.poll()

    @staticmethod
    def _read(p: _Pending) -> StepTiming:
        phases, total = _phase_sums(p.marks, lambda a, b: a.elapsed_time(b) / 1000.0)
        return _timing(p.step, p.samples, total, phases, float(p.loss))


def _phase_sums(marks: Sequence[tuple[str, T]], between: Callable[[T, T], float]) -> tuple[dict[str, float], float]:
    """Sum the intervals by the phase that ends them (a phase repeats when accumulating)."""
    phases: dict[str, float] = {}
    for (_, earlier), (phase, later) in itertools.pairwise(marks):
        if phase != "end":
            phases[phase] = phases.get(phase, 0.0) + between(earlier, later)
    return phases, between(marks[0][1], marks[-1][1])


def _timing(step: int, samples: int, total: float, phases: dict[str, float], loss: float) -> StepTiming:
    return StepTiming(step=step, samples=samples, step_seconds=total, phase_seconds=phases, loss=loss)


@dataclass
class UntimedSteps:
    """Counts finished steps and nothing else: no clock, no CUDA event, no read of the loss.

    Its timings have NaN times and loss; ``Metrics.record`` then only counts the step.
    """

    _done: list[StepTiming] = field(default_factory=list)

    def start(self) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass

    def finish(self, step: int, samples: int, loss: torch.Tensor) -> None:
        self._done.append(_timing(step, samples, math.nan, {}, math.nan))

    def poll(self) -> list[StepTiming]:
        done, self._done = self._done, []
        return done

    def flush(self) -> list[StepTiming]:
        return self.poll()
