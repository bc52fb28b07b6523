"""Each transition, applied to a status: the phase, the conditions and the Events it makes, and nothing else."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator.status import JobStatus
from ddpjob_operator.transitions import (
    Create,
    Finish,
    FlagStraggler,
    Launch,
    Rebuild,
    Rendezvous,
    Restart,
    Resume,
    Run,
    StragglerRecovered,
    Suspend,
    Transition,
    Wait,
    apply,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)
C = ConditionType
RUNNING = JobStatus(phase=Phase.RUNNING, attempt=1, restarts=1, launched_attempt=1, start_time=T0).with_condition(
    C.RUNNING, True, Reason.ALL_RUNNING, "all 2 ranks are running (attempt 1)", T0
)
RESTARTING = replace(RUNNING, phase=Phase.RESTARTING, attempt=2, restarts=2).with_condition(
    C.RESTARTING, True, Reason.RETRYABLE, "rank 0 exited with code 137; restarting", T0
)
FLAGGED = RUNNING.with_condition(C.STRAGGLER_DETECTED, True, Reason.STRAGGLER, "rank 1 is slow", T0)
SUSPENDED = replace(RUNNING, phase=Phase.SUSPENDED, start_time=None)

# transition, from, then: phase, attempt, restarts, {condition: (status, reason)}, event reasons (! = warning)
CASES: list[tuple[Transition, JobStatus, Phase, int, int, dict[C, tuple[bool, str]], list[str]]] = [
    (Create(2, 4, 8, "train-0.train:29500", suspended=False), JobStatus(), Phase.PENDING, 0, 0,
     {C.CREATED: (True, "Created")}, ["Created"]),
    (Finish(True, Reason.ALL_SUCCEEDED, "all exited 0"), RUNNING, Phase.SUCCEEDED, 1, 1,
     {C.SUCCEEDED: (True, "AllRanksSucceeded"), C.RUNNING: (False, "AllRanksSucceeded")}, ["AllRanksSucceeded"]),
    (Finish(False, Reason.DEADLINE, "too long"), RESTARTING, Phase.FAILED, 2, 2,
     {C.FAILED: (True, "DeadlineExceeded"), C.RUNNING: (False, "DeadlineExceeded"),
      C.RESTARTING: (False, "DeadlineExceeded")}, ["!DeadlineExceeded"]),
    (Finish(False, Reason.BACKOFF, "no restarts left"), FLAGGED, Phase.FAILED, 1, 1,
     {C.FAILED: (True, "BackoffLimitExceeded"), C.RUNNING: (False, "BackoffLimitExceeded"),
      C.STRAGGLER_DETECTED: (False, "StragglerRecovered")},
     ["!BackoffLimitExceeded"]),
    (Restart(Reason.RETRYABLE, "rank 1 exited with code 200", 3), RUNNING, Phase.RESTARTING, 2, 2,
     {C.RESTARTING: (True, "RetryableFailure"), C.RUNNING: (False, "RetryableFailure")}, ["!RetryableFailure"]),
    (Restart(Reason.NO_PROGRESS, "no rank advanced its step for 60s", 3), RUNNING, Phase.RESTARTING, 2, 2,
     {C.RESTARTING: (True, "NoProgress"), C.RUNNING: (False, "NoProgress")}, ["!NoProgress"]),
    (Rebuild(), replace(RUNNING, phase=Phase.PENDING), Phase.PENDING, 2, 1, {}, ["SpecChanged"]),
    (Suspend(), RUNNING, Phase.SUSPENDED, 1, 1,
     {C.SUSPENDED: (True, "Suspended"), C.RUNNING: (False, "Suspended")}, ["Suspended"]),
    (Resume(), SUSPENDED, Phase.PENDING, 2, 1, {C.SUSPENDED: (False, "Resumed")}, ["Resumed"]),
    (Launch(2), replace(RESTARTING, phase=Phase.RESTARTING), Phase.PENDING, 2, 2, {}, ["AttemptLaunched"]),
    (Launch(2), JobStatus(phase=Phase.PENDING), Phase.PENDING, 0, 0, {}, []),
    (Rendezvous(1, 2), replace(RUNNING, phase=Phase.PENDING), Phase.RENDEZVOUS, 1, 1,
     {C.RUNNING: (False, "Rendezvous")}, []),
    (Run(2), replace(RESTARTING, phase=Phase.RENDEZVOUS), Phase.RUNNING, 2, 2,
     {C.RUNNING: (True, "AllRanksRunning"), C.RESTARTING: (False, "Recovered")}, ["AllRanksRunning"]),
    (Wait(), JobStatus(phase=Phase.PENDING), Phase.PENDING, 0, 0, {C.RUNNING: (False, "PodsPending")}, []),
    (FlagStraggler(1, "rank 1 is slow", T0, NOW), RUNNING, Phase.RUNNING, 1, 1,
     {C.STRAGGLER_DETECTED: (True, "StragglerDetected")}, ["!StragglerDetected"]),
    (StragglerRecovered("rank 1 recovered", T0, NOW), FLAGGED, Phase.RUNNING, 1, 1,
     {C.STRAGGLER_DETECTED: (False, "StragglerRecovered")}, ["StragglerRecovered"]),
]  # fmt: skip


@pytest.mark.parametrize(("transition", "before", "phase", "attempt", "restarts", "conditions", "events"), CASES,
                         ids=[type(c[0]).__name__ for c in CASES])  # fmt: skip
def test_a_transition_sets_the_phase_the_conditions_and_the_events(
    transition: Transition,
    before: JobStatus,
    phase: Phase,
    attempt: int,
    restarts: int,
    conditions: dict[C, tuple[bool, str]],
    events: list[str],
) -> None:
    after, told = apply(before, transition, NOW)
    assert (after.phase, after.attempt, after.restarts) == (phase, attempt, restarts)
    for type_, (status, reason) in conditions.items():
        condition = after.condition(type_)
        assert condition is not None and (condition.status, condition.reason) == (status, reason), type_
    untouched = {c.type for c in before.conditions} - set(conditions)
    assert {c.type: c for c in after.conditions if c.type in untouched} == {
        c.type: c for c in before.conditions if c.type in untouched
    }, "the other conditions are left as they were"
    assert [("!" if e.warning else "") + e.reason for e in told] == events


def test_the_created_event_says_the_shape_of_the_job() -> None:
    _, told = apply(JobStatus(), Create(2, 4, 8, "train-0.train:29500", suspended=False), NOW)
    assert told[0].message == "2 pods x 4 processes (world size 8), master train-0.train:29500"


def test_the_created_event_of_a_queued_or_suspended_job_says_no_pod_follows_yet_and_why() -> None:
    # Issue 42: a Queued job's Created Event said "2 pods x 1 processes" while no pod existed.
    _, queued = apply(JobStatus(), Create(2, 1, 2, "train-0.train:29500", suspended=False, queue="user-queue"), NOW)
    assert queued[0].message == ("planned 2 pods x 1 processes (world size 2), master train-0.train:29500; queued in "
                                 "LocalQueue user-queue: no pod until Kueue admits its Workload")  # fmt: skip
    _, suspended = apply(JobStatus(), Create(2, 1, 2, "train-0.train:29500", suspended=True), NOW)
    assert suspended[0].message.startswith("planned 2 pods x 1 processes")
    assert suspended[0].message.endswith("created suspended: no pod until spec.runPolicy.suspend is false")


def test_a_finished_job_keeps_its_completion_time_and_a_resumed_one_restarts_its_clock() -> None:
    assert apply(RUNNING, Finish(True, Reason.ALL_SUCCEEDED, "done"), NOW)[0].completion_time == NOW
    assert apply(SUSPENDED, Resume(), NOW)[0].start_time == NOW
    assert apply(RUNNING, Suspend(), NOW)[0].start_time is None
    assert apply(JobStatus(), Create(2, 1, 2, "train-0.train:29500", suspended=True), NOW)[0].start_time is None


def test_straggler_conditions_take_the_time_of_the_poll_that_saw_them() -> None:
    flagged, _ = apply(RUNNING, FlagStraggler(1, "rank 1 is slow", T0, NOW - timedelta(seconds=3)), NOW)
    condition = flagged.condition(C.STRAGGLER_DETECTED)
    assert condition is not None and condition.last_transition_time == NOW - timedelta(seconds=3)
