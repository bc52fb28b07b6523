"""Operator high availability: how long DDPJobs go unserved when the leader is SIGKILLed, and what a standby costs.

    python -m bench.takeover                      # 20 trials, then 1,000 jobs held by both replicas
    python -m bench.takeover --trials 3 --jobs 100

The box's control plane alone (no node: the pods stay Pending), the DDPJob CRD, and two operator processes run as
the chart runs them: ``--leader-elect`` with its durations (lease 15 s, renew deadline 10 s, retry 2 s). Each trial
waits until the standby has run a few seconds, reads the Lease's holder, SIGKILLs that process at a random
point between two renewals, creates a 2-rank DDPJob at once, and times from the kill to the
job's first pod: the standby took the Lease and reconciled the job, its first write that a client sees. The
killed replica then starts again, as the new standby. A takeover within the lease duration plus 2 s is the target.

Then the standby's cost: ``--jobs`` DDPJobs created and given their pods by the leader; the standby's CPU over
``--window`` seconds and its RSS, beside the leader's.
"""

from __future__ import annotations

import argparse
import random
import signal
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.apiserver import Api, ApiError
from bench.common import log, machine, percentile, table, write_results
from bench.operator_scale import PodWatch, control_plane_with_crd, cpu_seconds, create_jobs, job_body, jobs_path
from ddpjob_box.operator_process import OperatorProcess
from ddpjob_box.ports import free_port

NAME = "takeover"
NAMESPACE = "default"
LEASE = "ddpjob-operator"
TIMING = {"lease-duration": 15.0, "renew-deadline": 10.0, "retry-period": 2.0}
"""The chart's durations."""


class Replica:
    """One operator replica, its own process, running for leader as ``identity``."""

    def __init__(self, kubeconfig: Path, logs: Path, identity: str) -> None:
        self.identity = identity
        self.metrics_port = free_port()
        flags = ["--leader-elect", f"--leader-elect-identity={identity}", f"--leader-elect-lease={LEASE}",
                 *(f"--leader-elect-{k}={v:g}" for k, v in TIMING.items())]  # fmt: skip
        self.process = OperatorProcess(kubeconfig, logs / f"{identity}.log", metrics_port=self.metrics_port,
                                       extra_args=flags)  # fmt: skip

    def standing_by(self) -> bool:
        """Whether it is up and running for leader (its metrics say it does not lead)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
                return "\nddpjob_operator_leader 0.0" in response.read().decode()
        except OSError:
            return False

    def memory_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


@dataclass
class Figures:
    takeovers_s: list[float]
    jobs: int
    window_s: float
    leader_cpu_share: float
    standby_cpu_share: float
    leader_rss_mib: float
    standby_rss_mib: float


def holder(client: Api) -> str:
    """The Lease's holder ("" while there is none)."""
    try:
        lease = client.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")
    except ApiError as err:
        if err.status != 404:
            raise
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def wait_for_leader(client: Api, replicas: dict[str, Replica], timeout: float = 60.0) -> Replica:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = holder(client)
        if held in replicas:
            return replicas[held]
        time.sleep(0.2)
    raise RuntimeError(f"no replica holds the Lease after {timeout:.0f}s (holder: {holder(client)!r})")


def trial(client: Api, kubeconfig: Path, logs: Path, replicas: dict[str, Replica], n: int) -> float:
    """SIGKILL the leader, create a job at once; seconds from the kill to its first pod. The standby has run for
    a while (as it would have on a cluster), and the kill falls anywhere between two of the leader's renewals."""
    leader = wait_for_leader(client, replicas)
    (standby,) = [r for r in replicas.values() if r is not leader]
    deadline = time.monotonic() + 60
    while not standby.standing_by():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{standby.identity} did not start within 60 s; its log:\n{standby.process.log_tail()}")
        time.sleep(0.2)
    time.sleep(3.0 + random.uniform(0.0, TIMING["retry-period"]))
    watch = PodWatch(client, 1)
    name = f"takeover-{n:03d}"
    try:
        killed = time.perf_counter()
        leader.process.proc.send_signal(signal.SIGKILL)
        leader.process.proc.wait()
        client.post(jobs_path(NAMESPACE), job_body(name, 2))
        if not watch.wait([(NAMESPACE, name)], timeout=120):
            raise RuntimeError(f"{name} got no pod within 120 s of the leader's kill")
        took = watch.job(NAMESPACE, name).done - killed
    finally:
        watch.close()
    del replicas[leader.identity]
    again = Replica(kubeconfig, logs, f"replica-{n + 2}")
    replicas[again.identity] = again
    return took


