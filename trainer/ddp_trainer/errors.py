"""The exceptions that map to exit codes (``ddpjob_contract.exits``, the contract with whoever restarts us).

``PermanentError`` exits with ``EXIT_PERMANENT`` (below 128: not retried), ``RetryableError`` with
``EXIT_RETRYABLE`` (at or above 128: the gang restarts), ``Stopped`` with ``EXIT_SIGTERM``.
"""

from __future__ import annotations

from ddpjob_contract import exits


class PermanentError(Exception):
    """A problem the user must fix; the message is one line naming the option or file and the fix."""


class ConfigError(PermanentError):
    """An option has a bad value."""


class DataError(PermanentError):
    """The data source is missing, empty or malformed."""


class RetryableError(Exception):
    """A failure a restart of the whole gang can fix (lost peer, collective timeout)."""


class Stopped(Exception):
    """Every rank stopped at ``step`` on a signal, after that step's checkpoint was saved: ``EXIT_SIGTERM``."""

    def __init__(self, step: int, signal_name: str) -> None:
        super().__init__(exits.stopped_message(step, signal_name))
        self.step = step
