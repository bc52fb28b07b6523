"""In-place gang restarts: the rules on the trainer, the pods as the kubelet reports them, and the plan."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from ddpjob_contract.pods import ANNOTATION_RESTART_COUNT, LABEL_ATTEMPT
from ddpjob_contract.status import Phase
from ddpjob_operator import actions, builders
from ddpjob_operator.policies import in_place
from ddpjob_operator.progress import RankSample
from ddpjob_operator.status import MachineFault, pod_view

from .factories import job
from .test_controller import KEY, FakeKube, controller
from .test_lifecycle import FakeCluster, running, train


@pytest.mark.parametrize(
    ("run_policy", "codes"),
    [
        ({}, {"operator": "In", "values": list(range(128, 256))}),
        ({"retryableExitCodes": [3, 200]}, {"operator": "In", "values": [3, *range(128, 256)]}),
        ({"restartPolicy": "OnFailure"}, {"operator": "NotIn", "values": [0]}),
    ],
)
def test_the_trainer_restarts_its_pod_in_place_on_the_exits_the_policy_retries(
    run_policy: dict[str, Any], codes: dict[str, Any]
) -> None:
    trainer = builders.pod(job(runPolicy=run_policy), 0, 0, gang=False, in_place=True)["spec"]["containers"][0]
    assert trainer["restartPolicy"] == "Never"
    assert trainer["restartPolicyRules"] == [{"action": "RestartAllContainers", "exitCodes": codes}]


def test_no_rule_under_restart_policy_never_or_where_the_cluster_cannot() -> None:
    never = builders.pod(job(runPolicy={"restartPolicy": "Never"}), 0, 0, gang=False, in_place=True)
    plain = builders.pod(job(), 0, 0, gang=False, in_place=False)
    for built in (never, plain):
        assert "restartPolicyRules" not in built["spec"]["containers"][0]
        assert built["spec"]["restartPolicy"] == "Never"


RULES = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [137, 200]}}]


def raw(state: dict[str, Any], *, restarts: int = 0, last: dict[str, Any] | None = None, began: int | None = None,
        phase: str = "Running") -> dict[str, Any]:  # fmt: skip
    """A rank pod with a RestartAllContainers rule, its trainer in ``state`` (and ``last``), as the kubelet says."""
    status: dict[str, Any] = {"name": "trainer", "state": state, "restartCount": restarts}
    if last:
        status["lastState"] = last
    return {
        "metadata": {"name": "train-1", "uid": "u1", "labels": {"ddpjob.dev/rank": "1", LABEL_ATTEMPT: "2"},
                     "annotations": {ANNOTATION_RESTART_COUNT: str(began)} if began is not None else {}},
        "spec": {"containers": [{"name": "trainer", "restartPolicy": "Never", "restartPolicyRules": RULES}]},
        "status": {"phase": phase, "podIP": "10.0.0.1", "containerStatuses": [status]},
    }  # fmt: skip


def exited(code: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "finishedAt": "2026-01-01T00:00:00Z", "message": "lost a peer"}}


# What the kubelet reports once it has restarted a pod in place (seen on 1.37.2 in the box): the exit that caused
# it is replaced by its removal.
REMOVED = {"terminated": {"exitCode": 137, "reason": "RestartingAllContainers",
                          "message": "The container is removed because RestartAllContainers in place"}}  # fmt: skip


def test_an_exit_is_a_failure_until_the_pod_is_adopted_and_then_it_only_began_the_attempt() -> None:
    failed = pod_view(raw(exited(200)), "trainer")
    assert failed.in_place and failed.exit_code == 200 and failed.next_count == 1 and not failed.running
    # The kubelet restarted it before the operator looked: a restart past the attempt's count, its code lost.
    again = pod_view(raw({"waiting": {}}, restarts=1, last=REMOVED, phase="Pending"), "trainer")
    assert again.failed and again.restarted_by_kubelet and again.next_count == 1
    # Adopted at count 1: the exit it lies in is the last attempt's; then it runs this attempt's process.
    waiting = pod_view(raw(exited(200), began=1), "trainer")
    assert waiting.exit_code is None and waiting.restarting and not waiting.running and waiting.adopted
    back = pod_view(raw({"running": {}}, restarts=1, last=REMOVED, began=1), "trainer")
    assert back.exit_code is None and not back.restarting and back.running
    # Restarted again since: this attempt's failure.
    later = pod_view(raw({"running": {}}, restarts=2, last=REMOVED, began=1), "trainer")
    assert later.failed and later.restarted_by_kubelet


def test_a_pod_without_the_rule_reads_as_before() -> None:
    body = raw({"running": {}}, restarts=1, last=exited(137))
    del body["spec"]["containers"][0]["restartPolicyRules"]
    plain = pod_view(body, "trainer")
    assert not plain.in_place and plain.exit_code is None and plain.running


def in_place_cluster(replicas: int = 2, **spec: Any) -> FakeCluster:
    c = running(replicas, **spec)
    c.set_all(in_place=True, trainer_running=True)
    return c


def adopt(c: FakeCluster, names: list[str]) -> None:
    """What the operator's patch does, as the next pod views show it: in the attempt, waiting to run again."""
    for name in names:
        c.pods[name] = replace(
            c.pods[name],
            attempt=c.status.attempt,
            adopted=True,
            exit_code=None,
            exit_reason="",
            restarting=True,
            trainer_running=False,
        )


