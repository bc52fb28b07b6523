"""The whole user path in the box: kubectl apply a DDPJob, the operator makes pods, kubelet runs them
from the trainer image built from the Dockerfile, real DDP training meets over the headless Service's
DNS names (CoreDNS), and Prometheus finds and scrapes every rank through the apiserver."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest
import yaml

from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.prometheus import Prometheus
from tests.conftest import Cluster
from tests.e2e.conftest import REPO, Kubectl, OperatorProcess
from tests.e2e.jobs import cpu_job
from tests.e2e.kube import Jobs, rank_metric, summary_samples_per_second, table, wait_for

pytestmark = pytest.mark.e2e

ETA = re.compile(r"\d+[smhd](\d+[smh])?")
"""The ETA column: 45s, 4m5s, 2h3m, 3d4h."""


def _steps_done(pod: Any) -> float:
    """ddp_steps_total read straight from the rank's metrics endpoint."""
    return rank_metric(pod.status.pod_ip, "ddp_steps_total")


@pytest.fixture
def jobs(api_client: Any, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(api_client, namespace)


def test_a_cpu_job_applied_with_kubectl_succeeds_and_prometheus_sees_every_rank(
    jobs: Jobs, kubectl: Kubectl, namespace: str, node: KubeletNode, prometheus: Prometheus
) -> None:
    manifest = REPO / "manifests" / "cpu-ddp.yaml"
    job = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "DDPJob")
    name = job["metadata"]["name"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    steps = int(args[args.index("--steps") + 1])
    kubectl("apply", "-n", namespace, "-f", str(manifest))

    def trainer_running() -> bool:
        pods = jobs.core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}-0").items
        statuses = (pods[0].status.container_statuses or []) if pods else []  # none until the operator makes it
        return any(s.name == "trainer" and s.state.running for s in statuses)

    wait_for("rank 0's trainer container to run", trainer_running, 300, interval=0.5)
    # The chart's and the manifest's securityContext, as the kubelet enforces it on the trainer image.
    identity = kubectl("exec", "-n", namespace, f"{name}-0", "-c", "trainer", "--", "id").stdout
    assert re.match(r"uid=10001\(\w+\) gid=10001\(", identity), identity  # uid=10001(ddpjob) gid=10001(ddpjob) ...

    def with_eta() -> dict[str, str] | None:
        (row,) = table(kubectl("get", "ddpj", name, "-n", namespace).stdout)
        assert row["PHASE"] not in ("Succeeded", "Failed"), f"{name} ended before kubectl get showed an ETA: {row}"
        return row if row["PROGRESS"] and row["ETA"] else None

    row = wait_for("kubectl get ddpj to show PROGRESS and ETA while the job trains", with_eta, 300, interval=1)
    assert row["PHASE"] == "Running" and 0 <= float(row["PROGRESS"]) <= 100 and ETA.fullmatch(row["ETA"]), row
    status = jobs.wait_phase(name, "Succeeded", 600)
    assert status["replicas"]["succeeded"] == 2 and status["restarts"] == 0
    for rank in range(2):
        pod = jobs.pod(f"{name}-{rank}")
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert (env["WORLD_SIZE"], env["RANK"], env["MASTER_ADDR"]) == ("2", str(rank), f"{name}-0.{name}")
    log = jobs.log(f"{name}-0")
    assert "world size 2, backend gloo" in log
    peer = kubectl("logs", "-n", namespace, f"{name}-1").stdout
    assert f"rank 1: step={steps}/{steps} loss=" in peer, peer[-2000:]
    # The final numbers come from each rank's termination message (kubelet reads the file the trainer
    # wrote), not from the last poll: STEP is the last step, IMG/S the trainer's own summary.
    progress = status["progress"]
    assert progress.get("final") is True and progress["step"] == steps, progress
    measured = summary_samples_per_second(log)  # all ranks together, as rank 0 measured them
    assert abs(progress["samplesPerSecond"] - measured) <= 0.10 * measured, (progress, measured)
    (row,) = table(kubectl("get", "ddpj", name, "-n", namespace).stdout)
    assert row["STEP"] == str(steps) and float(row["PROGRESS"]) == 100 and row["ETA"] == "", row

    def series() -> list[dict[str, Any]] | None:
        found = prometheus.query(f'max_over_time(ddp_steps_total{{namespace="{namespace}", ddpjob="{name}"}}[15m])')
        return found if len(found) == 2 else None

    found = wait_for("one ddp_steps_total series per rank in Prometheus", series, 60, interval=2)
    assert sorted(s["metric"]["rank"] for s in found) == ["0", "1"]
    assert [float(s["value"][1]) for s in found] == [steps, steps]


