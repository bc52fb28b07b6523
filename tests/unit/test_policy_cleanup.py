"""cleanPodPolicy: which pods go once the job has finished."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import CleanPodPolicy
from ddpjob_operator.policies.cleanup import pods_to_delete
from ddpjob_operator.status import PodView

PODS = [
    PodView(name="running", phase="Running"),
    PodView(name="pending", phase="Pending"),
    PodView(name="done", phase="Succeeded", exit_code=0),
    PodView(name="failed", phase="Failed", exit_code=2),
    PodView(name="sidecar-left", phase="Running", exit_code=0, others_running=True),  # a sidecar still runs
    PodView(name="exiting", phase="Running", exit_code=0),  # exited; kubelet has not torn the pod down yet
    PodView(name="going", phase="Running", terminating=True),
]


@pytest.mark.parametrize(
    ("policy", "deadline", "deleted"),
    [
        (CleanPodPolicy.ALL, False, ["running", "pending", "done", "failed", "sidecar-left", "exiting"]),
        (CleanPodPolicy.RUNNING, False, ["running", "pending", "sidecar-left"]),
        (CleanPodPolicy.NONE, False, []),
        # past the deadline (or stuck exiting), nothing keeps running whatever the policy
        (CleanPodPolicy.NONE, True, ["running", "pending", "sidecar-left"]),
        (CleanPodPolicy.RUNNING, True, ["running", "pending", "sidecar-left"]),
        (CleanPodPolicy.ALL, True, ["running", "pending", "done", "failed", "sidecar-left", "exiting"]),
    ],
)
def test_clean_pod_policy_chooses_the_pods_to_delete(
    policy: CleanPodPolicy, deadline: bool, deleted: list[str]
) -> None:
    assert pods_to_delete(policy, PODS, stop_running=deadline) == deleted
