"""runPolicy.suspend: when suspending and resuming happen."""

from __future__ import annotations

import pytest

from ddpjob_contract.status import Phase
from ddpjob_operator.policies.suspend import Transition, transition


@pytest.mark.parametrize(
    ("suspend", "phase", "expected"),
    [
        (True, Phase.PENDING, Transition.SUSPEND),
        (True, Phase.RUNNING, Transition.SUSPEND),
        (True, Phase.RESTARTING, Transition.SUSPEND),
        (True, Phase.SUSPENDED, None),
        (False, Phase.SUSPENDED, Transition.RESUME),
        (False, Phase.RUNNING, None),
        (True, Phase.SUCCEEDED, None),  # finished stays finished
        (True, Phase.FAILED, None),
        (False, Phase.FAILED, None),
    ],
)
def test_suspend_and_resume_happen_only_on_a_live_job(suspend: bool, phase: Phase, expected: Transition | None) -> None:
    assert transition(suspend, phase) is expected