def test_a_killed_rank_restarts_the_gang_which_resumes_from_the_last_checkpoint(
    jobs: Jobs, namespace: str, node: KubeletNode
) -> None:
    jobs.core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    args = [
        "--steps",
        "150",
        "--checkpoint-interval",
        "20",
        "--slow-rank",
        "0",
        "--slow-seconds",
        "0.05",
        "--pg-timeout-seconds",
        "60",
    ]
    jobs.create(cpu_job("resume", args=args, checkpoint={"claimName": "ckpt"}))
    jobs.wait_phase("resume", "Running", 180)
    first = jobs.pod("resume-1")
    wait_for("rank 1 to pass a checkpoint", lambda: _steps_done(first) >= 45, 300, interval=1)
    os.kill(jobs.pid(node, "resume-1"), signal.SIGKILL)

    def second_attempt() -> Any:
        pod = jobs.find_pod("resume-0")  # absent between the old pod's deletion and the new one's creation
        return pod if pod and pod.metadata.labels["ddpjob.dev/attempt"] == "1" else None

    wait_for("the gang to come back as the next attempt", second_attempt, 180, interval=1)
    status = jobs.wait_phase("resume", "Succeeded", 600)
    assert status["restarts"] == 1
    log = jobs.log("resume-0")
    resumed = re.search(r"resum\w* .*?step[= ](\d+)", log, re.IGNORECASE)
    assert resumed and int(resumed.group(1)) >= 40, f"attempt 2 resumed from a checkpoint, not step 0:\n{log[:2000]}"
    assert "step=150/150" in log


def test_a_rank_over_its_memory_limit_is_oom_killed_retried_under_exit_code_and_then_failed_naming_it(
    jobs: Jobs,
) -> None:
    # A batch of 1024 images of 224 px is 616 MB of input alone, against a 1 GiB limit: the kernel's OOM
    # killer ends the rank inside its pod's memory cgroup and the kubelet says OOMKilled. Under the default
    # restartPolicy ExitCode, 137 is retried (the gang restarts once, backoffLimit 1), then the job fails.
    args = ["--image-size", "224", "--batch-size", "1024", "--steps", "5"]
    body = cpu_job("oom", args=args, runPolicy={"backoffLimit": 1, "restartPolicy": "ExitCode"})
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "1Gi"}}
    jobs.create(body)
    status = jobs.wait_phase("oom", "Failed", 600)
    assert status["restarts"] == 1, status
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "exited with code 137 (OOMKilled: it went over its memory limit)" in failed["message"], failed

    # The restart's Event names OOMKilled too, unless the rank's kubelet restarted it in place before it reported
    # the exit: it then reports only its own removal of the container, and the Event says that instead.
    def said() -> list[str]:
        return [e.message or "" for e in jobs.core.list_namespaced_event(jobs.ns).items]

    def both_said() -> bool:  # the operator posts its Events off the reconcile: the failure's a moment after the status
        messages = said()
        oom = [m for m in messages if "OOMKilled" in m]
        in_place = [m for m in messages if "its kubelet restarted it in place (the code is not kept)" in m]
        return len(oom) >= 2 or bool(oom and in_place)

    wait_for("one Event for the restart and one for the failure", both_said, 30, seen=said)