def test_a_retryable_exit_restarts_the_gang_in_place_counting_one_restart() -> None:
    c = in_place_cluster(2)
    c.set(1, exit_code=137, next_count=1)
    p = c.step()
    assert c.status.phase is Phase.RESTARTING and (c.status.attempt, c.status.restarts) == (1, 1)
    assert [x.name for x in p.adopt_pods] == ["train-1"], "restarted by its kubelet: kept"
    assert p.delete_pods == () and p.create_ranks == ()
    assert p.requeue_after is not None and p.requeue_after <= in_place.WAIT_SECONDS, "rank 0 is given its time"
    adopt(c, ["train-1"])
    c.set(0, exit_code=200, next_count=1)  # its collective failed with the lost peer
    p = c.step()
    assert [x.name for x in p.adopt_pods] == ["train-0"] and c.status.restarts == 1, "one gang restart, counted once"
    adopt(c, ["train-0"])
    p = c.step()
    assert p.create_ranks == () and p.delete_pods == () and not p.create_pod_group
    c.set_all(restarting=False, trainer_running=True)
    c.settle()
    c.poll()
    c.settle()
    assert c.status.phase is Phase.RUNNING and (c.status.attempt, c.status.restarts) == (1, 1)
    assert c.condition("Restarting")[:2] == (False, "Recovered")
    assert {p.uid for p in c.pods.values()} == {"uid-0-0", "uid-1-0"}, "the same pods"


def test_a_rank_that_does_not_exit_within_the_wait_is_made_again_without_a_podgroup_of_its_own() -> None:
    c = in_place_cluster(2, gangScheduling="Auto")
    c.set(1, exit_code=137, next_count=1)
    c.step()
    adopt(c, ["train-1"])
    assert c.step().delete_pods == (), "within the wait"
    c.now += timedelta(seconds=in_place.WAIT_SECONDS + 1)
    p = c.step()
    assert [x.name for x in p.delete_pods] == ["train-0"]
    p = c.step()
    assert p.create_ranks == (0,) and not p.gang and not p.create_pod_group, "it joins the gang already placed"


def test_a_non_retryable_exit_in_place_fails_the_job_as_before() -> None:
    c = in_place_cluster(2)
    c.set(1, exit_code=1, phase="Failed")
    p = c.step()
    assert c.status.phase is Phase.FAILED and p.adopt_pods == ()


def test_a_failure_after_an_in_place_restart_is_the_next_restart() -> None:
    c = in_place_cluster(2)
    c.set(1, exit_code=137, next_count=1)
    c.step()
    adopt(c, ["train-1"])
    c.set(0, exit_code=200, next_count=1)
    c.step()
    adopt(c, ["train-0"])
    c.set_all(restarting=False, trainer_running=True)
    c.settle()
    c.poll()
    c.settle()
    c.set(0, exit_code=137, exit_reason="RestartingAllContainers", next_count=2)
    p = c.step()
    assert (c.status.attempt, c.status.restarts) == (2, 2) and [x.name for x in p.adopt_pods] == ["train-0"]


