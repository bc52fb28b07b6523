"""Reading pods, sorting them into ranks, and the status round trip."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ddpjob_contract.pods import ANNOTATION_SPEC_HASH, LABEL_ATTEMPT, LABEL_RANK
from ddpjob_contract.status import Phase
from ddpjob_operator.status import JobStatus, PodView, observe, parse_status, pod_view

from .factories import job, pod, pods

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def raw_pod(phase: str = "Running", *, exit_code: int | None = None, **extra: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}} if exit_code is None else {
        "terminated": {"exitCode": exit_code, "finishedAt": "2026-01-01T00:00:00Z"}
    }  # fmt: skip
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [{"name": "trainer", "state": state}]}
    status.update(extra.pop("status", {}))
    meta: dict[str, Any] = {
        "name": "j-1", "uid": "u", "labels": {LABEL_RANK: "1", LABEL_ATTEMPT: "2"},
        "annotations": {ANNOTATION_SPEC_HASH: "h"},
    }  # fmt: skip
    meta.update(extra.pop("metadata", {}))
    return {"metadata": meta, "status": status}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (raw_pod(), dict(phase="Running", exit_code=None, running=True, failed=False, succeeded=False)),
        (raw_pod("Succeeded", exit_code=0), dict(exit_code=0, succeeded=True, failed=False, finished=True)),
        # the trainer exited 0 and kubelet has not torn the pod down yet, so its phase is still Running
        (raw_pod("Running", exit_code=0), dict(succeeded=True, running=False, finished=True)),
        (raw_pod("Failed", exit_code=200), dict(exit_code=200, failed=True, running=False)),
        # a sidecar keeps the pod Running, but the trainer has exited: that rank has failed
        (raw_pod("Running", exit_code=2, status={"containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 2}}},
            {"name": "sidecar", "state": {"running": {}}}]}),
         dict(exit_code=2, failed=True, running=False, finished=False, others_running=True)),
        (raw_pod("Failed", status={"reason": "Evicted", "containerStatuses": []}),
         dict(exit_code=None, failed=True, reason="Evicted")),
        (raw_pod("Failed", status={"containerStatuses": [], "initContainerStatuses": [
            {"name": "ddpjob-wait-for-master", "state": {"terminated": {"exitCode": 1}}}]}),
         dict(failed=True, reason="init container ddpjob-wait-for-master exited with code 1")),
        (raw_pod("Failed", status={"containerStatuses": [], "initContainerStatuses": [
            {"name": "ddpjob-wait-for-master", "state": {"terminated": {"exitCode": 128, "reason": "StartError",
             "message": "failed to start containerd task \"b0bc\": context canceled: unknown"}}}]}),
         dict(failed=True, reason="init container ddpjob-wait-for-master exited with code 128 (StartError: "
                                  "failed to start containerd task \"b0bc\": context canceled: unknown)")),
        (raw_pod("Failed", status={"containerStatuses": [], "initContainerStatuses": [
            {"name": "ddpjob-wait-for-master", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
         dict(failed=True, reason="init container ddpjob-wait-for-master exited with code 1")),
        (raw_pod(metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}), dict(terminating=True, running=False)),
        ({"metadata": {"name": "bare"}}, dict(phase="Pending", rank=None, attempt=None, failed=False)),
    ],
)  # fmt: skip
def test_a_pod_reads_as_the_facts_the_rules_need(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    view = pod_view(raw, trainer="trainer")
    for key, value in expected.items():
        assert getattr(view, key) == value, key


def test_a_pod_view_reads_its_labels_and_spec_hash() -> None:
    view = pod_view(raw_pod(), trainer="trainer")
    assert (view.name, view.rank, view.attempt, view.spec_hash) == ("j-1", 1, 2, "h")


def test_only_the_trainer_container_exit_code_counts() -> None:
    raw = raw_pod()
    raw["status"]["containerStatuses"].append({"name": "sidecar", "state": {"terminated": {"exitCode": 1}}})
    assert pod_view(raw, trainer="trainer").exit_code is None


def test_pods_of_other_attempts_and_out_of_range_ranks_are_stale() -> None:
    j = job(replicas=2)
    views = [*pods(j, attempt=1), pod(j, 0, attempt=0), pod(j, 5, attempt=1)]
    obs = observe(views, job_name=j.name, attempt=1, replicas=2, spec_hash=j.spec.spec_hash, launched=True)
    assert sorted(obs.current) == [0, 1]
    assert sorted((p.rank, p.attempt) for p in obs.stale) == [(0, 0), (5, 1)]
    assert obs.missing == () and obs.failures == ()


@pytest.mark.parametrize(
    ("launched", "failures"),
    [(False, []), (True, [("rank 1 (pod train-1) was deleted", None)])],
)
def test_a_missing_rank_is_a_failure_only_once_the_attempt_was_launched(
    launched: bool, failures: list[tuple[str, int | None]]
) -> None:
    j = job(replicas=2)
    obs = observe([pod(j, 0)], job_name=j.name, attempt=0, replicas=2, spec_hash=j.spec.spec_hash, launched=launched)
    assert obs.missing == (1,)
    assert [(f.describe(), f.exit_code) for f in obs.failures] == failures


def test_counts_follow_the_pods_of_the_current_attempt() -> None:
    j = job(replicas=4)
    views = [
        pod(j, 0, phase="Running"),
        pod(j, 1, phase="Succeeded", exit_code=0),
        pod(j, 2, phase="Failed", exit_code=200),
        pod(j, 3, phase="Pending"),
        pod(j, 0, attempt=7, phase="Running"),
    ]
    obs = observe(views, job_name=j.name, attempt=0, replicas=4, spec_hash=j.spec.spec_hash, launched=True)
    assert (obs.active, obs.running, obs.succeeded, obs.failed) == (2, 1, 1, 1)
    assert [f.describe() for f in obs.failures] == ["rank 2 (pod train-2) exited with code 200"]


def test_a_pod_built_from_another_spec_marks_the_attempt_outdated() -> None:
    j = job()
    views = [pod(j, 0), pod(j, 1, spec_hash="older")]
    assert observe(views, job_name=j.name, attempt=0, replicas=2, spec_hash=j.spec.spec_hash, launched=True).outdated


def test_the_status_survives_a_round_trip_through_the_api() -> None:
    status = JobStatus(
        phase=Phase.RESTARTING, attempt=3, restarts=2, launched_attempt=2, start_time=NOW, active=1, succeeded=0,
        failed=1, running=1, replicas=2, observed_generation=4,
    ).with_condition("Restarting", True, "RetryableFailure", "rank 1 ...", NOW)  # fmt: skip
    assert parse_status(status.to_dict()) == status


@pytest.mark.parametrize("raw", [None, {}, {"phase": "Bogus", "attempt": -3, "replicas": "x", "conditions": [1]}])
def test_a_missing_or_garbled_status_reads_as_new(raw: dict[str, Any] | None) -> None:
    status = parse_status(raw)
    assert (status.phase, status.attempt, status.restarts, status.launched_attempt) == (Phase.NEW, 0, 0, -1)


def test_a_condition_keeps_its_transition_time_until_its_status_flips() -> None:
    later = datetime(2026, 1, 1, 13, 0, 0, tzinfo=UTC)
    s = JobStatus().with_condition("Running", True, "AllRanksRunning", "a", NOW)
    s = s.with_condition("Running", True, "AllRanksRunning", "b", later)
    running = s.condition("Running")
    assert running is not None and running.last_transition_time == NOW and running.message == "b"
    s = s.with_condition("Running", False, "Restarting", "c", later)
    running = s.condition("Running")
    assert running is not None and running.last_transition_time == later


def test_pod_view_defaults_describe_a_pending_pod() -> None:
    assert PodView(name="x").phase == "Pending"


def test_a_pods_scheduling_refusal_and_its_disruption_target_are_read_from_its_conditions() -> None:
    from ddpjob_operator.status import Disruption, pod_view

    raw = {
        "metadata": {"name": "train-1", "labels": {"ddpjob.dev/rank": "1", "ddpjob.dev/attempt": "0"},
                     "deletionTimestamp": "2026-11-23T00:00:00Z"},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available:\n 1 Insufficient example.com/slot."},
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "preempted by pod group t/high-attempt-0"},
        ]},
    }  # fmt: skip
    view = pod_view(raw, "trainer")
    assert view.unschedulable == "0/1 nodes are available: | 1 Insufficient example.com/slot."
    assert view.disruption == Disruption("PreemptionByScheduler", "preempted by pod group t/high-attempt-0")
    assert view.disruption.preempted
    assert pod_view({"metadata": {"name": "x"}, "status": {}}, "trainer").disruption is None
