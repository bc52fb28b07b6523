"""The gang's agreement on the step to stop at, when any rank is asked to stop (save-on-stop, signals.py).

Every rank must stop at the same step, or the ranks that go on wait in their next collective for the ones that
left. So the ranks vote: one small all-reduce of (asked to stop?, recent step time), started at a step boundary
and read at the next one, while the step runs (``Dist.max_async``). All ranks read the same answer at the same
step, so all stop there, or all go on.

A vote is cheap, but not free next to a step of a few milliseconds (gloo on a loaded CPU took about 1.5 ms in
bench.stop_vote). So votes are paced: one every ``PACE_SECONDS`` of training, at least. The interval in steps
follows from the slowest rank's recent step time, which the vote itself carries, so every rank computes the same
interval. A stop then comes at most about ``PACE_SECONDS`` plus two steps after the signal, and nothing trained
in between is lost: the step the gang stops at is the one it saves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from ddp_trainer.distributed import Pending

PACE_SECONDS = 0.25
"""The least training time between two votes (beyond one step)."""
MAX_EVERY = 50
"""The most steps between two votes, however fast the steps seem (a GPU's host can run ahead of it)."""


class Gang(Protocol):
    """Who votes: ``distributed.Dist``."""

    @property
    def world_size(self) -> int: ...

    def max_async(self, values: list[int]) -> Pending: ...


def every_for(step_micros: int) -> int:
    """Steps between votes for a slowest recent step of ``step_micros``: enough that the votes cost about
    nothing, few enough that a stop comes soon."""
    if step_micros <= 0:
        return 1
    return max(1, min(MAX_EVERY, math.ceil(PACE_SECONDS * 1e6 / step_micros)))


class StopVote:
    """Call ``after_step`` at every step boundary; it says whether the gang stops at this step."""

    def __init__(self, d: Gang, clock: Callable[[], float] = time.monotonic) -> None:
        self._d = d
        self._clock = clock
        self._pending: Pending | None = None
        self._next_vote = 0  # the step at which the next vote starts
        self._every = 1
        self._since = (0, clock())  # the step and time the current pace is measured from

    def after_step(self, step: int, asked: bool) -> bool:
        if self._d.world_size == 1:
            return asked  # nobody to agree with
        if self._pending is not None:
            stop, slowest = self._pending.result()
            self._pending = None
            if stop:
                return True
            self._every = every_for(slowest)
            self._next_vote = step + self._every - 1
        if step >= self._next_vote:
            since_step, since = self._since
            now = self._clock()
            self._since = (step, now)
            self._pending = self._d.max_async([int(asked), int((now - since) * 1e6 / max(step - since_step, 1))])
        return False

    def close(self) -> None:
        """Reads a vote still in flight, so no collective is left behind the group's last barrier."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None