def test_after_a_gang_restart_the_ranks_wait_while_dns_still_names_the_old_rank_0(
    jobs: Jobs, namespace: str, node: KubeletNode, cluster: Cluster
) -> None:
    """Soak run 1:64: pod names are reused across attempts, so until the EndpointSlice controller catches up,
    `<job>-0.<job>` still resolves to the previous attempt's rank 0, where nothing answers, and a rendezvous
    there times out. With the controller-manager stopped, cluster DNS keeps the old addresses for as long as
    this test likes: every rank must hold in its init container, saying why, and the job must still succeed
    with the one restart it had.

    Rank 0's pod is the one deleted: only a new pod has a new address. Since in-place restarts (b3fe488) the
    other rank's kubelet restarts its pod where it is, init containers first, at the same address; deleting
    rank 1 instead left rank 0 at the address DNS still gave, and nothing to wait for.

    A new rank 0 may even be given its predecessor's address again (the node's IPAM, once it has gone round
    its /24, hands out the first free one): DNS is then right for it, so it is deleted too, until one has a new
    address. Each deletion is one restart, and waiting must add none."""
    assert cluster.box is not None and cluster.box.plane is not None
    manager = next(c for c in cluster.box.plane.components if c.name == "kube-controller-manager")
    args = ["--steps", "200", "--slow-rank", "0", "--slow-seconds", "0.05", "--pg-timeout-seconds", "60"]
    jobs.create(cpu_job("stale", args=args))
    jobs.wait_running("stale", 180)
    stale = jobs.pod("stale-0").status.pod_ip  # what DNS keeps giving while the controller-manager is stopped
    manager.stop()
    deleted = {"0"}
    try:
        jobs.core.delete_namespaced_pod("stale-0", namespace)

        def waiting_pods() -> list[Any] | None:
            # One read per pod, absent taken as "not yet": the operator deletes each pod of an attempt and makes
            # it again under the same name, so a pod listed a moment ago may be gone when it is read (issue 31).
            pods = [jobs.find_pod(f"stale-{rank}") for rank in range(2)]
            if any(p is None for p in pods):
                return None
            attempts = {p.metadata.labels["ddpjob.dev/attempt"] for p in pods}
            if len(attempts) > 1 or attempts <= deleted:
                return None
            (attempt,) = attempts
            if pods[0].status.pod_ip == stale:  # its predecessor's address, which DNS gives: nothing to wait for
                deleted.add(attempt)
                jobs.core.delete_namespaced_pod("stale-0", namespace)
                return None
            return pods if all(_waits(p) for p in pods) else None

        wait_for("a new attempt's ranks in their wait-for-master containers", waiting_pods, 180, interval=1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # long enough for a trainer let through to start its rendezvous
            for rank in range(2):
                pod = jobs.pod(f"stale-{rank}")
                assert _waits(pod), f"stale-{rank} went on while DNS named the old rank 0: {pod.status}"
            time.sleep(1)
        said = {rank: jobs.log(f"stale-{rank}", container="ddpjob-wait-for-master") for rank in range(2)}
        assert "not to this pod" in said[0] and "DNS still has an old rank 0" in said[0], said[0]
        assert "does not answer on port 29500" in said[1], said[1]
    finally:
        manager.start()
    status = jobs.wait_phase("stale", "Succeeded", 300)
    assert status["restarts"] == len(deleted), f"one restart per rank 0 deleted ({sorted(deleted)}): {status}"


def _waits(pod: Any) -> bool:
    """The pod's wait-for-master init container runs, so its trainer has not started."""
    statuses = pod.status.init_container_statuses or []
    return any(s.name == "ddpjob-wait-for-master" and s.state.running for s in statuses)


def test_a_hung_rank_is_restarted_within_the_collective_timeout_plus_30s(jobs: Jobs, node: KubeletNode) -> None:
    timeout = 20
    args = ["--steps", "100000", "--pg-timeout-seconds", str(timeout)]
    jobs.create(cpu_job("hang", args=args, runPolicy={"backoffLimit": 1}))
    jobs.wait_phase("hang", "Running", 180)
    victim = jobs.pod("hang-1")
    wait_for("training to start", lambda: _steps_done(victim) >= 3, 180, interval=1)
    os.kill(jobs.training_pid(node, "hang-1"), signal.SIGSTOP)  # the training process hangs, not its supervisor
    stopped_at = time.monotonic()
    wait_for("the gang restart", lambda: jobs.status("hang").get("restarts", 0) >= 1, timeout + 30, interval=1)
    assert time.monotonic() - stopped_at <= timeout + 30


def test_a_gpu_job_stays_pending_as_unschedulable_and_is_not_failed(
    jobs: Jobs, kubectl: Kubectl, namespace: str
) -> None:
    manifest = REPO / "manifests" / "resnet50-ddp.yaml"
    name = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "DDPJob")["metadata"]["name"]
    kubectl("apply", "-n", namespace, "-f", str(manifest))

    def unschedulable() -> Any:
        # The first refusal may name the claim, until the box's provisioner binds it; then the GPU. As a gang
        # (the box serves PodGroups) the filter's words are on one rank, the gang's verdict on the others.
        pods = jobs.core.list_namespaced_pod(namespace, label_selector=f"ddpjob.dev/job-name={name}").items
        conditions = [c for p in pods for c in p.status.conditions or []]
        return next(
            (c for c in conditions if c.reason == "Unschedulable" and "nvidia.com/gpu" in (c.message or "")), None
        )

    condition = wait_for("the scheduler to refuse the GPU pod for want of nvidia.com/gpu", unschedulable, 90)
    assert "nvidia.com/gpu" in condition.message

    def said() -> Any:
        # The gang's pods take turns carrying the scheduler's words; the status keeps them once said.
        running = jobs.condition(name, "Running")
        why = running and running["reason"] == "Unschedulable" and "nvidia.com/gpu" in running["message"]
        return running if why else None

    def seen() -> Any:  # the status, and what the pods say: whether the operator missed a change of theirs
        pods = jobs.core.list_namespaced_pod(namespace, label_selector=f"ddpjob.dev/job-name={name}").items
        said_by_pods = {p.metadata.name: [(c.type, c.reason, (c.message or "")[:120])
                                          for c in p.status.conditions or []] for p in pods}  # fmt: skip
        return {"status": jobs.status(name), "pods": said_by_pods}

    wait_for("the job's status to name nvidia.com/gpu", said, 60, interval=1, seen=seen)
    for _ in range(5):  # and keeps them
        time.sleep(1)
        assert "nvidia.com/gpu" in (jobs.condition(name, "Running") or {}).get("message", ""), jobs.status(name)
    assert jobs.status(name).get("phase") == "Pending"
    assert jobs.pod(f"{name}-0").status.phase == "Pending"


