"""The whole lifecycle as data: plans from (job, remembered status, pods), executed by a fake cluster."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ddpjob_contract import exits
from ddpjob_contract.status import ConditionType, Phase
from ddpjob_operator.actions import RESYNC_SECONDS, Plan
from ddpjob_operator.api import Job
from ddpjob_operator.lifecycle import plan, plan_invalid
from ddpjob_operator.progress import REFUSED, WINDOW_SECONDS, Checkpoint, RankSample, Scrape
from ddpjob_operator.status import Disruption, JobStatus, PodView, pod_view
from ddpjob_operator.times import from_time

from .factories import job, pod

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class FakeCluster:
    """Executes plans the way the controller does, against a dict of pods; polls like the poller."""

    def __init__(self, j: Job) -> None:
        self.job = j
        self.status = JobStatus()
        self.pods: dict[str, PodView] = {}
        self.events: list[str] = []
        self.event_messages: list[str] = []
        self.now = T0
        self.deleted_job = False
        self.metrics: dict[int, RankSample] = {}
        self.gone: list[int] = []
        """Ranks whose program has exited though kubelet has not said so yet: their polls are refused."""
        """What each rank's /metrics says; a rank missing here does not answer."""
        self.scrapes: list[Scrape] = []
        self.last: Plan | None = None

    def step(self, **changes: Any) -> Plan:
        if changes:
            self.job = replace(self.job, spec=replace(self.job.spec, **changes))
        p = plan(self.job, self.status, list(self.pods.values()), self.now, self.scrapes)
        self.last = p
        self.event_messages += [e.message for e in p.events]
        self.status = p.status
        self.events += [e.reason for e in p.events]
        for gone in p.delete_pods:
            # pods without a node go at once; keep it simple and remove them
            self.pods.pop(gone.name, None)
        for rank in p.create_ranks:
            name = f"{self.job.name}-{rank}"
            assert name not in self.pods, "never create over an existing pod"
            self.pods[name] = pod(self.job, rank, p.status.attempt, ip=f"10.0.0.{rank}", node="node-a")
        self.deleted_job = self.deleted_job or p.delete_job
        return p

    def settle(self) -> Plan:
        """Step until nothing more changes (pods created, launched...)."""
        for _ in range(5):
            before = (self.status, dict(self.pods))
            p = self.step()
            if (self.status, dict(self.pods)) == before:
                return p
        raise AssertionError("did not settle")

    def set(self, rank: int, **facts: Any) -> None:
        name = f"{self.job.name}-{rank}"
        self.pods[name] = replace(self.pods[name], **facts)

    def set_all(self, **facts: Any) -> None:
        for rank in range(self.job.spec.replicas):
            self.set(rank, **facts)

    def poll(self) -> Plan:
        """Scrape the targets the last plan named, as the poller does, then reconcile."""
        assert self.last is not None
        targets = self.last.poll
        answered = {t.rank: self.metrics[t.rank] for t in targets if t.rank in self.metrics}
        errors = {t.rank: REFUSED if t.rank in self.gone else "no answer within 2s"
                  for t in targets if t.rank not in self.metrics}  # fmt: skip
        self.scrapes.append(Scrape(at=self.now, attempt=self.status.attempt, targets=targets, ranks=answered,
                                   errors=errors))  # fmt: skip
        # as the poller, which keeps one window of scrapes
        self.scrapes = [s for s in self.scrapes if (self.now - s.at).total_seconds() <= WINDOW_SECONDS]
        return self.step()

    def join(self, *ranks: int) -> None:
        """These ranks report their process group ready."""
        for rank in ranks:
            self.metrics[rank] = RankSample(ready=True)

    def attempts(self) -> set[int | None]:
        return {p.attempt for p in self.pods.values()}

    def condition(self, type_: str) -> tuple[bool, str, str]:
        c = self.status.condition(type_)
        assert c is not None, type_
        return c.status, c.reason, c.message


def running(replicas: int = 2, **spec: Any) -> FakeCluster:
    c = FakeCluster(job(replicas=replicas, **spec))
    c.settle()
    c.set_all(phase="Running")
    c.settle()
    c.join(*range(replicas))
    c.poll()
    c.settle()
    assert c.status.phase is Phase.RUNNING
    return c


def restarted_and_running(c: FakeCluster) -> None:
    """Bring the next attempt's pods up and let every rank join."""
    c.settle()
    c.set_all(phase="Running")
    c.settle()
    c.poll()
    c.settle()


def test_a_new_job_is_pending_and_gets_a_service_and_one_pod_per_rank() -> None:
    c = FakeCluster(job(replicas=3))
    p = c.step()
    assert p.create_service and p.create_ranks == (0, 1, 2)
    assert c.status.phase is Phase.PENDING and c.status.start_time == T0
    assert c.condition("Created")[:2] == (True, "Created")
    assert c.events == ["Created"]
    p = c.step()
    assert c.status.launched_attempt == 0
    assert c.events == ["Created"], "attempt 0's launch is told by Created: one Event, one request, fewer per job"
    assert not p.create_service, "the Service comes with each attempt's pods, not with every reconcile"


def test_the_job_runs_once_every_rank_has_joined_the_process_group_not_merely_once_its_pods_run() -> None:
    c = FakeCluster(job(replicas=2))
    c.settle()
    c.set(0, phase="Running")
    c.settle()
    assert c.status.phase is Phase.PENDING
    c.set(1, phase="Running")
    c.settle()
    assert c.status.phase is Phase.RENDEZVOUS, "pods run, but no rank has said it joined"
    assert c.condition("Running") == (False, "Rendezvous", "0 of 2 ranks joined the process group")
    c.join(0)
    c.poll()
    assert c.status.phase is Phase.RENDEZVOUS
    assert c.condition("Running")[2] == "1 of 2 ranks joined the process group"
    c.join(1)
    c.poll()
    assert c.status.phase is Phase.RUNNING
    assert c.condition("Running")[:2] == (True, "AllRanksRunning")
    assert (c.status.running, c.status.active, c.status.replicas) == (2, 2, 2)
    assert "AllRanksRunning" in c.events


