"""Errors a user can act on: one line naming the cause and the fix."""


class BoxError(Exception):
    """A fault in the environment or the input, reported without a traceback."""
