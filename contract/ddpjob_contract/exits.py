"""What a trainer's exit code means: the contract between the trainer and the restart policy.

The operator's ExitCode restart policy retries codes >= ``SIGNAL_EXIT_BASE`` and gives up on the
rest, so a permanent error must stay below 128 and anything a restart can fix must be at or above it.
"""

from __future__ import annotations

import re

SIGNAL_EXIT_BASE = 128
"""128 + N: killed by signal N. Retried by the ExitCode policy, as is anything above."""
EXIT_OK = 0
"""Training finished."""
EXIT_BUG = 1
"""An unexpected exception (a bug): Python's default, printed with its traceback."""
EXIT_PERMANENT = 2
"""Bad configuration or missing data: restarting cannot help; one line on stderr says the fix."""
EXIT_RETRYABLE = 200
"""A collective timed out or a peer was lost: restart the gang and resume from the checkpoint."""
EXIT_SIGTERM = 143
"""128 + SIGTERM: asked to stop. With a checkpoint directory, every rank stopped at one step boundary after a
checkpoint of that step was saved; without one, or when the save could not be reached in time (a rank blocked in a
collective), at once. Nothing partial is left on disk either way."""
EXIT_SIGINT = 130
"""128 + SIGINT: interrupted from a terminal."""

# The exit message of a rank that exited 0: one JSON object on one line (any other message is an error).
SUMMARY_STEP = "step"
"""The run's final step."""
SUMMARY_SAMPLES = "samples"
"""Samples this process trained on in this attempt."""
SUMMARY_STEP_SECONDS = "step_seconds_mean"
"""Mean wall time of a step, the warm-up left out (absent when the run was not timed)."""
SUMMARY_SAMPLES_PER_SECOND = "samples_per_second"
"""This process's samples per second over the same steps (absent when the run was not timed)."""
SUMMARY_CHECKPOINT_STEP = "checkpoint_step"
"""The newest complete checkpoint this process saved or resumed from (absent: none). The ranks exit right after
the last save, before a poll of their metrics can see it: without it, status.lastCheckpoint ended a run behind."""
SUMMARY_CHECKPOINT_TIME = "checkpoint_time"
"""Unix time that checkpoint was saved at (absent: unknown)."""
SUMMARY_CHECKPOINT_SAVE_SECONDS = "checkpoint_save_seconds"
"""How long this run took to save it, every rank's part included (absent: resumed from, not saved)."""
SUMMARY_RESTARTS = "restarts"
"""In-place restarts of the gang's processes before this process (its TORCHELASTIC_RESTART_COUNT); absent for
none. The operator counts them from its polls, and from here those its polls missed at the end of a run."""


def stopped_message(step: int, signal_name: str) -> str:
    """The exit message of a rank that exited ``EXIT_SIGTERM`` after its gang saved the checkpoint of ``step``;
    ``signal_name`` is empty for a rank that stopped because a peer was asked to."""
    why = f"on {signal_name}" if signal_name else "with a peer that was asked to stop"
    return f"stopped {why} at step {step}, after saving its checkpoint"


_STOPPED = re.compile(
    r"stopped (?:on [A-Z]+|with a peer that was asked to stop) at step (\d+), after saving its checkpoint"
)


def stopped_step(message: str) -> int | None:
    """The step whose checkpoint a stopped rank's exit message says was saved (``stopped_message``), or None."""
    found = _STOPPED.fullmatch(message.strip())
    return int(found.group(1)) if found else None