def test_the_poll_targets_are_every_process_of_every_running_pod_of_the_attempt() -> None:
    c = FakeCluster(job(replicas=2, nprocPerNode=2, metricsPort=9400))
    c.settle()
    c.set(1, phase="Running")
    p = c.settle()
    assert [(t.rank, t.pod, t.url) for t in p.poll] == [
        (2, "train-1", "http://10.0.0.1:9400/metrics"),
        (3, "train-1", "http://10.0.0.1:9401/metrics"),
    ]
    c.set(0, phase="Running")
    assert [t.rank for t in c.settle().poll] == [0, 1, 2, 3]


def test_a_rank_that_already_exited_zero_counts_as_joined() -> None:
    c = FakeCluster(job(replicas=2))
    c.settle()
    c.set(0, phase="Running")
    c.set(1, phase="Succeeded", exit_code=0)
    c.settle()
    c.join(0)
    c.poll()
    assert c.status.phase is Phase.RUNNING


def test_a_running_job_stays_running_while_a_pod_is_unknown() -> None:
    c = running(2)
    c.set(1, phase="Unknown")  # its node stopped reporting: not a failure yet
    c.settle()
    assert c.status.phase is Phase.RUNNING and c.status.running == 1 and c.status.restarts == 0


def test_the_job_succeeds_once_every_rank_exits_zero() -> None:
    c = running(2)
    c.set(0, phase="Succeeded", exit_code=0)
    c.settle()
    assert c.status.phase is Phase.RUNNING and c.status.succeeded == 1
    c.set(1, phase="Succeeded", exit_code=0)
    p = c.settle()
    assert c.status.phase is Phase.SUCCEEDED and c.status.completion_time == T0
    assert c.condition("Succeeded")[:2] == (True, "AllRanksSucceeded")
    assert c.condition("Running")[0] is False
    assert p.requeue_after is None, "nothing left to do: no TTL"
    assert len(c.pods) == 2, "finished pods are kept for their logs (cleanPodPolicy Running)"


def test_a_retryable_failure_restarts_the_whole_gang_as_the_next_attempt() -> None:
    c = running(3)
    c.set(1, phase="Failed", exit_code=200)
    p = c.step()
    assert c.status.phase is Phase.RESTARTING
    assert (c.status.attempt, c.status.restarts) == (1, 1)
    assert sorted(x.name for x in p.delete_pods) == ["train-0", "train-1", "train-2"], "the whole gang"
    assert p.create_ranks == (), "old pods first"
    status, reason, message = c.condition("Restarting")
    assert (status, reason) == (True, "RetryableFailure")
    assert "rank 1 (pod train-1) exited with code 200" in message
    p = c.step()
    assert p.create_ranks == (0, 1, 2) and c.attempts() == {1}
    c.settle()
    assert c.status.phase is Phase.PENDING
    restarted_and_running(c)
    assert c.status.phase is Phase.RUNNING
    assert c.condition("Restarting")[:2] == (False, "Recovered")


def test_no_pod_of_the_next_attempt_is_created_while_an_old_one_is_terminating() -> None:
    c = running(2)
    c.set(0, phase="Failed", exit_code=143)
    c.pods["train-1"] = replace(c.pods["train-1"], terminating=True)
    p = plan(c.job, c.status, list(c.pods.values()), T0)
    assert p.status.phase is Phase.RESTARTING
    assert [x.name for x in p.delete_pods] == ["train-0"], "train-1 is already going"
    assert p.create_ranks == ()


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        ({"delete": True}, "rank 1 (pod train-1) was deleted"),
        ({"terminating": True}, "rank 1 (pod train-1) was deleted or evicted"),
        ({"phase": "Failed", "reason": "Evicted"}, "rank 1 (pod train-1) failed: Evicted"),
    ],
)
def test_deleting_or_evicting_a_pod_is_a_retryable_failure(change: dict[str, Any], cause: str) -> None:
    c = running(2)
    if change.pop("delete", False):
        del c.pods["train-1"]
    else:
        c.set(1, **change)
    c.step()
    assert c.status.phase is Phase.RESTARTING and c.status.restarts == 1
    assert cause in c.condition("Restarting")[2]


PREEMPTED = Disruption("PreemptionByScheduler", "preempted by a higher-priority pod group")


@pytest.mark.parametrize("policy", ["ExitCode", "Never"])
def test_a_preempted_gang_restarts_without_using_up_backoff_limit_whatever_the_restart_policy(policy: str) -> None:
    c = running(3, runPolicy={"backoffLimit": 0, "restartPolicy": policy})
    c.set_all(terminating=True, disruption=PREEMPTED)
    c.step()
    assert c.status.phase is Phase.RESTARTING and (c.status.attempt, c.status.restarts) == (1, 0)
    status, reason, message = c.condition("Restarting")
    assert (status, reason) == (True, "Preempted")
    assert "rank 0 (pod train-0) was preempted: preempted by a higher-priority pod group" in message
    assert "not counted" in message
    c.pods.clear()  # the scheduler's deletions complete
    restarted_and_running(c)
    assert c.status.phase is Phase.RUNNING and c.status.restarts == 0


def test_a_drained_rank_is_a_disruption_and_its_peers_exits_do_not_count_either() -> None:
    c = running(2, runPolicy={"backoffLimit": 0})
    c.set(0, phase="Failed", exit_code=143, disruption=Disruption("EvictionByEvictionAPI", "Eviction API: evicting"))
    c.set(1, phase="Failed", exit_code=200)
    c.step()
    assert c.status.phase is Phase.RESTARTING and c.status.restarts == 0
    assert c.condition("Restarting")[1] == "Disrupted"


