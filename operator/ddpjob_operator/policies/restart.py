"""Which failures restart the gang, and when the restarts run out; the same for a job that makes no progress.

``Never`` retries nothing; ``OnFailure`` retries every failure; ``ExitCode`` retries exit codes
>= 128 (signals, and the trainer's 200 for a lost peer), codes in ``retryableExitCodes``, and
failures without an exit code (a deleted or evicted pod), and gives up at once on the rest
(1 for a bug, 2 for a permanent config or data error).

A rank that Kubernetes took away (its pod has a DisruptionTarget condition: preempted by a
higher-priority job, evicted, drained, shut down with its node) did not fail: the gang restarts,
whatever the policy, and the restart is not counted against ``backoffLimit`` (the Job controller
treats ``DisruptionTarget`` the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from ddpjob_contract.exits import SIGNAL_EXIT_BASE
from ddpjob_operator.api import RestartPolicy, RunPolicy
from ddpjob_operator.status import Failure, sorted_failures


def is_retryable(failure: Failure, policy: RunPolicy) -> bool:
    if policy.restart_policy is RestartPolicy.NEVER:
        return False
    if policy.restart_policy is RestartPolicy.ON_FAILURE or failure.exit_code is None:
        return True
    return failure.exit_code >= SIGNAL_EXIT_BASE or failure.exit_code in policy.retryable_exit_codes


@dataclass(frozen=True)
class Decision:
    restart: bool
    """True: restart the gang; False: the job has failed."""
    cause: Failure
    """The failure the decision is about: the first non-retryable one, else the earliest."""
    backoff_exceeded: bool = False
    counted: bool = True
    """False for a disruption: the restart does not use up backoffLimit."""


def decide(failures: Sequence[Failure], policy: RunPolicy, restarts: int) -> Decision | None:
    """None when nothing failed. A single non-retryable failure fails the job, whatever else happened."""
    if not failures:
        return None
    ordered = sorted_failures(failures)
    fatal = [f for f in ordered if f.disruption is None and not is_retryable(f, policy)]
    if fatal:
        return Decision(restart=False, cause=fatal[0])
    disrupted = [f for f in ordered if f.disruption is not None]
    if disrupted:
        return Decision(restart=True, cause=disrupted[0], counted=False)
    if restarts >= policy.backoff_limit:
        return Decision(restart=False, cause=ordered[0], backoff_exceeded=True)
    return Decision(restart=True, cause=ordered[0])


class Verdict(Enum):
    RESTART = "restart"
    NOT_RETRIED = "not retried"
    """Under restartPolicy Never."""
    BACKOFF_EXCEEDED = "backoff exceeded"


def on_no_progress(policy: RunPolicy, restarts: int) -> Verdict:
    """A job past its progress deadline (NoProgress): retried like a failure without an exit code."""
    if policy.restart_policy is RestartPolicy.NEVER:
        return Verdict.NOT_RETRIED
    if restarts >= policy.backoff_limit:
        return Verdict.BACKOFF_EXCEEDED
    return Verdict.RESTART


def no_restarts_left(backoff_limit: int) -> str:
    return f"no restarts left (spec.runPolicy.backoffLimit={backoff_limit})"
