"""The learning-rate multiplier: linear warm-up, then constant, cosine or step decay."""

from __future__ import annotations

import pytest

from ddp_trainer.config import OptimConfig
from ddp_trainer.train import lr_lambda


def test_warm_up_rises_linearly_to_the_peak() -> None:
    f = lr_lambda(OptimConfig(lr_schedule="constant", lr_warmup_steps=3), total_steps=10)
    assert [f(s) for s in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


def test_cosine_falls_from_the_peak_to_zero_at_the_last_step() -> None:
    f = lr_lambda(OptimConfig(lr_schedule="cosine"), total_steps=10)
    assert f(0) == 1.0
    assert f(5) == pytest.approx(0.5)
    assert f(10) == pytest.approx(0.0)
    assert all(f(s) >= f(s + 1) for s in range(10))


def test_step_decay_multiplies_by_gamma_every_step_size_steps() -> None:
    f = lr_lambda(OptimConfig(lr_schedule="step", lr_step_size=4, lr_gamma=0.5), total_steps=100)
    assert [f(s) for s in (0, 3, 4, 7, 8)] == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.25])