def test_a_bug_beside_a_preemption_still_fails_the_job() -> None:
    c = running(2)
    c.set(0, terminating=True, disruption=PREEMPTED)
    c.set(1, phase="Failed", exit_code=1)
    c.step()
    assert c.status.phase is Phase.FAILED and c.condition("Failed")[1] == "NonRetryableFailure"


def test_pods_the_scheduler_cannot_place_one_by_one_say_how_many_are_placed_and_why_once() -> None:
    c = FakeCluster(job(replicas=3))
    c.settle()
    c.set(0, node="node-a")
    c.set(1, node="node-a")
    c.set(2, node="", unschedulable="0/1 nodes are available: 1 Insufficient example.com/slot.")
    p = c.step()
    status, reason, message = c.condition("Running")
    assert c.status.phase is Phase.PENDING and (status, reason) == (False, "Unschedulable")
    assert message.startswith("2 of 3 pods are placed") and "rank 2 (pod train-2)" in message
    assert "Insufficient example.com/slot" in message
    assert [e.reason for e in p.events] == ["Unschedulable"]
    assert c.step().events == (), "said once"
    c.set(2, node="node-a", unschedulable="")
    c.step()
    assert c.condition("Running")[1] == "PodsPending", "placed: no longer said to be unschedulable"


def test_a_gang_the_scheduler_cannot_place_says_it_is_placed_all_or_nothing() -> None:
    c = FakeCluster(job(replicas=6))
    c.status = plan(c.job, c.status, [], T0, pod_groups=True).status
    p = plan(c.job, c.status, [], T0, pod_groups=True)
    assert p.gang and p.create_pod_group and p.create_ranks == tuple(range(6))
    views = [pod(c.job, r, 0, node="", unschedulable="0/1 nodes are available: 1 Insufficient example.com/slot.")
             for r in range(6)]  # fmt: skip
    status = plan(c.job, p.status, views, T0, pod_groups=True).status
    status = plan(c.job, status, views, T0, pod_groups=True).status
    running_ = status.condition("Running")
    assert running_ is not None and running_.reason == "Unschedulable" and status.phase is Phase.PENDING
    assert running_.message.startswith("the gang of 6 pods is placed all or nothing, and the scheduler cannot")
    assert "Insufficient example.com/slot" in running_.message


def test_a_gang_keeps_the_schedulers_words_while_its_pods_carry_only_the_gangs_count() -> None:
    c = FakeCluster(job(replicas=2))
    status = plan(c.job, c.status, [], T0, pod_groups=True).status
    # its pods made: launched first, then the scheduler's words are said
    status = plan(c.job, status, [pod(c.job, r, 0, node="") for r in range(2)], T0, pod_groups=True).status
    assert status.launched_attempt == 0
    count = "minCount (2) cannot be satisfied: 0 scheduled, 1 remaining"
    words = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."

    def said(*unschedulable: str) -> str:
        nonlocal status
        views = [pod(c.job, r, 0, node="", unschedulable=u) for r, u in enumerate(unschedulable)]
        status = plan(c.job, status, views, T0, pod_groups=True).status
        running_ = status.condition("Running")
        assert running_ is not None and running_.reason == "Unschedulable"
        return running_.message

    assert said(count, count).endswith(count), "nothing better said yet"
    assert said(words, count).endswith(words)
    assert said(count, count).endswith(words), "the count alone does not replace the words"
    other = "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims."
    assert said(count, other).endswith(other), "new words do"


def test_pods_unschedulable_when_first_seen_are_launched_at_once_and_said_next() -> None:
    # A cluster with no node: no later event may come, so the launch cannot wait for one.
    c = FakeCluster(job(replicas=2))
    status = plan(c.job, c.status, [], T0).status
    stuck = [pod(c.job, r, 0, node="", unschedulable="no nodes available to schedule pods") for r in range(2)]
    launched = plan(c.job, status, stuck, T0).status
    assert launched.launched_attempt == 0
    said = plan(c.job, launched, stuck, T0).status.condition("Running")
    assert said is not None and said.reason == "Unschedulable"


def test_after_backoff_limit_restarts_the_job_fails_and_nothing_keeps_running() -> None:
    c = running(2, runPolicy={"backoffLimit": 1})
    c.set(1, phase="Failed", exit_code=200)
    restarted_and_running(c)
    c.set(0, phase="Failed", exit_code=200)
    c.settle()
    assert c.status.phase is Phase.FAILED and c.status.restarts == 1
    status, reason, message = c.condition("Failed")
    assert (status, reason) == (True, "BackoffLimitExceeded")
    assert "rank 0 (pod train-0) exited with code 200" in message
    assert [p.name for p in c.pods.values()] == ["train-0"], "the running rank was deleted; the failed one kept"


def test_a_non_retryable_exit_fails_the_job_at_once_naming_rank_pod_and_code() -> None:
    c = running(4)
    c.set(2, phase="Failed", exit_code=2)
    c.step()
    assert c.status.phase is Phase.FAILED and c.status.restarts == 0
    status, reason, message = c.condition("Failed")
    assert (status, reason) == (True, "NonRetryableFailure")
    assert "rank 2 (pod train-2) exited with code 2" in message
    assert sorted(c.pods) == ["train-2"]


def test_the_deadline_fails_the_job_and_deletes_its_pods_whatever_the_clean_policy() -> None:
    c = running(2, runPolicy={"activeDeadlineSeconds": 60, "cleanPodPolicy": "None"})
    c.now = T0 + timedelta(seconds=30)
    assert c.step().requeue_after == 30.0, "wake up when the deadline passes"
    c.now = T0 + timedelta(seconds=60)
    c.step()
    assert c.status.phase is Phase.FAILED
    assert c.condition("Failed")[:2] == (True, "DeadlineExceeded")
    assert c.pods == {}


def suspended(c: FakeCluster, value: bool) -> None:
    c.job = replace(c.job, spec=replace(c.job.spec, run_policy=replace(c.job.spec.run_policy, suspend=value)))


