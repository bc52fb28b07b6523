"""Every lifecycle rule, one test each, against the real apiserver with the operator running.

There is no kubelet here: tests play it by patching pod status (phase, trainer exit code), and
pods without a node are deleted at once, as the garbage collector and the operator expect.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import pytest

from ddpjob_contract.pods import LABEL_ATTEMPT, LABEL_JOB_NAME, LABEL_RANK
from ddpjob_operator import api

from .conftest import Operator
from .helpers import Raw, job_body, trainer_metrics, wait_for

pytestmark = pytest.mark.cluster


def phase_is(raw: Raw, ns: str, name: str, phase: str) -> Any:
    return lambda: raw.status(ns, name).get("phase") == phase and raw.status(ns, name)


def pods_of_attempt(raw: Raw, ns: str, name: str, attempt: int, count: int) -> Any:
    def check() -> list[dict[str, Any]] | None:
        pods = raw.pods(ns, name)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        ok = len(pods) == count and all(p["metadata"]["labels"][LABEL_ATTEMPT] == str(attempt) for p in live)
        return pods if ok and len(live) == count else None

    return check


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


def start(raw: Raw, ns: str, name: str = "train", replicas: int = 2, **spec: Any) -> list[dict[str, Any]]:
    raw.create_job(ns, job_body(name, replicas, **spec))
    pods: list[dict[str, Any]] = wait_for(pods_of_attempt(raw, ns, name, 0, replicas), what=f"{replicas} pods")
    return pods


def run_all(raw: Raw, ns: str, name: str = "train") -> dict[str, Any]:
    raw.set_all(ns, name, "Running")
    status: dict[str, Any] = wait_for(phase_is(raw, ns, name, "Running"), what="phase Running")
    return status


def test_a_job_gets_a_headless_service_and_one_pod_per_rank_with_the_rendezvous_env(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    pods = start(raw, namespace, "bert", 3, nprocPerNode=1, port=23456)
    (svc,) = [s for s in raw.services(namespace) if s["metadata"]["name"] == "bert"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"][LABEL_JOB_NAME] == "bert"
    job = raw.job(namespace, "bert")
    assert job is not None
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        rank = int(pod["metadata"]["labels"][LABEL_RANK])
        assert pod["metadata"]["name"] == pod["spec"]["hostname"] == f"bert-{rank}"
        assert pod["spec"]["subdomain"] == "bert"
        assert pod["metadata"]["labels"][LABEL_ATTEMPT] == "0"
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["uid"], owner["controller"], owner["blockOwnerDeletion"]) == (job["metadata"]["uid"], True, True)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["MASTER_ADDR"] == "bert-0.bert" and env["MASTER_PORT"] == "23456"
        assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"], env["DDPJOB_ATTEMPT"]) == ("3", str(rank), "0", "0")
        assert [c["name"] for c in pod["spec"]["initContainers"]] == [api.WAIT_CONTAINER]
    launched = lambda: raw.status(namespace, "bert").get("launchedAttempt") == 0 and raw.status(namespace, "bert")  # noqa: E731
    status = wait_for(launched, what="the attempt to be launched")
    assert status["phase"] == "Pending"
    assert status["replicas"] == {"active": 3, "succeeded": 0, "failed": 0}
    assert condition(status, "Created")["status"] == "True"


def test_the_job_runs_once_all_pods_run_and_succeeds_once_every_rank_exits_zero(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace)
    raw.set_pod(namespace, "train-0", "Running")
    wait_for(lambda: raw.status(namespace, "train").get("ready") == "1/2", what="1/2 ready")
    assert raw.status(namespace, "train")["phase"] == "Pending"
    status = run_all(raw, namespace)
    assert status["ready"] == "2/2" and condition(status, "Running")["reason"] == "AllRanksRunning"
    raw.set_all(namespace, "train", "Succeeded", exit_code=0)
    status = wait_for(phase_is(raw, namespace, "train", "Succeeded"), what="phase Succeeded")
    assert status["completionTime"] and status["replicas"] == {"active": 0, "succeeded": 2, "failed": 0}
    assert condition(status, "Succeeded")["status"] == "True"
    assert len(raw.pods(namespace, "train")) == 2, "finished pods stay for their logs"


def test_a_retryable_exit_restarts_the_whole_gang_as_the_next_attempt(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in start(raw, namespace, replicas=3)}
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-1", "Failed", exit_code=200)
    pods = wait_for(pods_of_attempt(raw, namespace, "train", 1, 3), what="3 pods of attempt 1")
    assert all(p["metadata"]["uid"] != first[p["metadata"]["name"]] for p in pods), "every rank was replaced"
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["DDPJOB_ATTEMPT"] == "1"
    status = raw.status(namespace, "train")
    assert (status["attempt"], status["restarts"]) == (1, 1)
    assert "rank 1 (pod train-1) exited with code 200" in condition(status, "Restarting")["message"]
    run_all(raw, namespace)
    assert condition(raw.status(namespace, "train"), "Restarting")["status"] == "False"


def test_deleting_a_pod_counts_as_a_retryable_failure(raw: Raw, namespace: str, operator: Operator) -> None:
    start(raw, namespace)
    run_all(raw, namespace)
    raw.delete_pod(namespace, "train-0")
    wait_for(pods_of_attempt(raw, namespace, "train", 1, 2), what="2 pods of attempt 1")
    status = raw.status(namespace, "train")
    assert status["restarts"] == 1
    assert "rank 0 (pod train-0)" in condition(status, "Restarting")["message"]


def test_an_evicted_pod_counts_as_a_retryable_failure(raw: Raw, namespace: str, operator: Operator) -> None:
    start(raw, namespace)
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-1", "Failed", reason="Evicted")
    wait_for(pods_of_attempt(raw, namespace, "train", 1, 2), what="2 pods of attempt 1")
    assert "Evicted" in condition(raw.status(namespace, "train"), "Restarting")["message"]


def test_after_backoff_limit_restarts_the_job_fails_with_no_pod_left_running(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace, runPolicy={"backoffLimit": 1})
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-1", "Failed", exit_code=137)
    wait_for(pods_of_attempt(raw, namespace, "train", 1, 2), what="attempt 1")
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-0", "Failed", exit_code=200)
    status = wait_for(phase_is(raw, namespace, "train", "Failed"), what="phase Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and status["restarts"] == 1
    assert "rank 0 (pod train-0) exited with code 200" in failed["message"]
    wait_for(lambda: [p["metadata"]["name"] for p in raw.pods(namespace, "train")] == ["train-0"],
             what="only the failed rank left")  # fmt: skip


def test_a_non_retryable_exit_fails_the_job_at_once_with_rank_pod_and_code(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace, replicas=3)
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-2", "Failed", exit_code=2)
    status = wait_for(phase_is(raw, namespace, "train", "Failed"), what="phase Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "NonRetryableFailure" and status["restarts"] == 0
    assert "rank 2 (pod train-2) exited with code 2" in failed["message"]
    assert status["replicas"]["failed"] == 1


def test_the_active_deadline_fails_the_job_and_deletes_its_pods(raw: Raw, namespace: str, operator: Operator) -> None:
    start(raw, namespace, runPolicy={"activeDeadlineSeconds": 2, "cleanPodPolicy": "None"})
    run_all(raw, namespace)
    status = wait_for(phase_is(raw, namespace, "train", "Failed"), what="phase Failed")
    assert condition(status, "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: raw.pods(namespace, "train") == [], what="no pods")


def test_suspending_deletes_the_pods_and_resuming_starts_a_new_attempt(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace)
    run_all(raw, namespace)
    raw.patch_job(namespace, "train", {"spec": {"runPolicy": {"suspend": True}}})
    status = wait_for(phase_is(raw, namespace, "train", "Suspended"), what="phase Suspended")
    assert condition(status, "Suspended")["status"] == "True"
    wait_for(lambda: raw.pods(namespace, "train") == [], what="no pods")
    raw.patch_job(namespace, "train", {"spec": {"replicas": 3, "runPolicy": {"suspend": False}}})
    wait_for(pods_of_attempt(raw, namespace, "train", 1, 3), what="3 pods of attempt 1")
    status = raw.status(namespace, "train")
    assert (status["attempt"], status["restarts"]) == (1, 0)
    assert condition(status, "Suspended")["reason"] == "Resumed"


def test_a_finished_job_is_deleted_after_its_ttl(raw: Raw, namespace: str, operator: Operator) -> None:
    start(raw, namespace, runPolicy={"ttlSecondsAfterFinished": 1})
    raw.set_all(namespace, "train", "Succeeded", exit_code=0)
    wait_for(lambda: raw.job(namespace, "train") is None, what="the job to be deleted")


@pytest.mark.parametrize(("policy", "left"), [("All", []), ("Running", ["train-1"]), ("None", ["train-0", "train-1"])])
def test_clean_pod_policy_decides_which_pods_remain_when_the_job_finishes(
    raw: Raw, namespace: str, operator: Operator, policy: str, left: list[str]
) -> None:
    start(raw, namespace, runPolicy={"cleanPodPolicy": policy})
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-1", "Failed", exit_code=1)
    wait_for(phase_is(raw, namespace, "train", "Failed"), what="phase Failed")

    wait_for(lambda: sorted(p["metadata"]["name"] for p in raw.pods(namespace, "train")) == left, what=f"pods {left}")


def test_ranks_that_exited_0_keep_their_pods_while_kubelet_still_reports_them_running(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    """kubelet reports a pod's terminal phase only once it has torn the pod down, seconds after the trainer's
    exit: until then the phase is Running. cleanPodPolicy Running keeps those pods, and their logs."""
    start(raw, namespace)
    run_all(raw, namespace)
    raw.set_all(namespace, "train", "Running", exit_code=0)
    wait_for(phase_is(raw, namespace, "train", "Succeeded"), what="phase Succeeded")
    time.sleep(3)  # the operator acts on the finish at once: give it the time to delete what it would
    assert sorted(p["metadata"]["name"] for p in raw.pods(namespace, "train")) == ["train-0", "train-1"]


def test_every_transition_is_recorded_as_an_event(raw: Raw, namespace: str, operator: Operator) -> None:
    start(raw, namespace, replicas=1)
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-0", "Failed", exit_code=200)
    wait_for(pods_of_attempt(raw, namespace, "train", 1, 1), what="attempt 1")
    run_all(raw, namespace)
    raw.set_pod(namespace, "train-0", "Succeeded", exit_code=0)
    wait_for(phase_is(raw, namespace, "train", "Succeeded"), what="phase Succeeded")
    # attempt 0's launch is told by Created; a restart's by AttemptLaunched
    expected = ["Created", "AllRanksRunning", "RetryableFailure", "AttemptLaunched", "AllRanksRunning",
                "AllRanksSucceeded"]  # fmt: skip

    def reasons() -> list[str] | None:
        got = [e["reason"] for e in raw.events(namespace, "train")]
        return got if sorted(got) == sorted(expected) else None

    wait_for(reasons, what="one event per transition")


def test_restart_policy_never_fails_the_job_when_a_pod_is_deleted(raw: Raw, namespace: str, operator: Operator) -> None:
    start(raw, namespace, runPolicy={"restartPolicy": "Never"})
    run_all(raw, namespace)
    raw.delete_pod(namespace, "train-1")
    status = wait_for(phase_is(raw, namespace, "train", "Failed"), what="phase Failed")
    assert "rank 1 (pod train-1) was deleted" in condition(status, "Failed")["message"]


def test_deleting_the_job_removes_its_children_without_finalizers(raw: Raw, namespace: str, operator: Operator) -> None:
    start(raw, namespace)
    job = raw.job(namespace, "train")
    assert job is not None and not job["metadata"].get("finalizers")
    raw.delete(f"/apis/ddpjob.dev/v1alpha1/namespaces/{namespace}/ddpjobs/train")
    wait_for(lambda: raw.job(namespace, "train") is None, what="the job to go")
    wait_for(lambda: raw.pods(namespace, "train") == [], what="the garbage collector to delete the pods")


def test_kubectl_get_shows_phase_ready_restarts_step_throughput_step_time_progress_eta_and_age(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace, straggler={"windowSeconds": 4})  # a short window: polled every second
    run_all(raw, namespace)
    for pod in raw.pods(namespace, "train"):  # both ranks train a run of 1000 steps: 50 steps, then 250
        raw.set_pod(namespace, pod["metadata"]["name"], "Running", trainer=trainer_metrics(steps=50, total=1000))
    wait_for(lambda: raw.status(namespace, "train").get("progress", {}).get("step") == 50, what="step 50")
    for pod in raw.pods(namespace, "train"):
        raw.set_pod(namespace, pod["metadata"]["name"], "Running", trainer=trainer_metrics(steps=250, total=1000))

    def table_row() -> list[Any] | None:
        table = raw.request(
            "GET", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.PLURAL}",
            headers_accept="application/json;as=Table;v=v1;g=meta.k8s.io",
        )  # fmt: skip
        assert [c["name"] for c in table["columnDefinitions"]] == [
            "Name", "Phase", "Ready", "Restarts", "Step", "Img/s", "Step-Time", "Progress", "ETA", "Queue",
            "Spans", "Checkpoint", "Age",
        ]  # fmt: skip
        (row,) = table["rows"]
        cells: list[Any] = row["cells"]
        return cells if cells[4] == 250 and cells[5] and cells[8] else None

    cells = wait_for(table_row, what="a row with step 250, a throughput and an ETA")
    assert cells[:5] == ["train", "Running", "2/2", 0, 250]
    assert cells[5] > 0, "images per second, from the samples counted between two polls"
    # every step took 30 ms: the median, read from the histogram as histogram_quantile does, is the
    # middle of their bucket (25 ms, 50 ms]
    assert cells[6] == "37.5ms"
    assert cells[7] == 25, "step 250 of the 1000 the ranks say the run has"
    progress = raw.status(namespace, "train")["progress"]
    # the 750 steps left at the pace the step went from 50 to 250 (between two polls, a second or more apart)
    assert progress["etaSeconds"] == math.ceil(750 / progress["stepsPerSecond"]), progress
    assert re.fullmatch(r"\d+[smhd](\d+[smh])?", cells[8]), cells[8]
    status = raw.status(namespace, "train")
    assert status["startTime"] and status["observedGeneration"] == 1


def test_the_operator_leaves_namespaces_it_does_not_watch_alone(
    raw: Raw, namespace: str, module_namespace: str, operator: Operator
) -> None:
    raw.create_job(module_namespace, job_body("elsewhere"))
    start(raw, namespace, "here")
    assert raw.status(module_namespace, "elsewhere") == {}
    assert raw.pods(module_namespace, "elsewhere") == []
