"""All-or-nothing placement on the box's node (4 ``example.com/slot``), through the scheduler's PodGroups.

Every rank takes one slot. The control plane serves ``scheduling.k8s.io/v1beta1`` with the
GenericWorkload gate on, so ``gangScheduling: Auto`` (the default) makes a PodGroup per attempt.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.gang_deadlock import SLOT, Watch, gang_job, trial
from ddpjob_box.kubenode.node import KubeletNode
from tests.e2e.conftest import Kubectl, OperatorProcess
from tests.e2e.kube import Jobs, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def jobs(api_client: Any, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(api_client, namespace)


def bound(jobs: Jobs, job: str) -> list[str]:
    pods = jobs.core.list_namespaced_pod(jobs.ns, label_selector=f"ddpjob.dev/job-name={job}").items
    return [p.metadata.name for p in pods if p.spec.node_name]


def test_two_gangs_that_each_need_3_of_4_slots_are_never_partly_placed_and_run_one_after_the_other(
    jobs: Jobs, node: KubeletNode
) -> None:
    """The make-test share of bench.gang_deadlock (20 trials each way, in README)."""
    for _ in range(2):
        result = trial(jobs.core, jobs.custom, jobs.ns, "Auto")
        timeline = "\n".join(result.timeline)
        assert (result.outcome, result.partial) == ("succeeded", 0), (
            f"{result.outcome}, seen partly placed:\n{timeline}"
        )


def test_a_gang_larger_than_the_node_stays_pending_naming_the_shortfall_and_binds_nothing(
    jobs: Jobs, node: KubeletNode, kubectl: Kubectl
) -> None:
    jobs.create(gang_job("six", "Required", ranks=6))

    def said() -> dict[str, Any] | None:
        # The scheduler first reports the PodGroup's verdict alone ("minCount (6) cannot be satisfied"); the
        # pods' own "Insufficient example.com/slot" follows on a later cycle, and the status follows it.
        running = jobs.condition("six", "Running")
        return running if running and running["reason"] == "Unschedulable" and SLOT in running["message"] else None

    try:
        condition = wait_for("the job to say why its gang is not placed", said, 120, interval=1)
    except pytest.fail.Exception:
        pods = jobs.core.list_namespaced_pod(jobs.ns).items
        conditions = {p.metadata.name: [(c.type, c.reason, c.message) for c in p.status.conditions or []] for p in pods}
        pytest.fail(f"status: {jobs.status('six')}\npods: {conditions}", pytrace=False)
    assert jobs.status("six")["phase"] == "Pending"
    message = condition["message"]
    assert message.startswith("the gang of 6 pods is placed all or nothing, and only 4 fit now: "), message
    assert SLOT in message, f"the scheduler's reason names the slots the node lacks: {message}"
    (group,) = jobs.custom.list_namespaced_custom_object("scheduling.k8s.io", "v1beta1", jobs.ns, "podgroups")["items"]
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 6
    time.sleep(5)
    assert bound(jobs, "six") == [], "4 of the 6 would fit: none may be bound"
    assert [e for e in jobs.events("six", "Unschedulable") if e.type == "Warning"]


@pytest.fixture
def priorities(api_client: Any) -> Iterator[tuple[str, str]]:
    """A low and a high PriorityClass, cluster-wide: removed afterwards."""
    from kubernetes import client

    scheduling = client.SchedulingV1Api(api_client)
    suffix = uuid.uuid4().hex[:6]
    names = (f"ddpjob-test-low-{suffix}", f"ddpjob-test-high-{suffix}")
    for name, value in zip(names, (100, 10000), strict=True):
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
    try:
        yield names
    finally:
        for name in names:
            scheduling.delete_priority_class(name)


def _step(log: str) -> int:
    found = re.findall(r"step[= ](\d+)", log)
    return int(found[-1]) if found else 0


def test_a_higher_priority_gang_preempts_a_running_one_whole_which_resumes_from_its_checkpoint_uncounted(
    jobs: Jobs, node: KubeletNode, kubectl: Kubectl, priorities: tuple[str, str]
) -> None:
    low, high = priorities
    jobs.core.create_namespaced_persistent_volume_claim(
        jobs.ns,
        {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    slow = ["--checkpoint-interval", "10", "--slow-rank", "0", "--slow-seconds", "0.1"]
    victim = gang_job("victim", "Auto", steps=150, checkpoint={"claimName": "ckpt"}, runPolicy={"backoffLimit": 0})
    victim["spec"]["template"]["spec"]["priorityClassName"] = low
    victim["spec"]["template"]["spec"]["containers"][0]["args"] += slow
    jobs.create(victim)
    jobs.wait_running("victim", 180)
    wait_for("the victim to pass a checkpoint", lambda: _step(jobs.log("victim-0")) >= 15, 300, interval=1)

    urgent = gang_job("urgent", "Auto", steps=20)
    urgent["spec"]["template"]["spec"]["priorityClassName"] = high
    jobs.create(urgent)

    def preempted() -> dict[str, Any] | None:
        restarting = jobs.condition("victim", "Restarting")
        return restarting if restarting and restarting["reason"] == "Preempted" else None

    restarting = wait_for("the victim to be preempted", preempted, 180, interval=0.5)
    assert "was preempted" in restarting["message"] and "not counted" in restarting["message"], restarting
    status = jobs.status("victim")
    assert status["restarts"] == 0 and status["attempt"] == 1, status
    jobs.wait_phase("urgent", "Succeeded", 300)
    final = jobs.wait_phase("victim", "Succeeded", 600)
    assert final["restarts"] == 0, "a preemption is not counted against backoffLimit (0 here)"
    log = jobs.log("victim-0")
    resumed = re.search(r"resum\w* .*?step[= ](\d+)", log, re.IGNORECASE)
    assert resumed and int(resumed.group(1)) >= 10, f"attempt 1 resumed from the checkpoint, not step 0:\n{log[:2000]}"

    groups = kubectl("get", "podgroups", "-n", jobs.ns, "-o", "name").stdout.split()
    assert sorted(groups) == [
        "podgroup.scheduling.k8s.io/urgent-attempt-0",
        "podgroup.scheduling.k8s.io/victim-attempt-1",
    ]
    kubectl("delete", "ddpjobs", "--all", "-n", jobs.ns, "--wait=false")
    wait_for(
        "the jobs' PodGroups to go with them",
        lambda: not kubectl("get", "podgroups", "-n", jobs.ns, "-o", "name").stdout.strip(),
        60,
        interval=1,
    )


def test_with_gang_scheduling_disabled_a_job_is_placed_pod_by_pod_and_the_status_says_so(
    jobs: Jobs, node: KubeletNode
) -> None:
    blocker = gang_job("blocker", "Disabled", ranks=2, steps=100000)
    jobs.create(blocker)
    wait_for("the blocker's 2 pods to be bound", lambda: len(bound(jobs, "blocker")) == 2 or None, 120, interval=0.5)
    jobs.create(gang_job("split", "Disabled", ranks=3))
    watch = Watch(jobs.core, jobs.ns, ["split"])
    wait_for("2 of the 3 ranks bound, the third waiting", lambda: watch.poll() or None, 120, interval=0.5)

    def said() -> dict[str, Any] | None:
        running = jobs.condition("split", "Running")
        return running if running and running["reason"] == "Unschedulable" else None

    message = wait_for("the status to say so", said, 60, interval=1)["message"]
    assert message.startswith("2 of 3 pods are placed") and SLOT in message, message
    gang = jobs.condition("split", "GangScheduling")
    assert gang is not None and gang["reason"] == "GangSchedulingDisabled"