def test_suspending_deletes_the_pods_and_resuming_starts_a_new_attempt() -> None:
    c = running(2)
    suspended(c, True)
    c.settle()
    assert c.status.phase is Phase.SUSPENDED and c.pods == {}
    assert c.status.start_time is None, "the deadline clock stops"
    assert c.condition("Suspended")[:2] == (True, "Suspended")
    suspended(c, False)
    c.now = T0 + timedelta(seconds=5)
    c.settle()
    assert c.status.phase is Phase.PENDING and c.status.attempt == 1 and c.status.restarts == 0
    assert c.attempts() == {1} and len(c.pods) == 2
    assert c.status.start_time == c.now
    assert c.condition("Suspended")[:2] == (False, "Resumed")


def test_a_suspended_gangs_stop_checkpoint_is_named_from_its_deleted_pods_last_words() -> None:
    """The ranks save, exit 143 and are deleted before a poll can see the save: the deleted pod's final state
    (``podcache.PodIndex.stopped``) names it, and the last measured save time stays for the next grace period."""
    c = running(2)
    c.status = replace(c.status, last_checkpoint=Checkpoint(step=40, save_seconds=0.8))
    suspended(c, True)
    c.settle()
    assert c.status.phase is Phase.SUSPENDED and c.status.last_checkpoint == Checkpoint(step=40, save_seconds=0.8)
    last_words = replace(
        pod(c.job, 1, 0),
        exit_code=143,
        message=exits.stopped_message(57, ""),
        finished_at="2026-01-01T00:00:09Z",
    )
    p = plan(c.job, c.status, [], c.now, stopped=[last_words])
    assert p.status.last_checkpoint == Checkpoint(step=57, time=T0 + timedelta(seconds=9), save_seconds=0.8)
    older = replace(last_words, message=exits.stopped_message(30, "SIGTERM"))
    assert plan(c.job, p.status, [], c.now, stopped=[older]).status.last_checkpoint == p.status.last_checkpoint
    failed = replace(last_words, exit_code=137)
    kept = plan(c.job, c.status, [], c.now, stopped=[failed]).status.last_checkpoint
    assert kept == Checkpoint(step=40, save_seconds=0.8), "a rank that did not stop after saving names nothing"


def test_a_job_created_suspended_creates_no_pod() -> None:
    c = FakeCluster(job(runPolicy={"suspend": True}))
    c.settle()
    assert c.status.phase is Phase.SUSPENDED and c.pods == {} and c.status.start_time is None


def test_the_ttl_deletes_the_job_once_due() -> None:
    c = running(1, runPolicy={"ttlSecondsAfterFinished": 30})
    c.set(0, phase="Succeeded", exit_code=0)
    assert c.step().requeue_after == 30.0
    c.now = T0 + timedelta(seconds=30)
    assert c.step().delete_job and "TTLExpired" in c.events


@pytest.mark.parametrize(
    ("policy", "left"),
    [("All", []), ("Running", ["train-0"]), ("None", ["train-0", "train-1"])],
)
def test_clean_pod_policy_is_honoured_when_the_job_fails(policy: str, left: list[str]) -> None:
    c = running(2, runPolicy={"cleanPodPolicy": policy})
    c.set(0, phase="Failed", exit_code=1)
    c.settle()
    assert c.status.phase is Phase.FAILED
    assert sorted(c.pods) == left


def test_a_finished_job_stays_finished() -> None:
    c = running(1)
    c.set(0, phase="Succeeded", exit_code=0)
    c.settle()
    c.set(0, phase="Failed", exit_code=200)
    suspended(c, True)
    c.settle()
    assert c.status.phase is Phase.SUCCEEDED


def test_pods_of_an_older_spec_are_replaced_by_a_new_attempt_without_counting_a_restart() -> None:
    c = running(2)
    c.set(1, spec_hash="older")
    c.settle()
    assert (c.status.attempt, c.status.restarts) == (1, 0)
    assert "SpecChanged" in c.events and c.attempts() == {1}


def test_replaying_a_plan_after_a_crash_counts_the_restart_once() -> None:
    c = running(2)
    c.set(1, phase="Failed", exit_code=200)
    first = plan(c.job, c.status, list(c.pods.values()), T0)
    # the status was written, then the operator died before deleting anything
    again = plan(c.job, first.status, list(c.pods.values()), T0)
    assert (again.status.attempt, again.status.restarts) == (1, 1)
    assert {p.name for p in again.delete_pods} == {"train-0", "train-1"}
    assert again.events == (), "no second event either"


def test_a_crash_between_pod_creations_resumes_with_the_missing_ranks_only() -> None:
    c = FakeCluster(job(replicas=4))
    first = c.step()
    assert first.create_ranks == (0, 1, 2, 3)
    del c.pods["train-2"], c.pods["train-3"]  # the operator died after two creations
    again = c.step()
    assert again.create_ranks == (2, 3)
    assert c.status.restarts == 0 and "RetryableFailure" not in c.events


def test_a_live_job_is_looked_at_again_at_least_every_resync() -> None:
    assert running(1).step().requeue_after == RESYNC_SECONDS


def test_an_invalid_spec_fails_once_with_the_error() -> None:
    p = plan_invalid(JobStatus(), "spec.replicas: required", 3, T0)
    assert p.status.phase is Phase.FAILED and p.status.observed_generation == 3
    assert [e.reason for e in p.events] == ["InvalidSpec"]
    assert plan_invalid(p.status, "spec.replicas: required", 3, T0).events == ()


def test_observed_generation_follows_the_job() -> None:
    c = FakeCluster(replace(job(), generation=7))
    c.step()
    assert c.status.observed_generation == 7