def standby_cost(client: Api, replicas: dict[str, Replica], jobs: int, window: float) -> tuple[float, ...]:
    """The leader's and the standby's CPU share over ``window`` and RSS, with ``jobs`` jobs served."""
    leader = wait_for_leader(client, replicas)
    (standby,) = [r for r in replicas.values() if r is not leader]
    watch = PodWatch(client, 2)
    names = [f"held-{i:05d}" for i in range(jobs)]
    try:
        errors = create_jobs(client, watch, NAMESPACE, names, 2, rate=0, threads=4)
        if errors:
            raise RuntimeError(f"{len(errors)} creates failed, first: {errors[0]}")
        done = watch.wait([(NAMESPACE, n) for n in names], timeout=600)
        log(f"{done} of {jobs} jobs have their pods")
    finally:
        watch.close()
    time.sleep(10.0)  # their first reconciles and Events end
    before = {r.identity: cpu_seconds(r.process.pid) for r in (leader, standby)}
    time.sleep(window)
    used = {r.identity: cpu_seconds(r.process.pid) - before[r.identity] for r in (leader, standby)}
    return (used[leader.identity] / window, used[standby.identity] / window, leader.memory_mib(),
            standby.memory_mib())  # fmt: skip


def main(argv: Sequence[str] | None = None) -> Figures:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs held while the standby's cost is measured")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the CPU is counted over")
    args = parser.parse_args(argv)
    with control_plane_with_crd() as (plane, client), tempfile.TemporaryDirectory(prefix="ddpjob-takeover-") as tmp:
        logs = Path(tmp)
        replicas = {f"replica-{i}": Replica(plane.kubeconfig, logs, f"replica-{i}") for i in (0, 1)}
        takeovers: list[float] = []
        try:
            for n in range(args.trials):
                took = trial(client, plane.kubeconfig, logs, replicas, n)
                log(f"trial {n + 1}: leader killed -> the job's first pod {took:.2f}s")
                takeovers.append(took)
            cost = standby_cost(client, replicas, args.jobs, args.window)
        finally:
            for replica in replicas.values():
                replica.process.stop()
    figures = Figures(takeovers, args.jobs, args.window, *cost)
    report(figures)
    return figures


def report(f: Figures) -> None:
    target = TIMING["lease-duration"] + 2.0
    rows: list[list[Any]] = [
        ["leader SIGKILLed -> a new job's first pod", len(f.takeovers_s), f"{percentile(f.takeovers_s, 50):.1f}",
         f"{percentile(f.takeovers_s, 99):.1f}", f"{max(f.takeovers_s):.1f}", f"<= {target:g}"],
    ]  # fmt: skip
    markdown = table(["from -> to", "trials", "median s", "p99 s", "max s", "target s"], rows)
    markdown += "\n\n" + table(
        ["jobs held", "window s", "leader CPU", "standby CPU", "leader RSS MiB", "standby RSS MiB"],
        [[f.jobs, f"{f.window_s:g}", f"{f.leader_cpu_share:.1%}", f"{f.standby_cpu_share:.1%}",
          f"{f.leader_rss_mib:.0f}", f"{f.standby_rss_mib:.0f}"]],
    )  # fmt: skip
    print(markdown)
    write_results(NAME, {"machine": machine(), **asdict(f)}, markdown)


if __name__ == "__main__":
    main()
