"""The straggler option sleeps on one rank only, and stops after --slow-until-step."""

from __future__ import annotations

from typing import Any

from ddp_trainer.config import Config, DebugConfig
from ddp_trainer.train import _slow


def cfg(**debug: Any) -> Config:
    return Config(debug=DebugConfig(**debug))


def test_only_the_slow_rank_sleeps() -> None:
    c = cfg(slow_rank=1, slow_seconds=0.5)
    assert [_slow(c, rank, 10) for rank in (0, 1)] == [False, True]


def test_the_slow_rank_recovers_after_the_slow_until_step() -> None:
    c = cfg(slow_rank=0, slow_seconds=0.5, slow_until_step=3)
    assert [_slow(c, 0, s) for s in (1, 3, 4, 100)] == [True, True, False, False]


def test_without_slow_seconds_nobody_sleeps() -> None:
    assert not _slow(cfg(slow_rank=0), 0, 1)