def train(c: FakeCluster, seconds: float, steps: int, work: dict[int, float] | None = None) -> Plan:
    """Let ``seconds`` pass in which every answering rank does ``steps`` steps, then poll."""
    c.now += timedelta(seconds=seconds)
    for rank, old in list(c.metrics.items()):
        w = (work or {}).get(rank, 0.01)
        phases = dict(old.phase_sums)
        phases["forward"] = phases.get("forward", 0.0) + steps * w
        c.metrics[rank] = replace(
            old,
            step=(old.step or 0) + steps,
            steps=old.steps + steps,
            samples=old.samples + 16 * steps,
            step_sum=old.step_sum + steps * 0.35,
            step_count=old.step_count + steps,
            step_buckets=((0.5, old.step_count + steps), (float("inf"), old.step_count + steps)),
            phase_sums=phases,
        )
    return c.poll()


def test_polls_fill_the_progress_in_status() -> None:
    c = running(2)
    train(c, 5, 10)
    train(c, 5, 10)
    progress = c.status.progress
    assert progress is not None
    assert (progress.step, progress.samples_per_second, progress.joined) == (20, 64.0, 2)
    assert progress.step_time_p50 == 0.25 and progress.to_dict()["stepTime"] == "250ms"
    assert progress.last_progress_time == c.now
    assert [(r.rank, r.pod, r.node) for r in progress.ranks] == [(0, "train-0", "node-a"), (1, "train-1", "node-a")]


def test_a_rank_slower_than_factor_times_the_others_for_the_window_is_flagged_and_cleared_when_it_recovers() -> None:
    c = running(2, straggler={"factor": 3, "windowSeconds": 20})
    train(c, 5, 10)
    slow = {1: 0.3}
    train(c, 5, 10, slow)
    assert c.status.condition("StragglerDetected") is None, "not for a moment: for the window"
    train(c, 10, 10, slow)
    assert c.status.condition("StragglerDetected") is None
    train(c, 10, 10, slow)
    status, reason, message = c.condition("StragglerDetected")
    assert (status, reason) == (True, "StragglerDetected")
    assert message.startswith("rank 1 (pod train-1 on node node-a) works 0.3s per step, 30.0x the median")
    assert c.events.count("StragglerDetected") == 1
    assert "train-1 on node node-a" in c.event_messages[-1]
    assert c.status.progress is not None and c.status.progress.slowest_rank == 1
    train(c, 5, 10, slow)
    assert c.events.count("StragglerDetected") == 1, "one event per episode"
    train(c, 5, 10)
    train(c, 10, 10, {0: 0.2, 1: 0.3})  # one poll of a busy peer: back within the factor, not yet for the window
    train(c, 10, 10, slow)
    assert c.condition("StragglerDetected")[0] is True, "a rank back for a poll or two is not recovered"
    train(c, 5, 10)
    train(c, 10, 10)
    assert c.condition("StragglerDetected")[0] is True, "back for 10s of a 20s window"
    train(c, 10, 10)
    status, reason, message = c.condition("StragglerDetected")
    assert (status, reason) == (False, "StragglerRecovered") and message.startswith("rank 1 (pod train-1")
    assert c.events[-1] == "StragglerRecovered"


def test_the_recovered_straggler_is_named_from_the_status_data_not_from_the_flagged_message() -> None:
    c = running(2, straggler={"factor": 3, "windowSeconds": 10})
    train(c, 5, 10)
    train(c, 5, 10, {1: 0.3})
    train(c, 10, 10, {1: 0.3})
    flagged = c.status.condition(ConditionType.STRAGGLER_DETECTED)
    assert flagged is not None and flagged.status
    c.status = replace(c.status, conditions=tuple(replace(x, message="reworded") if x is flagged else x
                                                  for x in c.status.conditions))  # fmt: skip
    train(c, 5, 10)
    train(c, 10, 10)
    status, reason, message = c.condition("StragglerDetected")
    assert (status, reason) == (False, "StragglerRecovered")
    assert message.startswith("rank 1 (pod train-1 on node node-a) recovered: every rank works within 3x")


def test_a_poll_where_the_slow_rank_does_not_answer_neither_flags_nor_clears_it() -> None:
    c = running(2, straggler={"factor": 3, "windowSeconds": 10})
    train(c, 5, 10)
    train(c, 5, 10, {1: 0.3})
    train(c, 10, 10, {1: 0.3})
    assert c.condition("StragglerDetected")[0] is True
    stopped = c.metrics.pop(1)
    train(c, 5, 0)
    assert c.condition("StragglerDetected")[0] is True
    c.metrics[1] = stopped


def test_no_progress_for_the_deadline_restarts_the_gang_with_reason_no_progress() -> None:
    c = running(2, progressDeadlineSeconds=30)
    train(c, 5, 10)
    del c.metrics[1]  # SIGSTOPped: it answers no more, and rank 0 waits for it
    train(c, 20, 0)
    assert c.status.phase is Phase.RUNNING
    p = train(c, 10, 0)
    assert c.status.phase is Phase.RESTARTING and (c.status.attempt, c.status.restarts) == (1, 1)
    status, reason, message = c.condition("Restarting")
    assert (status, reason) == (True, "NoProgress")
    assert "no rank advanced its step for 30s (spec.progressDeadlineSeconds=30); stuck at step 10" in message
    assert "not answering: rank 1 (pod train-1 on node node-a: no answer within 2s)" in message
    assert sorted(x.name for x in p.delete_pods) == ["train-0", "train-1"]
    assert c.events[-1] == "NoProgress"


def test_a_rank_whose_program_is_gone_is_not_hung_and_its_pods_exit_decides() -> None:
    # The chaos soak: ranks finished while kubelet restarted; their polls were refused for 20 s before kubelet
    # reported the exits, and NoProgress restarted a job that had succeeded.
    c = running(2, progressDeadlineSeconds=30)
    train(c, 5, 10)
    del c.metrics[0]
    c.gone.append(0)
    train(c, 40, 0)
    assert c.status.phase is Phase.RUNNING and c.status.restarts == 0
    c.set_all(phase="Succeeded", exit_code=0)
    c.settle()
    assert c.status.phase is Phase.SUCCEEDED and c.status.restarts == 0