def test_the_last_attempt_backoff_limit_allows_is_made_anew_so_that_its_failure_stays_readable() -> None:
    c = in_place_cluster(2, runPolicy={"backoffLimit": 1})
    c.set(1, exit_code=137, next_count=1)
    p = c.step()
    assert (c.status.attempt, c.status.restarts) == (1, 1)
    assert p.adopt_pods == () and sorted(x.name for x in p.delete_pods) == ["train-0", "train-1"], (
        "attempt 1 is the last: none of attempt 0's pods joins it in place"
    )
    assert in_place.for_attempt(c.job.spec.run_policy, 0) and not in_place.for_attempt(c.job.spec.run_policy, 1)


def test_the_last_attempts_pods_are_built_without_the_restart_rule() -> None:
    def built(restarts: int) -> list[dict[str, Any]]:
        kube = FakeKube(replicas=2)
        kube.job["spec"]["runPolicy"] = {"backoffLimit": 2}
        kube.job["status"] = {"phase": "Restarting", "attempt": restarts, "launchedAttempt": restarts - 1,
                              "restarts": restarts}  # fmt: skip
        kube.in_place = True
        with ThreadPoolExecutor(2) as pool:
            ctl = controller(kube, pool)
            ctl.bodies.put(KEY, kube.job)
            ctl.reconcile(KEY)
        return [o["spec"]["containers"][0] for o in kube.posted if o["kind"] == "Pod"]

    assert [bool(c.get("restartPolicyRules")) for c in built(1)] == [True, True], "attempt 1 of 3: in place"
    assert [bool(c.get("restartPolicyRules")) for c in built(2)] == [False, False], "attempt 2 is the last"


@pytest.mark.parametrize(
    ("run_policy", "restarts", "left"),
    [
        ({"backoffLimit": 3}, 0, 3),
        ({"backoffLimit": 3}, 1, 2),
        ({"backoffLimit": 3}, 3, 0),  # the last attempt: its failure ends the job as it failed
        ({"backoffLimit": 3, "inPlaceRestart": "Disabled"}, 0, 0),
        ({"backoffLimit": 3, "restartPolicy": "Never"}, 0, 0),
        ({"backoffLimit": 3, "restartPolicy": "OnFailure"}, 1, 2),
    ],
)
def test_the_ranks_supervisors_may_restart_the_gang_in_place_as_often_as_restarts_are_left(
    run_policy: dict[str, Any], restarts: int, left: int
) -> None:
    policy = job(runPolicy=run_policy).spec.run_policy
    assert in_place.in_process(policy, restarts) == left
    pod = builders.pod(job(runPolicy=run_policy), 0, 0, gang=False, restarts_left=left)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MAX_RESTARTS"] == str(left)


def _restarted(c: FakeCluster, count: int, why: str = "rank 1's training process was killed by SIGKILL") -> None:
    """Every rank's supervisor restarted the gang ``count`` times in all: their new processes answer from step 0."""
    c.metrics = {rank: RankSample(ready=True, step=0, restart_count=count, restart_reason=why) for rank in c.metrics}


def test_a_restart_in_the_ranks_processes_is_counted_once_and_keeps_the_attempt_and_its_pods() -> None:
    c = running(2, runPolicy={"backoffLimit": 3})
    train(c, 5, 10)
    pods = dict(c.pods)
    _restarted(c, 1)
    c.poll()
    c.poll()  # the same count again: nothing more
    assert (c.status.restarts, c.status.attempt, c.status.phase) == (1, 0, Phase.RUNNING)
    assert c.pods == pods, "no pod deleted or made"
    assert c.events.count("RetryableFailure") == 1
    assert c.event_messages[-1] == (
        "rank 1's training process was killed by SIGKILL; the ranks' supervisors restarted the gang's processes "
        "in place (restart 1 of 3; attempt 0 and its pods kept)"
    )
    assert c.status.progress is not None and c.status.progress.to_dict()["restartsInPlace"] == 1
    _restarted(c, 3)  # two more between two polls
    c.poll()
    assert c.status.restarts == 3 and c.events.count("RetryableFailure") == 2


def test_restarts_in_the_ranks_processes_past_the_backoff_limit_fail_the_job() -> None:
    # Possible only when a pod its kubelet restarted in place kept an earlier attempt's MAX_RESTARTS.
    c = running(2, runPolicy={"backoffLimit": 1})
    _restarted(c, 2)
    c.poll()
    assert c.status.phase is Phase.FAILED
    assert c.condition("Failed")[:2] == (True, "BackoffLimitExceeded")
    assert "killed by SIGKILL, and its processes restarted in place; no restarts left" in c.condition("Failed")[2]


