"""Exit codes and the exceptions that map to them: the contract with whoever restarts us.

The operator's ExitCode restart policy retries codes >= 128 and gives up on the rest, so a
permanent error must stay below 128 and anything a restart can fix must be at or above it.
"""

from __future__ import annotations

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


class PermanentError(Exception):
    """A problem the user must fix; the message is one line naming the option or file and the fix."""


class ConfigError(PermanentError):
    """An option has a bad value."""


class DataError(PermanentError):
    """The data source is missing, empty or malformed."""


class RetryableError(Exception):
    """A failure a restart of the whole gang can fix (lost peer, collective timeout)."""