def test_a_rank_whose_program_stays_gone_while_its_pod_runs_is_hung_after_one_deadline_more() -> None:
    # A supervisor left waiting on its gang with no program under it: excused for ever, the gang stalled with
    # nothing said (chaos 11:1).
    c = running(2, progressDeadlineSeconds=30)
    train(c, 5, 10)
    del c.metrics[0]
    c.gone.append(0)
    train(c, 40, 0)
    assert c.status.phase is Phase.RUNNING and c.status.restarts == 0
    train(c, 25, 0)
    assert (c.status.phase, c.status.restarts) == (Phase.RESTARTING, 1)
    status, reason, message = c.condition("Restarting")
    assert (status, reason) == (True, "NoProgress")
    assert "for 60s (spec.progressDeadlineSeconds=30, and once more: a rank's program is gone)" in message


def test_a_rank_whose_peer_exited_0_is_finishing_not_hung_and_its_pods_exit_decides() -> None:
    # The chaos soak (runs 1:123, 1:139): rank 0's exit 0 was reported; rank 1 had exited too, but kubelet and
    # the apiserver were restarting, and kubelet had torn its pod down: its polls timed out for 20 s.
    c = running(2, progressDeadlineSeconds=30)
    train(c, 5, 10)
    c.set(0, phase="Succeeded", exit_code=0, finished_at=from_time(c.now))
    del c.metrics[1]
    train(c, 25, 0)
    assert c.status.phase is Phase.RUNNING and c.status.restarts == 0
    assert c.last.requeue_after is not None and c.last.requeue_after <= 5, "woken when the wait for rank 1 is up"
    c.set(1, phase="Succeeded", exit_code=0, finished_at=from_time(c.now))
    c.settle()
    assert c.status.phase is Phase.SUCCEEDED and c.status.restarts == 0
    assert c.condition("Succeeded")[:2] == (True, "AllRanksSucceeded")


@pytest.mark.parametrize("hung", [True, False])
def test_a_rank_stuck_exiting_after_its_peer_exited_0_is_stopped_and_the_job_succeeds_unrestarted(hung: bool) -> None:
    # The chaos soak (run 1:0): rank 0 was SIGSTOPped after the last barrier, which rank 1 passed and exited 0.
    # Training was done; a restart would redo nothing, and a teardown that hangs every time (NCCL's can) would
    # fail the job after backoffLimit restarts.
    c = running(2, progressDeadlineSeconds=30, runPolicy={"cleanPodPolicy": "None"})
    train(c, 5, 10)
    c.set(1, phase="Succeeded", exit_code=0, finished_at=from_time(c.now))
    if hung:
        del c.metrics[0]  # SIGSTOPped: it answers no more
    train(c, 29, 0)
    assert c.status.phase is Phase.RUNNING
    train(c, 2, 0)
    assert c.status.phase is Phase.SUCCEEDED and c.status.restarts == 0
    ok, reason, message = c.condition("Succeeded")
    assert (ok, reason) == (True, "RanksStuckExiting")
    assert message == (
        "rank 1 exited 0, so every rank finished training; not exited 30s after that "
        "(spec.progressDeadlineSeconds=30), so stopped: rank 0 (pod train-0)"
    )
    assert [p.name for p in c.last.delete_pods] == ["train-0"], "stopped whatever cleanPodPolicy says"


def test_a_job_whose_ranks_were_stuck_exiting_shows_the_final_figures_of_those_that_exited() -> None:
    c = running(2, progressDeadlineSeconds=30)
    c.metrics = {0: RankSample(ready=True, step=104.0), 1: RankSample(ready=True, step=104.0)}
    c.poll()
    c.set(1, phase="Succeeded", exit_code=0, finished_at=from_time(c.now), message=summary(120, 860.0, 0.0186))
    del c.metrics[0]
    train(c, 31, 0)
    final = c.status.progress
    assert c.condition("Succeeded")[:2] == (True, "RanksStuckExiting") and final is not None
    assert (final.final, final.step, final.samples_per_second) == (True, 120, 1720.0), "rank 0 trained in lockstep"


def test_without_a_progress_deadline_the_ranks_left_after_an_exit_0_are_waited_for() -> None:
    c = running(2)
    train(c, 5, 10)
    c.set(1, phase="Succeeded", exit_code=0, finished_at=from_time(c.now))
    train(c, 3600, 0)
    assert c.status.phase is Phase.RUNNING and c.last.delete_pods == ()


def test_a_gang_that_goes_quiet_as_a_whole_is_given_a_second_deadline_before_it_restarts() -> None:
    # The chaos soak (run 1:23): both ranks finished while kubelet and the apiserver restarted; kubelet tore
    # their pods down before it could report the exits, and every poll timed out. A rank behind a hung peer
    # still answers, so an all-quiet gang is most likely gone, and its exits decide.
    c = running(2, progressDeadlineSeconds=30)
    train(c, 5, 10)
    c.metrics.clear()
    train(c, 40, 0)
    assert c.status.phase is Phase.RUNNING and c.status.restarts == 0
    c.set_all(phase="Succeeded", exit_code=0, finished_at=from_time(c.now))
    c.settle()
    assert c.condition("Succeeded")[:2] == (True, "AllRanksSucceeded") and c.status.restarts == 0


def test_a_gang_wedged_as_a_whole_restarts_after_the_second_deadline() -> None:
    c = running(2, progressDeadlineSeconds=30)
    train(c, 5, 10)
    c.metrics.clear()  # every process stopped, or stuck holding the GIL: none serves its metrics
    train(c, 50, 0)
    assert c.status.phase is Phase.RUNNING
    train(c, 15, 0)
    assert c.status.phase is Phase.RESTARTING and c.status.restarts == 1
    message = c.condition("Restarting")[2]
    assert message.startswith(
        "no rank advanced its step for 60s (spec.progressDeadlineSeconds=30, twice over: every rank went quiet); "
        "stuck at step 10; not answering: rank 0 (pod train-0"
    ), message


