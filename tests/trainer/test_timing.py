"""Step timing on CPU: each interval is charged to the phase that ends it, repeats are summed."""

from __future__ import annotations

import pytest
import torch

from ddp_trainer.timing import StepTimer, UntimedSteps


def test_a_step_is_split_into_its_phases_and_the_phases_add_up_to_the_step() -> None:
    timer = StepTimer(torch.device("cpu"))
    for step in (1, 2):
        timer.start()
        for phase in ("data", "forward", "backward", "optimizer"):
            timer.mark(phase)
        timer.finish(step, samples=8, loss=torch.tensor(1.5))
    done = timer.poll()
    assert [t.step for t in done] == [1, 2]
    for t in done:
        assert set(t.phase_seconds) == {"data", "forward", "backward", "optimizer"}
        assert sum(t.phase_seconds.values()) == pytest.approx(t.step_seconds)
        assert t.samples == 8 and t.loss == 1.5
    assert timer.poll() == [] and timer.flush() == []


def test_accumulated_micro_batches_add_to_the_same_phase() -> None:
    timer = StepTimer(torch.device("cpu"))
    timer.start()
    for _ in range(3):
        timer.mark("data")
        timer.mark("forward")
        timer.mark("backward")
    timer.mark("optimizer")
    timer.finish(1, samples=12, loss=torch.tensor(0.0))
    (t,) = timer.poll()
    assert set(t.phase_seconds) == {"data", "forward", "backward", "optimizer"}
    assert sum(t.phase_seconds.values()) == pytest.approx(t.step_seconds)


def test_untimed_steps_are_counted_with_no_times_and_no_loss_read() -> None:
    steps = UntimedSteps()
    for step in (1, 2):
        steps.start()
        steps.mark("forward")
        steps.finish(step, samples=8, loss=torch.tensor(1.5))
    done = steps.flush()
    assert [(t.step, t.samples, t.timed) for t in done] == [(1, 8, False), (2, 8, False)]
    assert all(t.phase_seconds == {} for t in done)
    assert steps.poll() == []
