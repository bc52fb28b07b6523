"""Kueue's admission as data: the job's plans from Workloads shaped as Kueue v0.17.0 writes them.

What Kueue itself does (admitting, evicting, preempting) is shown against real Kueue in tests/kueue; here, the
operator's half: no pod before admission, the flavors on the pods, an eviction that stops the ranks without
counting a restart, the quota given back only once every pod is gone, and the Workload's own conditions.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ddpjob_contract import kueue
from ddpjob_contract.status import ConditionType, Phase, Reason
from ddpjob_operator import builders, queueing
from ddpjob_operator.actions import KUEUE_POLL_SECONDS, Plan
from ddpjob_operator.api import Job, parse_job
from ddpjob_operator.lifecycle import plan
from ddpjob_operator.policies import admission
from ddpjob_operator.status import JobStatus, PodView

from .factories import body, pod

T0 = datetime(2026, 11, 26, tzinfo=UTC)
FLAVOR = {"metadata": {"name": "slots"}, "spec": {"nodeLabels": {"pool": "a"},
          "tolerations": [{"key": "slot", "operator": "Exists", "effect": "NoSchedule"}]}}  # fmt: skip


def queued_job(replicas: int = 2, **spec: Any) -> Job:
    b = body("train", replicas, **spec)
    b["metadata"]["labels"] = {kueue.LABEL_QUEUE_NAME: "team-a"}
    b["metadata"]["uid"] = "0123456789abcdef"
    return parse_job(b)


def cond(type_: str, status: bool, reason: str = "R", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-26T00:00:00Z"}  # fmt: skip


def workload(j: Job, *conditions: dict[str, Any], count: int | None = None, finalizer: bool = True) -> dict[str, Any]:
    wl = builders.workload(j, None)
    wl["metadata"].update(uid="wl-uid", generation=1, resourceVersion="7")
    if not finalizer:
        wl["metadata"]["finalizers"] = []
    status: dict[str, Any] = {"conditions": list(conditions)}
    if any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in conditions):
        assignment = {
            "name": kueue.POD_SET,
            "flavors": {"example.com/slot": "slots"},
            "count": count or j.spec.replicas,
        }
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [assignment]}
    wl["status"] = status
    return wl


def read(j: Job, wl: dict[str, Any] | None) -> queueing.Queueing:
    flavors = {"slots": FLAVOR} if wl and queueing.assigned_flavors(wl) else {}
    return queueing.read(j.queue, wl, flavors, name=queueing.workload_name(j.name, j.uid))


ADMITTED = (cond("QuotaReserved", True, "QuotaReserved"), cond("Admitted", True, "Admitted"))
PENDING = cond("QuotaReserved", False, "Pending", "couldn't assign flavors to pod set ranks: insufficient quota for "
               "example.com/slot in flavor slots, request > maximum capacity (4 > 2)")  # fmt: skip


def run(j: Job, status: JobStatus, pods: list[PodView], wl: dict[str, Any] | None) -> Plan:
    return plan(j, status, pods, T0, queued=read(j, wl))


def test_a_labelled_job_gets_a_workload_and_no_pod_until_admitted_and_says_kueues_reason() -> None:
    j = queued_job()
    first = run(j, JobStatus(), [], None)
    assert first.create_workload and not first.create_ranks and not first.create_service
    assert first.status.phase is Phase.QUEUED
    waiting = run(j, first.status, [], workload(j, PENDING))
    assert not waiting.create_workload and not waiting.create_ranks
    said = waiting.status.condition(ConditionType.QUEUED)
    assert said is not None and said.status and "insufficient quota for example.com/slot" in said.message
    assert said.message.startswith("queued in LocalQueue team-a")
    assert waiting.requeue_after == KUEUE_POLL_SECONDS, "before the Workload watch has listed, it is read again"
    assert [e.reason for e in first.events] == ["Created", "Queued"]
    assert waiting.events == (), "Kueue's new words are the status's: the attempt's Queued Event is there (409s)"


def test_a_job_waiting_in_a_watched_queue_is_not_looked_at_again_until_kueue_writes_its_workload() -> None:
    j = queued_job()
    first = run(j, JobStatus(), [], None)
    wl = workload(j, PENDING)
    waiting = plan(j, first.status, [], T0, queued=queueing.read(j.queue, wl, {}, name=wl["metadata"]["name"],
                                                                  watched=True))  # fmt: skip
    assert waiting.status.phase is Phase.QUEUED and not waiting.create_workload
    assert waiting.requeue_after is None, "Kueue's admission comes by the watch, which wakes the job"
    creating = plan(j, first.status, [], T0, queued=queueing.read(j.queue, None, {}, name="w", watched=True))
    assert creating.requeue_after == KUEUE_POLL_SECONDS, "no Workload yet: it is being created, and read again"


def test_the_workload_is_one_pod_set_of_every_rank_owned_by_the_job_with_kueues_finalizer() -> None:
    j = queued_job(4, minReplicas=2)
    wl = builders.workload(j, builders.Priority("high", 1000))
    assert wl["metadata"]["finalizers"] == [kueue.FINALIZER]
    assert wl["metadata"]["ownerReferences"][0]["uid"] == j.uid and wl["metadata"]["ownerReferences"][0]["controller"]
    assert wl["metadata"]["labels"][kueue.LABEL_JOB_UID] == j.uid
    (pod_set,) = wl["spec"]["podSets"]
    assert (pod_set["count"], pod_set["minCount"]) == (4, 2)
    assert set(pod_set["template"]["metadata"]) == {"labels", "annotations"}
    assert wl["spec"]["queueName"] == "team-a"
    assert wl["spec"]["priorityClassRef"] == {"group": kueue.GROUP, "kind": "WorkloadPriorityClass", "name": "high"}
    assert wl["spec"]["priority"] == 1000


def test_on_admission_the_pods_carry_the_flavors_node_labels_and_tolerations() -> None:
    j = queued_job()
    queued = run(j, JobStatus(), [], None).status
    admitted = run(j, queued, [], workload(j, *ADMITTED))
    assert admitted.status.phase is Phase.PENDING and admitted.create_ranks == (0, 1)
    pod_body = admitted.placement.apply(builders.pod(j, 0, admitted.status.attempt, gang=False))
    assert pod_body["spec"]["nodeSelector"] == {"pool": "a"}
    assert {"key": "slot", "operator": "Exists", "effect": "NoSchedule"} in pod_body["spec"]["tolerations"]
    assert pod_body["metadata"]["labels"][kueue.LABEL_POD_SET] == kueue.POD_SET


def test_partial_admission_runs_the_admitted_ranks_at_that_world_size_and_says_so() -> None:
    j = queued_job(4, minReplicas=2)
    queued = run(j, JobStatus(), [], None).status
    admitted = run(j, queued, [], workload(j, *ADMITTED, count=2))
    assert admitted.create_ranks == (0, 1)
    assert admitted.status.admitted_replicas == 2
    said = admitted.status.condition(ConditionType.QUEUED)
    assert said is not None and "running 2 of 4 ranks" in said.message
    started = [pod(j, r, admitted.status.attempt, phase="Running", ip=f"10.0.0.{r}") for r in (0, 1)]
    launched = run(j, admitted.status, started, workload(j, *ADMITTED, count=2))
    running = run(j, launched.status, started, workload(j, *ADMITTED, count=2))
    assert running.status.phase in (Phase.RENDEZVOUS, Phase.RUNNING)
    assert running.status.replicas == 2


def running_job() -> tuple[Job, JobStatus, list[PodView]]:
    j = queued_job()
    status = run(j, JobStatus(), [], None).status
    status = run(j, status, [], workload(j, *ADMITTED)).status
    pods = [pod(j, r, status.attempt, phase="Running", ip=f"10.0.0.{r}") for r in (0, 1)]
    for _ in range(3):
        status = run(j, status, pods, workload(j, *ADMITTED)).status
    return j, status, pods


def test_an_eviction_stops_the_ranks_without_counting_a_restart_and_queues_the_job_again() -> None:
    j, status, pods = running_job()
    evicted = (*ADMITTED, cond("Evicted", True, "Preempted", "Preempted to accommodate a workload (UID: x)"))
    p = run(j, status, pods, workload(j, *evicted))
    assert p.status.phase is Phase.QUEUED
    assert {v.name for v in p.delete_pods} == {"train-0", "train-1"}
    assert p.status.restarts == status.restarts
    said = p.status.condition(ConditionType.QUEUED)
    assert said is not None and said.reason == Reason.EVICTED and "Preempted" in said.message
    assert not p.workload_status, "the quota is given back only once every pod is gone"
    terminating = [replace(v, terminating=True) for v in pods]
    still = run(j, p.status, terminating, workload(j, *evicted))
    assert not still.workload_status and not still.create_ranks
    gone = run(j, still.status, [], workload(j, *evicted))
    (ack,) = gone.workload_status
    assert ack.manager == kueue.ADMISSION_MANAGER
    conditions = {c["type"]: c for c in ack.body["status"]["conditions"]}
    assert conditions["QuotaReserved"]["status"] == "False" and conditions["QuotaReserved"]["reason"] == "Pending"
    assert conditions["Requeued"]["status"] == "True"
    assert conditions["Admitted"]["status"] == "False"
    assert "Evicted" in conditions, "an apply as Kueue's manager restates every condition that manager owns"
    assert "admission" not in ack.body["status"]


def test_readmitted_after_an_eviction_it_starts_a_new_attempt() -> None:
    j, status, pods = running_job()
    evicted = (*ADMITTED, cond("Evicted", True, "PodsReadyTimeout", "Exceeded the PodsReady timeout"))
    queued = run(j, status, pods, workload(j, *evicted)).status
    queued = run(j, queued, [], workload(j, cond("QuotaReserved", False, "Pending"))).status
    again = run(j, queued, [], workload(j, *ADMITTED))
    assert again.status.phase is Phase.PENDING and again.status.attempt == status.attempt + 1
    assert again.create_ranks == (0, 1) and again.status.restarts == status.restarts


def test_podsready_is_written_once_every_rank_runs_and_not_again() -> None:
    j, status, pods = running_job()
    p = run(j, status, pods, workload(j, *ADMITTED))
    (ready,) = p.workload_status
    (c,) = ready.body["status"]["conditions"]
    assert (c["type"], c["status"], c["reason"]) == ("PodsReady", "True", "Started")
    said = workload(j, *ADMITTED, cond("PodsReady", True, "Started", "All pods reached readiness and the workload "
                                                                   "is running"))  # fmt: skip
    assert run(j, status, pods, said).workload_status == ()


def test_a_finished_job_marks_its_workload_finished_then_drops_the_finalizer() -> None:
    j, status, pods = running_job()
    done = [replace(v, phase="Succeeded", exit_code=0) for v in pods]
    p = run(j, status, done, workload(j, *ADMITTED))
    assert p.status.phase is Phase.SUCCEEDED
    finished = [w for w in p.workload_status if w.body["status"].get("conditions")]
    assert finished and finished[-1].body["status"]["conditions"][0]["reason"] == "Succeeded"
    after = run(j, p.status, done, workload(j, *ADMITTED, cond("Finished", True, "Succeeded")))
    assert after.release_workload and after.workload_status == ()


def test_ranks_that_exit_together_give_their_quota_back_with_finished_and_a_late_one_frees_the_others() -> None:
    """bench.scale: one reclaimablePods write per rank that exited 0 made most of a job's 8.9 Workload writes. A DDP
    gang's ranks leave together (every one passed the last barrier), so those that did are counted only once the
    first has been gone RECLAIM_AFTER_SECONDS: none for a gang that ends at once, whose Finished gives all back."""
    j, status, pods = running_job()
    wl = workload(j, *ADMITTED, cond("PodsReady", True, "Started", "All pods reached readiness and the workload "
                                                                 "is running"))  # fmt: skip
    exited = replace(pods[0], phase="Succeeded", exit_code=0, finished_at="2026-11-26T00:00:00Z")  # at T0
    p = run(j, status, [exited, pods[1]], wl)
    assert p.workload_status == (), "rank 1 is leaving too: no write per rank"
    assert p.requeue_after is not None and p.requeue_after <= admission.RECLAIM_AFTER_SECONDS, "looked at again"
    later = T0 + timedelta(seconds=admission.RECLAIM_AFTER_SECONDS)
    due = plan(j, p.status, [exited, pods[1]], later, queued=read(j, wl))
    (reclaim,) = due.workload_status
    assert reclaim.body["status"]["reclaimablePods"] == [{"name": kueue.POD_SET, "count": 1}]
    assert due.requeue_after != 0.0, "written: Kueue's answer wakes the job, no look again at once"
    evicted = workload(j, *ADMITTED, cond("Evicted", True, "Preempted", "Preempted to accommodate a workload"))
    gone = plan(j, p.status, [exited, pods[1]], later, queued=read(j, evicted))
    assert not gone.workload_status and gone.requeue_after != 0.0, "evicted: nothing to count, no spin"


def test_a_labelled_job_without_kueue_installed_says_so_and_makes_nothing() -> None:
    j = queued_job()
    q = queueing.read(j.queue, None, {}, name="x", served=False)
    p = plan(j, JobStatus(), [], T0, queued=q)
    assert p.status.phase is Phase.QUEUED and not p.create_ranks and not p.create_workload
    said = p.status.condition(ConditionType.QUEUED)
    assert said is not None and said.reason == Reason.KUEUE_NOT_INSTALLED
    assert "does not serve Kueue's Workload API" in said.message and "remove the label" in said.message
    again = plan(j, p.status, [], T0, queued=q)
    assert again.events == (), "said once"


@pytest.mark.parametrize(
    ("phase", "q", "verdict"),
    [
        (Phase.PENDING, queueing.Queueing(), None),
        (Phase.QUEUED, queueing.Queueing(queue="q", exists=True, admitted=True, count=2), admission.Verdict.ADMIT),
        (Phase.RUNNING, queueing.Queueing(queue="q", exists=True, admitted=True, count=2), None),
        (
            Phase.RUNNING,
            queueing.Queueing(queue="q", exists=True, admitted=True, evicted=queueing.Eviction("Preempted", "")),
            admission.Verdict.EVICT,
        ),
        (
            Phase.RUNNING,
            queueing.Queueing(queue="q", exists=True, admitted=True, deleting=True),
            admission.Verdict.EVICT,
        ),
        (Phase.SUSPENDED, queueing.Queueing(queue="q", exists=True), None),
        (Phase.SUCCEEDED, queueing.Queueing(queue="q", exists=True, evicted=queueing.Eviction("Preempted", "")), None),
        (Phase.PENDING, queueing.Queueing(queue="q", exists=True), admission.Verdict.QUEUE),
    ],
)
def test_the_admission_policy(phase: Phase, q: queueing.Queueing, verdict: admission.Verdict | None) -> None:
    decision = admission.decide(q, phase, said="")
    assert (decision.verdict if decision else None) is verdict


def test_a_job_without_the_label_is_untouched() -> None:
    from .factories import job

    j = job()
    p = plan(j, JobStatus(), [], T0)
    assert p.create_ranks == (0, 1) and not p.create_workload and p.status.phase is Phase.PENDING


def test_each_field_the_operator_keeps_in_the_workload_has_a_field_manager_of_its_own() -> None:
    """An apply removes what its manager applied before and left out: one manager for PodsReady and
    reclaimablePods together made the next PodsReady apply drop reclaimablePods, which Kueue's webhook refuses
    ('status.reclaimablePods[ranks]: Required value: cannot be removed'), as seen on the box."""
    j, _, _ = running_job()
    q = read(j, workload(j, *ADMITTED))
    applies = [queueing.pods_ready(q, True, T0), queueing.reclaimable(q, 1), queueing.finished(q, True, "done", T0)]
    managers = [a.manager for a in applies if a is not None]
    assert len(managers) == 3 and len(set(managers)) == 3, managers
    assert kueue.ADMISSION_MANAGER not in managers