def test_no_progress_counts_against_the_backoff_limit() -> None:
    c = running(2, progressDeadlineSeconds=30, runPolicy={"backoffLimit": 0})
    train(c, 40, 0)
    assert c.status.phase is Phase.FAILED
    assert c.condition("Failed")[:2] == (True, "BackoffLimitExceeded")
    assert "no rank advanced its step for 30s" in c.condition("Failed")[2]


def test_no_progress_is_judged_only_on_polls_not_on_the_clock_alone() -> None:
    c = running(2, progressDeadlineSeconds=30)
    c.now += timedelta(seconds=300)  # the poller saw nothing new: no evidence either way
    c.step()
    assert c.status.phase is Phase.RUNNING


def test_a_job_that_keeps_stepping_is_never_restarted_for_no_progress() -> None:
    c = running(2, progressDeadlineSeconds=30)
    for _ in range(10):
        train(c, 20, 1)
    assert c.status.phase is Phase.RUNNING and c.status.restarts == 0


def test_the_progress_of_a_new_attempt_starts_afresh() -> None:
    c = running(2)
    train(c, 5, 10)
    assert c.status.progress is not None and c.status.progress.step == 10
    c.set(1, phase="Failed", exit_code=200)
    c.join(0, 1)  # new processes: nothing trained yet
    restarted_and_running(c)
    assert c.status.progress is not None and c.status.progress.attempt == 1
    assert (c.status.progress.step, c.status.progress.last_progress_time) == (0, None), "no step of attempt 1 yet"


def test_polls_are_often_enough_for_the_shortest_window_and_fast_while_ranks_join() -> None:
    c = FakeCluster(job(progressDeadlineSeconds=20, straggler={"windowSeconds": 40}))
    c.settle()
    c.set_all(phase="Running")
    assert c.settle().poll_interval == 2.0
    c.join(0, 1)
    c.poll()
    assert c.settle().poll_interval == 5.0
    assert running(2).last is not None and running(2).settle().poll_interval == 15.0


def test_a_finished_or_restarting_job_is_not_polled() -> None:
    c = running(1)
    c.set(0, phase="Succeeded", exit_code=0)
    assert c.settle().poll == ()
    c = running(2)
    c.set(0, phase="Failed", exit_code=200)
    assert c.step().poll == ()


def summary(step: int, rate: float, seconds: float) -> str:
    return f'{{"step":{step},"samples":{step * 16},"step_seconds_mean":{seconds},"samples_per_second":{rate}}}'


def test_a_succeeded_job_shows_the_final_step_and_rate_its_ranks_left_in_their_exit_messages() -> None:
    c = running(2)
    c.metrics = {0: RankSample(ready=True, step=427.0), 1: RankSample(ready=True, step=427.0)}
    c.poll()
    assert c.status.progress is not None and c.status.progress.step == 427  # the last poll before the end
    c.set(0, phase="Succeeded", exit_code=0, message=summary(500, 870.0, 0.0184))
    c.set(1, phase="Succeeded", exit_code=0, message=summary(500, 860.0, 0.0186))
    c.settle()
    final = c.status.progress
    assert c.status.phase is Phase.SUCCEEDED and final is not None
    assert (final.final, final.step, final.samples_per_second, final.step_time_p50) == (True, 500, 1730.0, 0.0185)
    assert final.to_dict()["final"] is True and final.to_dict()["stepTime"] == "18.5ms"


def test_a_succeeded_job_names_the_last_checkpoint_its_ranks_saved_after_the_last_poll() -> None:
    """A job that checkpointed up to step 400 ended showing step 300: the ranks exit right after the last save,
    before a poll sees it. Their exit summaries name it (``exits.SUMMARY_CHECKPOINT_STEP``)."""
    c = running(2)
    c.metrics = {r: RankSample(ready=True, step=350.0, checkpoint_step=300.0) for r in range(2)}
    c.poll()
    assert c.status.last_checkpoint is not None and c.status.last_checkpoint.step == 300
    saved = int((T0 + timedelta(seconds=30)).timestamp())
    last = f',"checkpoint_step":400,"checkpoint_time":{saved},"checkpoint_save_seconds":0.25}}'
    for rank in range(2):
        c.set(rank, phase="Succeeded", exit_code=0, message=summary(400, 870.0, 0.0184)[:-1] + last)
    c.settle()
    assert c.status.phase is Phase.SUCCEEDED
    assert c.status.last_checkpoint == Checkpoint(step=400, time=T0 + timedelta(seconds=30), save_seconds=0.25)


def test_without_an_exit_summary_from_every_rank_the_polled_figures_stay() -> None:
    c = running(2)
    c.set(0, phase="Succeeded", exit_code=0, message=summary(500, 870.0, 0.0184))
    c.set(1, phase="Succeeded", exit_code=0)  # a program that writes no message
    c.settle()
    assert c.status.phase is Phase.SUCCEEDED and c.status.progress is not None
    assert not c.status.progress.final and c.status.progress.step != 500


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (
            {"exit_code": 2, "message": "--model (TRAIN_MODEL): unknown value 'resnet5O'; choose one of resnet50\n"},
            "rank 1 (pod train-1) exited with code 2: --model (TRAIN_MODEL): unknown value 'resnet5O'; choose one "
            "of resnet50: not retryable under restartPolicy ExitCode",
        ),
        (
            {
                "exit_code": 1,
                "message": 'Traceback (most recent call last):\n  File "t.py", line 9, in <module>\n'
                '    main()\n  File "t.py", line 5, in main\n    raise ValueError("no data in /data")\n'
                "ValueError: no data in /data\n",
            },
            'rank 1 (pod train-1) exited with code 1: File "t.py", line 5, in main | raise ValueError("no data in '
            '/data") | ValueError: no data in /data: not retryable',
        ),
    ],
    ids=["trainer-error", "log-tail"],
)
def test_a_failed_rank_says_why_in_the_failed_condition_and_the_event(facts: dict[str, Any], expected: str) -> None:
    c = running(2, runPolicy={"restartPolicy": "ExitCode"})
    c.set(1, phase="Failed", **facts)
    c.step()
    status, reason, message = c.condition("Failed")
    assert (status, reason) == (True, "NonRetryableFailure")
    assert message.startswith(expected)
    assert any(m.startswith(expected) for m in c.event_messages)


