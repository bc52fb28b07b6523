"""What a trainer's exit code means: the contract between the trainer and the restart policy.

The operator's ExitCode restart policy retries codes >= ``SIGNAL_EXIT_BASE`` and gives up on the
rest, so a permanent error must stay below 128 and anything a restart can fix must be at or above it.
"""

from __future__ import annotations

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
"""128 + SIGTERM: asked to stop; nothing partial is left on disk."""
EXIT_SIGINT = 130
"""128 + SIGINT: interrupted from a terminal."""
