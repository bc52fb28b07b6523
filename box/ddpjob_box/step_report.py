"""What setup says about its steps: elapsed times, progress lines, and the table of step times at the end.

Pure functions of numbers and names, so the wording is tested as data (tests/unit/test_step_report.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

PROGRESS_EVERY = 10.0
"""Seconds between two progress lines of one step in a log; a step shorter than this prints none."""
QUIET_EVERY = 30.0
"""Seconds between two lines of a step whose figure has not moved: it is still alive, the log stays short."""


def format_elapsed(seconds: float) -> str:
    """``7s``, ``1m05s``, ``1h02m``: short, and the same width for the same order of magnitude."""
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_line(step: str, elapsed: float, figure: str) -> str:
    """One line about a running step: ``images: 1m10s, trainer STEP 5/14, 812 MB downloaded``."""
    return f"{step}: {format_elapsed(elapsed)}" + (f", {figure}" if figure else "")


def due(*, now: float, last_line: float, figure: str, last_figure: str) -> bool:
    """Whether a running step gets a progress line now, in a log read afterwards (not a terminal): every
    PROGRESS_EVERY seconds while its figure moves, every QUIET_EVERY seconds while it does not."""
    waited = now - last_line
    return waited >= (PROGRESS_EVERY if figure != last_figure else QUIET_EVERY)


@dataclass(frozen=True)
class StepTime:
    """One step's outcome, for the table: its wall-clock interval and how it ended."""

    name: str
    started: float
    ended: float
    # "done", "failed", "stopped" (ended because another step failed) or "skipped" (never started)
    outcome: str = "done"

    @property
    def seconds(self) -> float:
        return self.ended - self.started


OVERLAP_MIN = 1.0
"""Seconds two steps must share to be said to run alongside each other (a step that ends as another starts
does not count)."""


def alongside(step: StepTime, others: Sequence[StepTime]) -> list[str]:
    """The names of the steps that ran at the same time as ``step``, in their order."""
    return [
        other.name
        for other in others
        if other.name != step.name
        and other.outcome != "skipped"
        and min(step.ended, other.ended) - max(step.started, other.started) >= OVERLAP_MIN
    ]


def step_table(steps: Sequence[StepTime], *, title: str) -> str:
    """The summary at the end of ``make setup`` and ``make demo``: one row per step with its time, what it
    ran alongside, and how it ended when not done; then the wall clock from the first start to the last end."""
    ran = [s for s in steps if s.outcome != "skipped"]
    width = max((len(s.name) for s in steps), default=0)
    rows = []
    for step in steps:
        if step.outcome == "skipped":
            rows.append(f"  {step.name:<{width}}  {'-':>6}  not started")
            continue
        notes = []
        if step.outcome != "done":
            notes.append(step.outcome)
        beside = alongside(step, ran)
        if beside:
            notes.append("alongside " + ", ".join(beside))
        rows.append(f"  {step.name:<{width}}  {format_elapsed(step.seconds):>6}  {'; '.join(notes)}".rstrip())
    wall = max((s.ended for s in ran), default=0.0) - min((s.started for s in ran), default=0.0)
    return "\n".join([f"{title} (wall clock {format_elapsed(wall)}):", *rows])


def encode_times(steps: Sequence[StepTime]) -> str:
    """Step times as one environment value, for the command that runs after the setup (the demo)."""
    return json.dumps([[s.name, s.started, s.ended, s.outcome] for s in steps])


def decode_times(text: str) -> list[StepTime]:
    """What encode_times wrote; nothing when the command was started without the setup."""
    if not text:
        return []
    return [StepTime(str(n), float(start), float(end), str(outcome)) for n, start, end, outcome in json.loads(text)]