TEXTBOOK = """\
import argparse, os, time
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--step-seconds", type=float, default=0.0)  # the test's: a real model's step takes this long
args = parser.parse_args()

dist.init_process_group(backend="gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 10), torch.randn(256, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = DDP(nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        time.sleep(args.step_seconds)
    print(f"rank {rank}/{world} epoch {epoch} done", flush=True)
dist.destroy_process_group()
"""


def _textbook_job(jobs: Jobs, name: str, epochs: int, step_seconds: float = 0.0) -> None:
    jobs.core.create_namespaced_config_map(jobs.ns, {"metadata": {"name": "script"}, "data": {"train.py": TEXTBOOK}})
    body = cpu_job(name)
    container = body["spec"]["template"]["spec"]["containers"][0]
    container.update(
        command=["python", "/scripts/train.py"],
        args=["--epochs", str(epochs), "--step-seconds", str(step_seconds)],
        volumeMounts=[{"name": "script", "mountPath": "/scripts"}],
    )
    body["spec"]["template"]["spec"]["volumes"] = [{"name": "script", "configMap": {"name": "script"}}]
    jobs.create(body)


def _reads_as_its_outcome(status: dict[str, Any]) -> None:
    """A finished textbook job's status: every rank joined (each passed the last barrier to exit 0), no rank carries
    a poll's error, one note names the ranks that served no metrics, and no percent or ETA is made up."""
    progress = status["progress"]
    assert status["phase"] == "Succeeded" and progress["joined"] == progress["worldSize"] == 2, status
    assert [r for r in progress.get("ranks", []) if "error" in r] == [], status
    assert progress["note"] == (
        "rank 0 serves no metrics on port 9090, rank 1 serves no metrics on port 9090: progress is not shown for them"
    ), status
    assert "connect" not in str(status).lower(), status
    assert not {"totalSteps", "percentDone", "etaSeconds", "eta"} & set(progress), status


def test_an_unmodified_textbook_ddp_script_trains_under_the_operator(
    jobs: Jobs, kubectl: Kubectl, namespace: str
) -> None:
    # It must outlast the operator's polls until it gives up on its /metrics (5 polls over 45 s), or it is never
    # Running: 100 epochs of 8 steps of at least 0.1 s, 80 s at least however fast the machine (3000 epochs of
    # unpaced steps took 41 s on a quiet one, and it Succeeded from Rendezvous). Few steps, each mostly asleep: under
    # make test's load, 600 epochs of 16 ms steps took 249 s, most of it computing.
    _textbook_job(jobs, "textbook", 100, step_seconds=0.1)
    jobs.wait_phase("textbook", "Running", 180)
    (row,) = table(kubectl("get", "ddpj", "textbook", "-n", namespace).stdout)
    assert (row["PROGRESS"], row["ETA"]) == ("", ""), f"while it runs, with no total and no pace: empty: {row}"
    wait_for("the no-metrics note", lambda: jobs.status("textbook").get("progress", {}).get("note"), 150, interval=2)
    status = jobs.wait_phase("textbook", "Succeeded", 900)
    # It serves no /metrics: said once, in plain words, with no connection error carried in the status.
    _reads_as_its_outcome(status)
    (row,) = table(kubectl("get", "ddpj", "textbook", "-n", namespace).stdout)
    assert (row["STEP"], row["PROGRESS"], row["ETA"]) == ("", "", ""), row


