"""What a status write may wait for (``write_pace``): only what is observed and decides nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ddpjob_contract.status import Phase
from ddpjob_operator import write_pace
from ddpjob_operator.status import Condition, JobStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUNNING = Condition(
    type="Running", status=False, reason="PodsPending", message="0 of 8 ranks are running", last_transition_time=T0
)
OLD = JobStatus(phase=Phase.PENDING, replicas=8, active=8, conditions=(RUNNING,))


def test_counts_nodes_progress_and_a_conditions_words_are_observed_only() -> None:
    new = replace(OLD, running=3, nodes=("a", "b", "c"), conditions=(replace(RUNNING, message="3 of 8"),))
    assert write_pace.observed_only(OLD, new)


def test_a_phase_a_restart_or_a_condition_that_turns_or_changes_its_reason_decides_something() -> None:
    assert not write_pace.observed_only(OLD, replace(OLD, phase=Phase.RENDEZVOUS))
    assert not write_pace.observed_only(OLD, replace(OLD, restarts=1))
    assert not write_pace.observed_only(OLD, replace(OLD, conditions=(replace(RUNNING, status=True),)))
    assert not write_pace.observed_only(OLD, replace(OLD, conditions=(replace(RUNNING, reason="PodCreateFailed"),)))


def test_such_a_change_waits_until_the_pace_after_the_last_write_and_never_without_one() -> None:
    assert write_pace.wait(None, T0) == 0.0
    assert write_pace.wait(T0, T0 + timedelta(seconds=0.5)) == write_pace.PACE_SECONDS - 0.5
    assert write_pace.wait(T0, T0 + timedelta(seconds=write_pace.PACE_SECONDS + 1)) == 0.0