def test_after_a_restart_in_place_the_progress_deadline_counts_from_the_restart_not_the_lost_steps() -> None:
    c = running(2, progressDeadlineSeconds=30, runPolicy={"backoffLimit": 3})
    train(c, 5, 100)  # step 100, then back to the checkpoint's step 0, below it for longer than the deadline
    _restarted(c, 1)
    c.poll()
    for _ in range(4):
        train(c, 10, 20)  # steps 20 to 80: below 100, yet moving
    assert c.status.phase is Phase.RUNNING and c.status.restarts == 1


def test_a_restart_in_place_that_no_poll_saw_is_counted_from_the_exit_summaries_at_the_end() -> None:
    c = running(2, runPolicy={"backoffLimit": 3})
    train(c, 5, 10)
    summary = '{"step": 500, "samples": 4000, "restarts": 1}'  # the processes after the restart, which no poll saw
    for rank in range(2):
        c.set(rank, phase="Succeeded", exit_code=0, message=summary)
    c.settle()
    assert (c.status.phase, c.status.restarts) == (Phase.SUCCEEDED, 1)
    assert c.events.count("RetryableFailure") == 1
    assert c.status.progress is not None and c.status.progress.final and c.status.progress.step == 500


def test_a_rank_failing_after_an_in_place_restart_that_trained_no_step_restarts_the_gang_uncounted() -> None:
    # A power cut: rank 1's node dies with its supervisor; rank 0's supervisor restarts its process in place
    # (counted), which then fails, its peer gone for good. One fault, one restart.
    c = running(2, runPolicy={"backoffLimit": 3})
    train(c, 5, 10)
    _restarted(c, 1, "rank 0's training process exited 200 (a lost peer or a collective timeout)")
    c.poll()
    c.poll()  # the new processes answer at step 0, and the old ones' steps are theirs
    assert c.status.restarts == 1 and c.status.progress is not None and not c.status.progress.step
    c.set(0, phase="Failed", exit_code=200)
    c.step()
    assert (c.status.phase, c.status.attempt, c.status.restarts) == (Phase.RESTARTING, 1, 1)
    status, reason, message = c.condition("Restarting")
    assert (status, reason) == (True, "RetryableFailure")
    assert "restarted in place (restart 1, already counted), trained no step before it: the same failure" in message
    assert message.endswith("restarting the gang as attempt 1 (not counted: restarts stay 1 of 3)")


def test_a_rank_failing_after_its_in_place_restart_trained_is_counted_again() -> None:
    c = running(2, runPolicy={"backoffLimit": 3})
    train(c, 5, 10)
    _restarted(c, 1)
    c.poll()
    train(c, 5, 3)  # the restarted processes train
    assert c.status.progress is not None and c.status.progress.step == 3
    c.set(0, phase="Failed", exit_code=200)
    c.step()
    assert (c.status.attempt, c.status.restarts) == (1, 2)


def test_an_uncounted_restart_after_an_in_place_one_still_sees_a_machine_fault_twice_on_one_node() -> None:
    c = running(2, runPolicy={"backoffLimit": 3})
    c.set_all(node="node-1")
    c.status = replace(c.status, machine_fault=MachineFault("node-1", 0, "SIGBUS"))  # the last attempt's fault
    train(c, 5, 10)
    _restarted(c, 1)
    c.poll()
    c.poll()
    c.set(0, phase="Failed", exit_code=135)  # SIGBUS again on node-1, before the restarted processes trained
    c.step()
    assert c.condition("Restarting")[:2] == (True, "NodeUnhealthy") and c.status.restarts == 1
    assert [e.name for e in c.status.excluded_nodes] == ["node-1"]


def test_a_reconcile_that_adopts_pods_looks_again_at_once_for_the_ranks_left_to_make() -> None:
    """The adopting patch's answer goes into the pod cache, so the watch's echo of it wakes nothing: the plan that
    makes the ranks beside the adopted one must come from a look at once (the DNS test stalled 300 s without it)."""
    c = in_place_cluster(2)
    c.set(1, exit_code=137, next_count=1)
    p = c.step()
    assert [x.name for x in p.adopt_pods] == ["train-1"] and p.create_ranks == ()
    assert actions.next_look(p) == 0.0
    waiting = replace(p, adopt_pods=())
    assert actions.next_look(waiting) == waiting.requeue_after and waiting.requeue_after, "rank 0's time to exit"