def test_a_textbook_script_that_ends_within_seconds_leaves_its_outcome_not_its_polls_in_the_status(
    jobs: Jobs,
) -> None:
    """Issue 31: it Succeeded in about 6 s, before the operator could tell a silent rank from a slow start, and
    its final status kept a connection error per rank and joined 0."""
    _textbook_job(jobs, "brief", 2)
    _reads_as_its_outcome(jobs.wait_phase("brief", "Succeeded", 300))


def _failed_message(jobs: Jobs, name: str) -> str:
    status = jobs.wait_phase(name, "Failed", 300)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")

    def warnings() -> list[str]:
        return [e.message for e in jobs.core.list_namespaced_event(jobs.ns).items if e.type == "Warning"]

    def said() -> bool:  # the operator posts its Events off the reconcile: a moment after the status
        return any(failed["message"] in m or m in failed["message"] for m in warnings())

    wait_for("a Warning Event saying what the Failed condition says", said, 30, seen=lambda: (failed, warnings()))
    return str(failed["message"])


def test_a_mistyped_model_fails_with_the_trainers_own_one_line_error_from_its_termination_message(
    jobs: Jobs,
) -> None:
    jobs.create(cpu_job("typo", args=["--model", "resnet5O"], runPolicy={"backoffLimit": 0}))
    message = _failed_message(jobs, "typo")
    assert "exited with code 2: --model (TRAIN_MODEL): unknown value 'resnet5O'" in message, message
    assert "Traceback" not in message


def test_a_script_that_raises_shows_its_last_log_lines_through_fallback_to_logs_on_error(jobs: Jobs) -> None:
    body = cpu_job("raises", runPolicy={"backoffLimit": 0})
    code = "import sys; print('loading data', flush=True); raise SystemExit('no such dataset: /data/imagenet')"
    body["spec"]["template"]["spec"]["containers"][0].update(command=["python", "-c", code], args=[])
    jobs.create(body)
    message = _failed_message(jobs, "raises")
    assert "exited with code 1" in message and "no such dataset: /data/imagenet" in message, message


def _cannot_start(jobs: Jobs, name: str) -> tuple[dict[str, Any], list[str]]:
    def stuck() -> dict[str, Any] | None:
        running = jobs.condition(name, "Running")
        return running if running and running.get("reason") == "ContainerCannotStart" else None

    condition = wait_for(f"{name} to say why a rank cannot start", stuck, 180, interval=1)
    events = [e.message for e in jobs.wait_events(name, "ContainerCannotStart")]
    assert jobs.status(name).get("phase") != "Failed", "a pod that cannot start yet is not a failed job"
    return condition, events


def test_an_image_that_is_not_there_is_named_in_one_status_line_and_event(jobs: Jobs) -> None:
    body = cpu_job("noimage")
    body["spec"]["template"]["spec"]["containers"][0]["image"] = "ghcr.io/ddpjob/trainer:no-such-tag"
    jobs.create(body)
    condition, events = _cannot_start(jobs, "noimage")
    message = condition["message"]
    assert re.match(r"rank \d \(pod noimage-\d\) cannot start: (init )?container \S+: (ErrImagePull|ImagePullBackOff)",
                    message), message  # fmt: skip
    assert "ghcr.io/ddpjob/trainer:no-such-tag" in message and "\n" not in message
    assert events and all(e.startswith("rank ") for e in events), events


def test_a_missing_configmap_is_named_in_one_status_line_and_event(jobs: Jobs) -> None:
    body = cpu_job("noconfig")
    body["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "train-settings"}}]
    jobs.create(body)
    condition, events = _cannot_start(jobs, "noconfig")
    message = condition["message"]
    assert "cannot start: container trainer: CreateContainerConfigError" in message, message
    assert 'configmap "train-settings" not found' in message and "\n" not in message
    assert events, "one Warning Event per cause"
