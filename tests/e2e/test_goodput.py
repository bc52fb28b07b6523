"""Goodput in the box: a stop saves at the step it stopped at, and the run resumes from there."""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import pytest
from kubernetes import client

from ddpjob_box.kubenode.node import KubeletNode
from tests.e2e.conftest import OperatorProcess
from tests.e2e.jobs import cpu_job
from tests.e2e.kube import GROUP, PLURAL, VERSION, Jobs, rank_metric, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def jobs(api_client: Any, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(api_client, namespace)


def _claim(jobs: Jobs, name: str) -> None:
    """A checkpoint volume both ranks share."""
    jobs.core.create_namespaced_persistent_volume_claim(
        jobs.ns,
        {"metadata": {"name": name},
         "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}},
    )  # fmt: skip


def _resumed_line(jobs: Jobs, pod: str) -> str | None:
    log = jobs.log(pod)
    return log if "resumed from step" in log else None


def _past_a_checkpoint(jobs: Jobs, name: str) -> dict[int, Any]:
    """A 2-rank job that checkpoints every 20 steps, running, once rank 1 is past its first checkpoint: its pods."""
    _claim(jobs, f"{name}-ckpt")
    args = ["--steps", "100000", "--checkpoint-interval", "20", "--slow-rank", "0", "--slow-seconds", "0.05"]
    jobs.create(cpu_job(name, args=args, checkpoint={"claimName": f"{name}-ckpt"}))
    jobs.wait_running(name, 180)
    pods = {r: jobs.pod(f"{name}-{r}") for r in range(2)}
    wait_for("rank 1 past a checkpoint", lambda: rank_metric(pods[1].status.pod_ip, "ddp_step") >= 25, 300, interval=1)
    return pods


def _suspend(jobs: Jobs, name: str, suspend: bool) -> None:
    jobs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, jobs.ns, PLURAL, name, {"spec": {"runPolicy": {"suspend": suspend}}}
    )


def test_a_suspended_job_saves_the_step_it_stopped_at_and_resumes_from_it(jobs: Jobs, node: KubeletNode) -> None:
    # --checkpoint-interval 0 saves only at the end of the run, which this one never reaches: any checkpoint
    # on the volume is the stop's own.
    _claim(jobs, "ckpt")
    args = ["--steps", "100000", "--checkpoint-interval", "0", "--slow-rank", "0", "--slow-seconds", "0.05"]
    jobs.create(cpu_job("stop", args=args, checkpoint={"claimName": "ckpt"}))
    jobs.wait_running("stop", 180)
    rank0 = jobs.pod("stop-0")
    trainer = rank0.spec.containers[0]
    assert rank0.spec.termination_grace_period_seconds == 30, "no save measured yet: Kubernetes's default"
    assert {e.name: e.value for e in trainer.env}["TERMINATION_GRACE_SECONDS"] == "30"
    reached = wait_for(
        "rank 0 past step 10",
        lambda: (s := int(rank_metric(rank0.status.pod_ip, "ddp_step"))) >= 10 and s,
        300,
        interval=1,
    )

    _suspend(jobs, "stop", True)
    jobs.wait_phase("stop", "Suspended", 120)
    wait_for("the ranks to be gone", lambda: not jobs.core.list_namespaced_pod(jobs.ns).items, 120, interval=1)
    # The ranks exit right after the save, before a poll of their metrics sees it: the status names it from their
    # deleted pods' exit messages, while the job is still suspended.
    suspended = wait_for("status.lastCheckpoint while suspended", lambda: jobs.status("stop").get("lastCheckpoint"), 30)
    assert suspended["step"] >= reached and suspended.get("time"), suspended
    _suspend(jobs, "stop", False)

    def resumed_log() -> str | None:
        try:
            log = str(jobs.core.read_namespaced_pod_log("stop-0", jobs.ns, container="trainer"))
        except client.ApiException:
            return None  # not made yet, or its container not started
        return log if "resumed from step" in log or "training tinycnn" in log else None

    log = wait_for("the resumed rank 0 to load its checkpoint", resumed_log, 300, interval=1)
    found = re.search(r"resumed from step (\d+) ", log)
    assert found, f"the resumed run started from scratch: the stop saved nothing\n{log[:2000]}"
    stopped_at = int(found.group(1))
    assert stopped_at == suspended["step"], (stopped_at, suspended)

    def reported() -> dict[str, Any] | None:
        saved = jobs.status("stop").get("lastCheckpoint")
        return saved if saved and saved.get("step") == stopped_at else None

    saved = wait_for("status.lastCheckpoint to name the stop's checkpoint", reported, 120, interval=1)
    assert saved.get("time"), saved


def test_a_killed_rank_restarts_the_gang_in_place_keeping_its_pods_and_counting_one_restart(
    jobs: Jobs, node: KubeletNode
) -> None:
    before = _past_a_checkpoint(jobs, "inplace")
    rules = before[0].spec.containers[0].restart_policy_rules
    assert rules and rules[0].action == "RestartAllContainers", "1.37 keeps the rule: in place is on"
    os.kill(jobs.pid(node, "inplace-1"), signal.SIGKILL)

    def next_attempt_running() -> dict[str, Any] | None:
        status = jobs.status("inplace")
        return status if status.get("attempt") == 1 and status.get("phase") == "Running" else None

    status = wait_for("attempt 1 running", next_attempt_running, 180, interval=1)
    assert status["restarts"] == 1, status
    after = {r: jobs.pod(f"inplace-{r}") for r in range(2)}
    assert {r: p.metadata.uid for r, p in after.items()} == {r: p.metadata.uid for r, p in before.items()}, (
        "the same pods, restarted in place"
    )
    assert all(p.metadata.labels["ddpjob.dev/attempt"] == "1" for p in after.values())
    assert all(p.status.pod_ip == before[r].status.pod_ip for r, p in after.items())
    # The new process of rank 0 loaded a checkpoint: it says so in its log and on its metrics. The metric is the
    # newest checkpoint saved or resumed from, so by the time it is read it may already name a newer save.
    log = wait_for("rank 0's log to say it resumed", lambda: _resumed_line(jobs, "inplace-0"), 60, interval=1)
    resumed = re.search(r"resumed from step (\d+) ", log)
    assert resumed and int(resumed.group(1)) >= 20, log  # rank 1 was past step 25, the interval is 20
    step = int(resumed.group(1))
    wait_for(
        f"rank 0's metrics to report a checkpoint at step {step} or newer",
        lambda: rank_metric(after[0].status.pod_ip, "ddp_last_checkpoint_step") >= step,
        60,
        interval=1,
    )
    restarting = jobs.condition("inplace", "Restarting")
    assert restarting and restarting["reason"] == "Recovered", restarting


def test_a_killed_training_process_is_restarted_in_its_pods_processes_counting_one_restart(
    jobs: Jobs, node: KubeletNode
) -> None:
    # A crash or a kill ends the training process, not the container: each rank's supervisor restarts the gang's
    # processes, and neither the kubelet nor the operator restarts anything.
    before = _past_a_checkpoint(jobs, "inproc")
    env = {e.name: e.value for e in before[1].spec.containers[0].env}
    assert int(env["MAX_RESTARTS"]) >= 1, env
    training = jobs.training_pid(node, "inproc-1")
    assert training != jobs.pid(node, "inproc-1"), "a supervisor runs the training process"
    os.kill(training, signal.SIGKILL)

    def counted() -> dict[str, Any] | None:
        status = jobs.status("inproc")
        return status if status.get("restarts") == 1 else None

    status = wait_for("the restart counted", counted, 120, interval=1)
    assert (status["attempt"], status["phase"]) == (0, "Running"), status
    assert status["progress"]["restartsInPlace"] == 1, status
    for rank in range(2):
        ip = before[rank].status.pod_ip
        wait_for(f"rank {rank}'s new process training", lambda ip=ip: rank_metric(ip, "ddp_steps_total") >= 1
                 and rank_metric(ip, "ddp_restart_count") == 1, 120, interval=1)  # fmt: skip
    after = {r: jobs.pod(f"inproc-{r}") for r in range(2)}
    assert {r: p.metadata.uid for r, p in after.items()} == {r: p.metadata.uid for r, p in before.items()}
    assert all(p.metadata.labels["ddpjob.dev/attempt"] == "0" for p in after.values())
    assert all(s.restart_count == 0 for p in after.values() for s in p.status.container_statuses), "no kubelet restart"
    said = [e.message for e in jobs.wait_events("inproc", "RetryableFailure")]
    assert len(said) == 1 and said[0].startswith(
        "rank 1's training process was killed by SIGKILL; the ranks' supervisors restarted the gang's processes in "
        "place (restart 1 of "
    ), said
    assert "restarting the gang in place (1 of" in jobs.log("inproc-0")
    assert re.search(r"resumed from step (\d+)", jobs.log("inproc-0")), "from the checkpoint"
