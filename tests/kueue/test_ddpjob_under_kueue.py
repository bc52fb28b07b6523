"""DDPJob under real Kueue v0.17.0, on the box's node, with the operator as its own process.

Nothing Kueue owns is mocked: Kueue admits, preempts and evicts; the operator keeps each job's Workload as Kueue's
own job reconciler does for its built-in kinds. Each pod of these jobs asks for ``example.com/slot``, of which the
ClusterQueue (tests/kueue/queues.yaml) grants 4 and the node advertises 8, so Kueue's quota, not the scheduler, is
what holds a job back. Slots in use are counted from the pods themselves.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ddpjob_box.operator_process import OperatorProcess
from ddpjob_contract.kueue import LABEL_PRIORITY_CLASS, LABEL_QUEUE_NAME
from tests.chart.helm import wait_established
from tests.e2e import kube
from tests.e2e.conftest import CRD
from tests.e2e.jobs import cpu_job

from .conftest import LOCAL_QUEUE, KueueCluster

pytestmark = pytest.mark.e2e

SLOT = "example.com/slot"
WORKLOADS = "workloads.kueue.x-k8s.io"
"""Named in full: Kubernetes 1.37 serves a Workload of its own (scheduling.k8s.io), which kubectl may pick first."""
T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float, interval: float = 1.0) -> T:
    """tests/e2e's wait_for, polling once a second: each look here is a kubectl process."""
    return kube.wait_for(what, check, timeout, interval)


class Cluster:
    """kubectl on the box with Kueue, in one namespace."""

    def __init__(self, kc: KueueCluster, namespace: str) -> None:
        self.kc, self.ns = kc, namespace

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.kc.kubectl(*args, check=check)

    def get(self, *args: str) -> dict[str, Any]:
        return dict(json.loads(self.run("get", "-n", self.ns, "-o", "json", *args).stdout))

    def create(self, body: dict[str, Any]) -> None:
        proc = subprocess.run(
            [str(self.kc.kubectl.binary), f"--kubeconfig={self.kc.kubeconfig}", "create", "-n", self.ns, "-f", "-"],
            input=json.dumps(body), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr

    def job(self, name: str) -> dict[str, Any]:
        return self.get("ddpjob", name)

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.job(name).get("status") or {})

    def phase(self, name: str) -> str:
        return str(self.status(name).get("phase") or "")

    def wait_phase(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        return wait_for(f"{name} to be {phase}", lambda: (s := self.status(name)).get("phase") == phase and s, timeout)

    def pods(self, job: str | None = None) -> list[dict[str, Any]]:
        selector = ["-l", f"ddpjob.dev/job-name={job}"] if job else []
        return list(self.get("pods", *selector)["items"])

    def log(self, pod: str) -> str:
        return self.run("logs", "-n", self.ns, pod, "-c", "trainer", check=False).stdout

    def explain(self, name: str) -> str:
        """The job's conditions, its Workload's, its Events and its pods' containers, in full: for a failed
        assertion's message."""
        events = self.run("get", "events", "-n", self.ns, "--field-selector", f"involvedObject.name={name}",
                          "--sort-by=.lastTimestamp", check=False).stdout  # fmt: skip
        workloads = self.run("get", WORKLOADS, "-n", self.ns, "-o", "json", check=False).stdout
        said = [{"workload": w["metadata"]["name"], "conditions": (w.get("status") or {}).get("conditions")}
                for w in json.loads(workloads or "{}").get("items") or []]  # fmt: skip
        pods = {p["metadata"]["name"]: (p.get("status") or {}).get("containerStatuses") for p in self.pods(name)}
        return (f"{name}: {json.dumps(self.status(name), indent=1)}\nworkloads: {json.dumps(said, indent=1)}\n"
                f"{events}\npods' containers: {json.dumps(pods, indent=1)}")  # fmt: skip

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == type_), {})


