"""Which failures restart the gang, by restart policy and exit code; and when restarts run out."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import RestartPolicy, RunPolicy
from ddpjob_operator.policies.restart import Verdict, decide, is_retryable, on_no_progress
from ddpjob_operator.status import Failure


def exit_(code: int | None, rank: int = 1, at: str = "") -> Failure:
    return Failure(rank=rank, pod=f"j-{rank}", exit_code=code, cause="" if code is not None else "was deleted",
                   finished_at=at)  # fmt: skip


NEVER, ON_FAILURE, EXIT_CODE = RestartPolicy.NEVER, RestartPolicy.ON_FAILURE, RestartPolicy.EXIT_CODE


@pytest.mark.parametrize(
    ("policy", "code", "extra", "retryable"),
    [
        (EXIT_CODE, 200, (), True),  # the trainer's lost peer / collective timeout
        (EXIT_CODE, 143, (), True),  # SIGTERM
        (EXIT_CODE, 137, (), True),  # SIGKILL, OOM kill
        (EXIT_CODE, 128, (), True),
        (EXIT_CODE, 127, (), False),
        (EXIT_CODE, 1, (), False),  # a bug
        (EXIT_CODE, 2, (), False),  # a permanent config or data error
        (EXIT_CODE, 2, (2,), True),  # listed: retried
        (EXIT_CODE, 3, (2,), False),
        (EXIT_CODE, None, (), True),  # deleted or evicted
        (ON_FAILURE, 1, (), True),
        (ON_FAILURE, 2, (), True),
        (ON_FAILURE, None, (), True),
        (NEVER, 200, (), False),
        (NEVER, None, (), False),
    ],
)
def test_retryable_failures_by_policy_and_exit_code(
    policy: RestartPolicy, code: int | None, extra: tuple[int, ...], retryable: bool
) -> None:
    rp = RunPolicy(restart_policy=policy, retryable_exit_codes=frozenset(extra))
    assert is_retryable(exit_(code), rp) is retryable


@pytest.mark.parametrize(
    ("failures", "restarts", "backoff", "restart", "cause_rank", "exceeded"),
    [
        ([], 0, 3, None, None, False),
        ([exit_(200)], 0, 3, True, 1, False),
        ([exit_(200)], 2, 3, True, 1, False),
        ([exit_(200)], 3, 3, False, 1, True),
        ([exit_(200)], 0, 0, False, 1, True),
        # one non-retryable failure fails the job, whatever else happened
        ([exit_(200, rank=0), exit_(2, rank=3)], 0, 3, False, 3, False),
        # the earliest failure is the cause: the others are its echo
        ([exit_(200, rank=0, at="2026-01-01T00:00:05Z"), exit_(143, rank=2, at="2026-01-01T00:00:01Z")],
         0, 3, True, 2, False),
        ([exit_(None, rank=4), exit_(200, rank=1, at="2026-01-01T00:00:01Z")], 0, 3, True, 1, False),
    ],
)  # fmt: skip
def test_decide_restarts_until_the_backoff_limit(
    failures: list[Failure], restarts: int, backoff: int, restart: bool | None, cause_rank: int | None,
    exceeded: bool,
) -> None:  # fmt: skip
    decision = decide(failures, RunPolicy(backoff_limit=backoff), restarts)
    if restart is None:
        assert decision is None
        return
    assert decision is not None
    assert (decision.restart, decision.cause.rank, decision.backoff_exceeded) == (restart, cause_rank, exceeded)


@pytest.mark.parametrize(
    ("policy", "restarts", "limit", "verdict"),
    [
        (EXIT_CODE, 0, 3, Verdict.RESTART),
        (ON_FAILURE, 2, 3, Verdict.RESTART),
        (EXIT_CODE, 3, 3, Verdict.BACKOFF_EXCEEDED),
        (ON_FAILURE, 0, 0, Verdict.BACKOFF_EXCEEDED),
        (NEVER, 0, 3, Verdict.NOT_RETRIED),
    ],
)
def test_no_progress_is_retried_like_a_failure_without_an_exit_code(
    policy: RestartPolicy, restarts: int, limit: int, verdict: Verdict
) -> None:
    assert on_no_progress(RunPolicy(restart_policy=policy, backoff_limit=limit), restarts) is verdict