def test_an_oom_killed_rank_is_named_as_such_and_restarted_like_any_signal_under_exit_code() -> None:
    c = running(2, runPolicy={"restartPolicy": "ExitCode", "backoffLimit": 3})
    c.set(0, phase="Failed", exit_code=137, exit_reason="OOMKilled")
    c.step()
    assert c.status.phase is Phase.RESTARTING and c.status.restarts == 1
    assert (
        "rank 0 (pod train-0) exited with code 137 (OOMKilled: it went over its memory limit)"
        in (c.condition("Restarting")[2])
    )


WAITING = {
    "ErrImagePull": 'failed to pull and unpack image "localhost/nope:1": not found',
    "CreateContainerConfigError": 'configmap "train-config" not found',
}


@pytest.mark.parametrize("reason", sorted(WAITING))
def test_a_container_that_cannot_start_is_named_with_its_reason_in_status_and_one_event(reason: str) -> None:
    c = FakeCluster(job(replicas=2))
    c.settle()
    c.set(1, blocked=f"container trainer: {reason}: {WAITING[reason]}")
    c.settle()
    c.settle()
    expected = f"rank 1 (pod train-1) cannot start: container trainer: {reason}: {WAITING[reason]}"
    assert c.status.phase is Phase.PENDING
    assert c.condition("Running") == (False, "ContainerCannotStart", expected)
    assert c.events.count("ContainerCannotStart") == 1 and expected in c.event_messages
    c.set(1, blocked="")  # fixed: the image was pushed, the ConfigMap created
    c.settle()
    assert c.condition("Running")[1] == "PodsPending"
    c.set_all(phase="Running")
    c.join(0, 1)
    c.settle()
    c.poll()
    assert c.status.phase is Phase.RUNNING


def test_pod_view_reads_why_a_container_waits_init_containers_first() -> None:
    raw = {
        "metadata": {"name": "train-0"},
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {"name": "wait-for-master", "state": {"waiting": {"reason": "ErrImagePull", "message": "a\nb"}}}
            ],
            "containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": "PodInitializing"}}}],
        },
    }
    assert pod_view(raw, "trainer").blocked == "container wait-for-master: ErrImagePull: a | b"
    raw["status"]["initContainerStatuses"] = []
    assert pod_view(raw, "trainer").blocked == ""  # PodInitializing, ContainerCreating: just slow


def test_a_rank_that_serves_no_metrics_is_said_once_in_plain_words_and_no_longer_polled() -> None:
    c = FakeCluster(job(replicas=2))
    c.settle()
    c.set_all(phase="Running")
    c.settle()
    c.join(0)  # rank 1 runs a program without a metrics server: every poll of it is refused
    for _ in range(30):  # two seconds apart while ranks join
        c.now += timedelta(seconds=2)
        c.poll()
        if c.status.phase is Phase.RUNNING:
            break
    p = c.status.progress
    assert p is not None and p.silent == (1,)
    assert p.note == "rank 1 serves no metrics on port 9090: progress is not shown for it"
    assert c.last is not None and [t.rank for t in c.last.poll] == [0]
    assert all(not r.error for r in p.ranks), "no connection error carried in status"
    assert c.status.phase is Phase.RUNNING, "its running pod is all we can know: it counts as joined"
    assert p.to_dict()["silentRanks"] == [1]


def test_a_rank_that_hangs_for_longer_than_the_poll_window_is_still_named_not_taken_for_silent() -> None:
    # A hung rank answered before; after a minute of no answers it was forgotten and called "serves no metrics",
    # dropped from the polls and from the NoProgress message of a job with a long deadline.
    c = running(2, progressDeadlineSeconds=150)
    train(c, 5, 10)
    del c.metrics[1]
    for _ in range(30):  # 120 s: twice the poll window, within the deadline
        train(c, 4, 0)
    p = c.status.progress
    assert p is not None and p.silent == () and not p.note
    assert c.last is not None and [t.rank for t in c.last.poll] == [0, 1]
    for _ in range(10):
        train(c, 4, 0)
    assert c.status.restarts == 1
    assert "not answering: rank 1 (pod train-1 on node " in c.condition("Restarting")[2]


def test_a_rank_that_is_slow_to_serve_is_not_taken_for_silent() -> None:
    c = FakeCluster(job(replicas=2))
    c.settle()
    c.set_all(phase="Running")
    c.settle()
    c.join(0)
    for _ in range(10):  # 20 s of refusals: a slow start, not a program without metrics
        c.now += timedelta(seconds=2)
        c.poll()
    c.join(1)
    c.now += timedelta(seconds=2)
    c.poll()
    c.settle()
    assert c.status.progress is not None and c.status.progress.silent == ()
    assert c.status.phase is Phase.RUNNING


def test_a_gang_that_does_not_fit_says_how_many_of_its_pods_fit_and_why_no_node_takes_more() -> None:
    from ddpjob_operator.policies.gang import unplaced

    said = [
        "pod group is unschedulable, minCount (6) cannot be satisfied: 4 scheduled, 1 remaining, pod group "
        "preemption: No preemption victims found for incoming preemptor",
        "0/1 nodes are available: 1 Insufficient example.com/slot.",
        "minCount (6) cannot be satisfied: 4 scheduled, 1 remaining",
    ]
    assert unplaced(6, said) == (
        "the gang of 6 pods is placed all or nothing, and only 4 fit now: "
        "0/1 nodes are available: 1 Insufficient example.com/slot."
    )
    assert unplaced(3, ["waiting"]) == (
        "the gang of 3 pods is placed all or nothing, and the scheduler cannot place it yet: waiting"
    )
