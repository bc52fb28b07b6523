"""Kill the operator at the worst moments, start it again: nothing lost, nothing duplicated.

The operator runs as a real process here (`python -m ddpjob_operator operator`), so it can die
like a SIGKILL would; the fault point (DDPJOB_FAULTS) picks the exact moment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.operator_process import error_lines
from ddpjob_box.ports import free_port
from ddpjob_contract import faults
from ddpjob_contract.pods import LABEL_ATTEMPT
from ddpjob_operator.controller import CREATE_PARALLELISM

from .helpers import Raw, job_body, wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def operator_process(
    namespace: str, kubeconfig: str, log: Path, *, faults_spec: str = "", metrics_port: int = 0, liveness: str = ""
) -> Iterator[subprocess.Popen[bytes]]:
    path = os.pathsep.join([str(REPO / "contract"), str(REPO / "operator")])
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONPATH": path}
    env.pop(faults.ENV, None)
    if faults_spec:
        env[faults.ENV] = faults_spec
    argv = [sys.executable, "-m", "ddpjob_operator", "operator", "-n", namespace,
            "--metrics-port", str(metrics_port), "--liveness", liveness]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def pod_uids(raw: Raw, ns: str, name: str) -> dict[str, tuple[str, str]]:
    return {
        p["metadata"]["name"]: (p["metadata"]["uid"], p["metadata"]["labels"][LABEL_ATTEMPT])
        for p in raw.pods(ns, name)
        if not p["metadata"].get("deletionTimestamp")
    }


def test_an_operator_killed_while_creating_pods_finishes_the_job_without_duplicates(
    raw: Raw, namespace: str, crd: Any, kubeconfig: str, tmp_path: Path
) -> None:
    log = tmp_path / "operator.log"
    replicas = CREATE_PARALLELISM + 2  # more than one wave of creates
    raw.create_job(namespace, job_body("big", replicas))
    with operator_process(namespace, kubeconfig, log, faults_spec="pod-created:3") as proc:
        assert proc.wait(timeout=120) == faults.EXIT_CODE, log.read_text()
    before = pod_uids(raw, namespace, "big")
    # Died right after the third pod: the rest of its wave may have landed too, never the next wave.
    assert 3 <= len(before) <= CREATE_PARALLELISM, sorted(before)
    assert set(before) <= {f"big-{r}" for r in range(CREATE_PARALLELISM)}
    status = raw.status(namespace, "big")
    assert status.get("launchedAttempt", -1) < 0

    metrics_port, liveness_port = free_port(), free_port()
    liveness = f"http://127.0.0.1:{liveness_port}/healthz"
    with operator_process(namespace, kubeconfig, log, metrics_port=metrics_port, liveness=liveness):
        wait_for(lambda: raw.status(namespace, "big").get("launchedAttempt") == 0, timeout=60, what="launch")
        after = pod_uids(raw, namespace, "big")
        assert sorted(after) == sorted(f"big-{r}" for r in range(replicas))
        assert all(after[name] == before[name] for name in before), "the first three were kept, not recreated"
        assert {attempt for _, attempt in after.values()} == {"0"}
        services = [s for s in raw.services(namespace) if s["metadata"]["name"] == "big"]
        assert len(services) == 1
        status = raw.status(namespace, "big")
        assert (status["attempt"], status["restarts"], status["replicas"]["active"]) == (0, 0, replicas)

        raw.set_all(namespace, "big", "Running")
        wait_for(lambda: raw.status(namespace, "big").get("phase") == "Running", what="Running")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        for name in ("jobs_created_total", "jobs_succeeded_total", "jobs_restarted_total",
                     "reconcile_duration_seconds_bucket"):  # fmt: skip
            assert f"ddpjob_operator_{name}" in metrics
        assert urllib.request.urlopen(liveness, timeout=10).status == 200
    assert len(raw.events(namespace, "big")) == len({e["reason"] for e in raw.events(namespace, "big")})
    assert [line for line in error_lines(log.read_text(errors="replace")) if "pod-created" not in line] == []


def test_an_operator_killed_during_a_gang_restart_counts_the_restart_once(
    raw: Raw, namespace: str, crd: Any, kubeconfig: str, tmp_path: Path
) -> None:
    log = tmp_path / "operator.log"
    raw.create_job(namespace, job_body("gang", 3))
    with operator_process(namespace, kubeconfig, log):
        wait_for(lambda: raw.status(namespace, "gang").get("launchedAttempt") == 0, timeout=60, what="launch")
        raw.set_all(namespace, "gang", "Running")
        wait_for(lambda: raw.status(namespace, "gang").get("phase") == "Running", what="Running")
    raw.set_pod(namespace, "gang-2", "Failed", exit_code=200)  # while no operator runs

    with operator_process(namespace, kubeconfig, log, faults_spec="pod-deleted:1") as proc:
        assert proc.wait(timeout=120) == faults.EXIT_CODE, log.read_text()
    status = raw.status(namespace, "gang")
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Restarting", 1, 1)
    assert len(pod_uids(raw, namespace, "gang")) == 2, "died after deleting one pod of three"

    with operator_process(namespace, kubeconfig, log):

        def next_attempt() -> bool:
            pods = pod_uids(raw, namespace, "gang")
            return len(pods) == 3 and {a for _, a in pods.values()} == {"1"}

        wait_for(next_attempt, timeout=60, what="three pods of attempt 1")
        wait_for(lambda: raw.status(namespace, "gang").get("launchedAttempt") == 1, what="launch of attempt 1")
    status = raw.status(namespace, "gang")
    assert (status["attempt"], status["restarts"]) == (1, 1), "one failure, one restart"
    assert error_lines(log.read_text(errors="replace")) == []