@contextlib.contextmanager
def operated(kueue_cluster: KueueCluster, namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    """The CRD and the operator watching ``namespace`` (its queues applied already); the jobs and their Workloads
    gone, and the operator stopped, after."""
    kubectl = kueue_cluster.kubectl
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(kueue_cluster.kubeconfig, "ddpjobs.ddpjob.dev")
    op = OperatorProcess(kueue_cluster.kubeconfig, tmp_path / "operator.log", namespaces=[namespace])
    cluster = Cluster(kueue_cluster, namespace)
    try:
        yield cluster
    finally:
        # The jobs go while the operator runs: it drops Kueue's finalizer from their Workloads, as in a cluster.
        # Stopped first, it would leave them holding their quota, and the namespace terminating, for good.
        kubectl("delete", "ddpjobs", "--all", "-n", namespace, "--wait=false", check=False)
        wait_for("the test's Workloads gone", lambda: not cluster.get(WORKLOADS)["items"], 120)
        op.stop()
        log = op.log()
        print(f"--- operator log:\n{log[-6000:]}")
        assert "Traceback" not in log, "the operator logged a traceback"


@pytest.fixture
def cluster(kueue_cluster: KueueCluster, queues: str, tmp_path: Path) -> Iterator[Cluster]:
    """The namespace with its LocalQueue, the CRD, and the operator watching the namespace."""
    with operated(kueue_cluster, queues, tmp_path) as cluster:
        yield cluster


def queued_job(
    name: str, *, replicas: int = 2, slots: int = 1, steps: int = 40, priority: str = "", args: list[str] | None = None,
    **spec: Any,
) -> dict[str, Any]:  # fmt: skip
    """A small CPU DDPJob in the test's LocalQueue; each rank asks for ``slots`` example.com/slot."""
    body = cpu_job(name, replicas=replicas, args=["--steps", str(steps), *(args or [])], **spec)
    body["metadata"]["labels"] = {LABEL_QUEUE_NAME: LOCAL_QUEUE}
    if priority:
        body["metadata"]["labels"][LABEL_PRIORITY_CLASS] = priority
    trainer = body["spec"]["template"]["spec"]["containers"][0]
    trainer["resources"] = {"requests": {SLOT: str(slots), "cpu": "100m"}, "limits": {SLOT: str(slots)}}
    return body


def slots_in_use(pods: list[dict[str, Any]]) -> int:
    """Slots held by pods that exist and have not finished (terminating ones still hold theirs)."""
    held = 0
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in pod["spec"]["containers"]:
            held += int(((c.get("resources") or {}).get("requests") or {}).get(SLOT, 0))
    return held


class SlotWatch:
    """Counts the slots in use from the pods, every half second, in a thread; ``peak`` is the most seen."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.peak, self._stop = cluster, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SlotWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.peak = max(self.peak, slots_in_use(self.cluster.pods()))
            except Exception:
                continue


def test_quota_runs_two_of_three_jobs_and_admits_the_third_when_one_finishes(cluster: Cluster) -> None:
    with SlotWatch(cluster) as watch:
        for made, name in enumerate(("q1", "q2", "q3"), start=1):
            cluster.create(queued_job(name, slots=1, steps=60, args=["--slow-seconds", "0.3", "--slow-rank", "0"]))
            # Kueue orders a queue by its Workloads' creation, which the operator makes: one after the other here,
            # so q3 is the one that waits (an operator that starts late would make the three at once, in any order)
            wait_for(f"{name}'s Workload", partial(_workloads_made, cluster, made), 120)
        wait_for("q1 and q2 to run", lambda: all(cluster.phase(j) in ("Running", "Rendezvous") for j in ("q1", "q2")),
                 300)  # fmt: skip
        said = cluster.condition("q3", "Queued")
        assert cluster.phase("q3") == "Queued" and said.get("status") == "True", cluster.status("q3")
        assert "queued in LocalQueue user-queue" in said["message"] and SLOT in said["message"], said
        assert cluster.pods("q3") == []
        table = cluster.run("get", "ddpj", "-n", cluster.ns).stdout
        q3 = next(line for line in table.splitlines() if line.startswith("q3 "))
        assert "Queued" in q3 and SLOT in q3, f"kubectl get ddpj shows Kueue's reason:\n{table}"
        for name in ("q1", "q2", "q3"):
            cluster.wait_phase(name, "Succeeded", 900)
    assert 0 < watch.peak <= 4, f"at most 4 slots in use, counted from the pods: {watch.peak}"
    workload = cluster.get(WORKLOADS)["items"]
    assert len(workload) == 3 and all(
        any(c["type"] == "Finished" and c["status"] == "True" for c in w["status"]["conditions"]) for w in workload
    ), workload


def _workloads_made(cluster: Cluster, count: int) -> bool:
    return len(cluster.get(WORKLOADS)["items"]) == count


def _step(cluster: Cluster, name: str) -> int:
    return int(((cluster.status(name).get("progress") or {}).get("step")) or 0)


def test_a_high_priority_job_preempts_a_low_one_which_resumes_from_its_checkpoint_uncharged(
    cluster: Cluster,
) -> None:
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt"},
           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    cluster.create(pvc)
    args = ["--checkpoint-interval", "10", "--slow-rank", "0", "--slow-seconds", "0.2"]
    low = queued_job("low", slots=2, steps=200, priority="low-priority", args=args, checkpoint={"claimName": "ckpt"})
    cluster.create(low)
    wait_for("the low job past step 50", lambda: _step(cluster, "low") > 50, 600)
    grace = 30  # the pods' default terminationGracePeriodSeconds
    cluster.create(queued_job("high", slots=2, steps=20, priority="high-priority"))
    started = time.monotonic()
    wait_for("the low job's pods gone", lambda: cluster.pods("low") == [], grace + 30, interval=0.5)
    print(f"low's pods gone {time.monotonic() - started:.1f}s after the high job was created")
    status = cluster.status("low")
    said = cluster.condition("low", "Queued")
    assert said.get("reason") == "EvictedByKueue" and "Preempted" in said.get("message", ""), status
    assert status.get("restarts", 0) == 0, f"an eviction is not charged as a restart: {status}"
    cluster.wait_phase("high", "Succeeded", 600)
    final = cluster.wait_phase("low", "Succeeded", 900)
    assert final.get("restarts", 0) == 0, final
    log = cluster.log("low-0")
    resumed = re.search(r"resumed from step (\d+)", log)
    assert resumed and int(resumed.group(1)) > 0, f"the low job resumed from its checkpoint:\n{log[:3000]}"


def test_a_job_whose_image_does_not_exist_is_evicted_by_podsreadytimeout_and_requeued(
    cluster: Cluster, kueue_cluster: KueueCluster
) -> None:
    timeout = kueue_cluster.kueue.configuration()["waitForPodsReady"]["timeout"]
    body = queued_job("noimage")
    body["spec"]["template"]["spec"]["containers"][0]["image"] = "localhost/ddpjob/no-such-image:0"
    cluster.create(body)

    def evicted() -> dict[str, Any] | None:
        said = cluster.condition("noimage", "Queued")
        return said if said.get("reason") == "EvictedByKueue" else None

    said = wait_for(f"the job evicted after waitForPodsReady's {timeout}", evicted, 600)
    assert "PodsReadyTimeout" in said["message"], said
    events = cluster.run("get", "events", "-n", cluster.ns, "--field-selector", "involvedObject.name=noimage").stdout
    assert "EvictedByKueue" in events, events
    # its pods go, Kueue's quota is given back, and the Workload is requeued
    wait_for("the job's pods gone", lambda: cluster.pods("noimage") == [], 120)
    workload = cluster.get(WORKLOADS)["items"][0]
    requeued = {c["type"]: c for c in workload["status"]["conditions"]}
    assert requeued["QuotaReserved"]["status"] == "False" or requeued.get("Requeued", {}).get("status"), workload
    status_line = json.dumps(cluster.status("noimage"))
    assert "PodsReadyTimeout" in status_line and "queued in LocalQueue" in status_line, status_line


def test_partial_admission_runs_the_ranks_the_quota_allows_at_that_world_size(cluster: Cluster) -> None:
    cluster.create(queued_job("partial", replicas=4, slots=2, steps=20, minReplicas=2))
    status = cluster.wait_phase("partial", "Succeeded", 900)
    assert status.get("admittedReplicas") == 2, status
    running = [c for c in status.get("conditions") or [] if c["type"] == "Queued"]
    assert running and "running 2 of 4 ranks" in running[0]["message"], status
    log = cluster.log("partial-0")
    assert "world size 2" in log, log[:2000]
    assert {p["metadata"]["name"] for p in cluster.pods("partial")} <= {"partial-0", "partial-1"}


def test_kueue_killed_while_jobs_are_queued_and_admitted_loses_none_and_duplicates_none(
    cluster: Cluster, kueue_cluster: KueueCluster
) -> None:
    args = ["--slow-seconds", "0.3", "--slow-rank", "0"]
    # k1 trains for 30 s, so that it still runs, and holds the quota, through Kueue's stop and the 10 s after it (with
    # 40 steps, a loaded machine once saw k1 end and k2 run to its end before the check). k1 is admitted before k2
    # and k3 exist: created a second apart, a loaded CI machine once saw k2's Workload admitted first, run its 12 s
    # and succeed before Kueue's stop.
    cluster.create(queued_job("k1", slots=2, steps=100, args=args))
    wait_for("k1 to run", lambda: cluster.phase("k1") in ("Running", "Rendezvous"), 300)
    for name in ("k2", "k3"):
        cluster.create(queued_job(name, slots=2, steps=40, args=args))
    wait_for("k2's and k3's Workloads", lambda: _workloads_made(cluster, 3), 120)
    kueue_cluster.kueue.stop()
    try:
        time.sleep(10)
        assert cluster.phase("k2") == "Queued" and cluster.phase("k3") == "Queued"
        assert len(cluster.pods("k1")) == 2
    finally:
        kueue_cluster.kueue.start()
    for name in ("k1", "k2", "k3"):
        status = cluster.wait_phase(name, "Succeeded", 900)
        assert status.get("restarts", 0) == 0, cluster.explain(name)
    names = [p["metadata"]["name"] for p in cluster.pods()]
    assert len(names) == len(set(names))
