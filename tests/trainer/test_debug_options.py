"""The straggler option sleeps on one rank only, and stops after --slow-until-step."""

from __future__ import annotations

from types import SimpleNamespace

from ddp_trainer.config import Config, DebugConfig
from ddp_trainer.train import _slow


def cfg(**debug: object) -> Config:
    return Config(debug=DebugConfig(**debug))  # type: ignore[arg-type]


def test_only_the_slow_rank_sleeps() -> None:
    c = cfg(slow_rank=1, slow_seconds=0.5)
    assert [_slow(c, SimpleNamespace(rank=r), 10) for r in (0, 1)] == [False, True]  # type: ignore[arg-type]


def test_the_slow_rank_recovers_after_the_slow_until_step() -> None:
    c = cfg(slow_rank=0, slow_seconds=0.5, slow_until_step=3)
    assert [_slow(c, SimpleNamespace(rank=0), s) for s in (1, 3, 4, 100)] == [True, True, False, False]  # type: ignore[arg-type]


def test_without_slow_seconds_nobody_sleeps() -> None:
    assert not _slow(cfg(slow_rank=0), SimpleNamespace(rank=0), 1)  # type: ignore[arg-type]
