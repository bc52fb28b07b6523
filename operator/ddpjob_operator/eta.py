"""Pure: how far a run is (the percent of its steps done) and when it ends (its ETA), for the PROGRESS and
ETA columns of ``kubectl get ddpj``.

Both need the step the run ends at (``ddp_target_step``); the ETA also needs the pace the step advanced at
over the recent window. Where either is unknown (a program that serves no metrics, or a run bounded by epochs
over data of unknown size) the figure is None, and its column stays empty rather than guess.
"""

from __future__ import annotations

import math


def percent_done(step: int | None, total: int | None) -> float | None:
    """The percent of ``total`` steps done, rounded down to a tenth: 100 only once the last step is done."""
    if step is None or not total or total <= 0:
        return None
    return min(100.0, math.floor(1000 * max(step, 0) / total) / 10)


def seconds_left(step: int | None, total: int | None, steps_per_second: float | None) -> int | None:
    """The steps left at the recent pace, in whole seconds (rounded up); None when the total or the pace is
    unknown, or the step has not advanced over the window (a stalled run has no ETA)."""
    if step is None or not total or total <= 0 or not steps_per_second or steps_per_second <= 0:
        return None
    return math.ceil(max(total - step, 0) / steps_per_second)


def human_duration(seconds: int | None) -> str | None:
    """As kubectl writes an age, two units at most: 45s, 4m5s, 2h3m, 3d4h."""
    if seconds is None:
        return None
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    if days:
        return f"{days}d{h}h" if h else f"{days}d"
    if hours:
        return f"{hours}h{m}m" if m else f"{hours}h"
    if minutes:
        return f"{minutes}m{s}s" if s else f"{minutes}m"
    return f"{s}s"
