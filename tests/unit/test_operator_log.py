"""Which lines of an operator's log count as errors (``ddpjob_box.operator_process.error_lines``): the tests and
the scale benchmark assert there are none."""

from __future__ import annotations

from ddpjob_box.operator_process import error_lines

RETRY = "[ERROR   ] Request attempt #1/9 failed; will retry: GET https://127.0.0.1:6443/apis -> 429"
REAUTH = "[ERROR   ] Request attempt #2/9 failed; TCP closed; will re-authenticate: GET https://127.0.0.1:6443/apis"
ESCALATING = "[ERROR   ] Request attempt #9/9 failed; escalating: GET https://127.0.0.1:6443/apis -> 500"
HANDLER = "[ERROR   ] Handler 'reconcile' failed with an exception. Will retry."


def test_kopfs_retries_are_not_errors_but_a_retry_that_gives_up_and_a_traceback_are() -> None:
    log = "\n".join([RETRY, REAUTH, "[INFO    ] fine", ESCALATING, HANDLER, "Traceback (most recent call last):"])
    assert error_lines(log) == [ESCALATING, HANDLER, "Traceback (most recent call last):"]
