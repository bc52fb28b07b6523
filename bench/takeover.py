"""Operator high availability: how long DDPJobs go unserved when the leader is SIGKILLed, and what a standby costs.

    python -m bench.takeover                      # 20 trials, then 1,000 jobs held by both replicas
    python -m bench.takeover --trials 3 --jobs 100

The box's control plane alone (no node: the pods stay Pending), the DDPJob CRD, and two operator processes run as
the chart runs them: ``--leader-elect`` with its durations (lease 15 s, renew deadline 10 s, retry 2 s). Each trial
waits until the standby has run a few seconds, reads the Lease's holder, SIGKILLs that process at a random
point between two renewals, creates a 2-rank DDPJob at once, and times from the kill to the
job's first pod: the standby took the Lease and reconciled the job, its first write that a client sees. The
killed replica then starts again, as the new standby. A takeover within the lease duration plus 2 s is the target.

Then ``--hangs`` trials of a leader that freezes (SIGSTOP: a stalled process, a paused VM, a node whose clock and
network stall) with a job's reconcile in flight, past the lease duration, then goes on (SIGCONT). The standby takes
over; the old leader must send no write after its renew deadline, not even the ones it had queued: the apiserver's
audit log (every request, with its User-Agent, ``ddpjob-operator/<identity>``) says which writes it received from
the old leader and when. It must then exit, to come back as a standby.

Then ``--burst`` jobs (on KWOK's simulated nodes, which run each pod for ``--burst-seconds``): half created, the
leader SIGKILLed at once with their reconciles under way, the other half created. Every job must Succeed with no
restart; from the audit log: when the standby took the Lease and sent its first other write after the kill, any
write it sent before it took the Lease, and any pod the two replicas both created or created twice (a second live
pod for one rank).

Then the standby's cost: ``--jobs`` DDPJobs created and given their pods by the leader; the standby's CPU over
``--window`` seconds and its RSS, beside the leader's.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import many_jobs
from bench.apiserver import Api, ApiError
from bench.common import log, machine, percentile, table, write_results
from bench.operator_scale import (
    PodWatch,
    control_plane_with_crd,
    cpu_seconds,
    create_jobs,
    job_body,
    jobs_path,
    memory_mib,
)
from ddpjob_box import audit
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


@dataclass
class Hang:
    stopped_s: float
    """How long the leader was frozen."""
    took_over_s: float
    """From the freeze to the new leader's first pod of the job created after it."""
    late_writes: list[str]
    """Writes the apiserver received from the old leader after its renew deadline (the target: none)."""
    refused_writes: int
    """Writes the old leader's fence refused once it went on (its log)."""
    exited: bool
    """The old leader exited after it went on (to come back as a standby)."""


@dataclass
class Burst:
    jobs: int
    took_over_s: float
    """From the kill to the new leader's first write other than its Lease, once it held the Lease."""
    acquired_s: float
    """From the kill to its write that took the Lease."""
    succeeded: int
    restarted: list[str]
    """Jobs whose status counts a restart (the target: none)."""
    standby_writes: list[str]
    """Writes the standby sent before it led, its Lease's aside (the target: none)."""
    pods_by_both: list[str]
    """Jobs whose pods both replicas created: the hand-over of a job under way (each rank's pod is still created
    once, by whoever leads), not a fault."""
    created_twice: list[str]
    """Pods created twice (the first deleted in between: a restart the takeover cost; the target: none). A second
    live pod for one rank the apiserver refuses (409), by its name."""


@dataclass
class Figures:
    hangs: list[Hang]
    takeovers_s: list[float]
    jobs: int
    window_s: float
    leader_cpu_share: float
    standby_cpu_share: float
    leader_rss_mib: float
    standby_rss_mib: float
    bursts: list[Burst]


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
    leader = settled_leader(client, replicas)
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
    replace(replicas, leader, Replica(kubeconfig, logs, f"replica-{n + 2}"))
    return took


WRITES = ("create", "update", "patch", "delete", "deletecollection")


def writes_after(log: Path, agent: str, since: float) -> list[str]:
    """The writes the apiserver received from ``agent`` at or after ``since`` (seconds since the epoch): when, the
    verb, the object and the answer's code."""
    return [_said(event, when, since) for event, when in audit.received(log, since)
            if event.get("userAgent") == agent and event.get("verb") in WRITES]  # fmt: skip


def hang(client: Api, plane: Any, kubeconfig: Path, logs: Path, replicas: dict[str, Replica], n: int) -> Hang:
    """Freeze the leader with a reconcile in flight, past its lease; let it go on once the standby leads."""
    leader = settled_leader(client, replicas)
    watch = PodWatch(client, 1)
    before, after = f"hang-{n:03d}-before", f"hang-{n:03d}-after"
    try:
        client.post(jobs_path(NAMESPACE), job_body(before, 4))  # its reconcile is under way as the leader stops
        time.sleep(random.uniform(0.0, 0.05))
        stopped, stopped_wall = time.perf_counter(), time.time()
        leader.process.proc.send_signal(signal.SIGSTOP)
        client.post(jobs_path(NAMESPACE), job_body(after, 2))
        if not watch.wait([(NAMESPACE, after)], timeout=120):
            raise RuntimeError(f"{after} got no pod within 120 s of the leader's freeze")
        took = watch.job(NAMESPACE, after).done - stopped
        time.sleep(2.0)
        frozen = time.perf_counter() - stopped
        leader.process.proc.send_signal(signal.SIGCONT)
        try:
            leader.process.proc.wait(timeout=60)
            exited = True
        except subprocess.TimeoutExpired:
            exited = False
    finally:
        watch.close()
    time.sleep(2.0)  # the audit log is written as each request completes
    deadline = stopped_wall + TIMING["renew-deadline"]
    late = writes_after(plane.audit_log, f"ddpjob-operator/{leader.identity}", deadline)
    refused = leader.process.log().count("is not the leader: the write was not sent")
    leader.process.stop()
    replace(replicas, leader, Replica(kubeconfig, logs, f"replica-h{n}"))
    return Hang(round(frozen, 2), round(took, 2), late, refused, exited)


def burst(client: Api, plane: Any, logs: Path, replicas: dict[str, Replica], jobs: int, seconds: int, n: int) -> Burst:
    """Half the jobs created, the leader SIGKILLed with their reconciles under way, the other half created; every
    job waited for to the end, then the audit log read."""
    leader = settled_leader(client, replicas)
    (standby,) = [r for r in replicas.values() if r is not leader]
    names = [f"burst{n}-{i:03d}" for i in range(jobs)]
    body = many_jobs.job_body(2, seconds)
    watch = PodWatch(client, 2)
    began = time.time()
    try:
        errors = create_jobs(client, watch, NAMESPACE, names[: jobs // 2], 2, rate=0, threads=4, body=body)
        killed = time.time()
        leader.process.proc.send_signal(signal.SIGKILL)
        leader.process.proc.wait()
        errors += create_jobs(client, watch, NAMESPACE, names[jobs // 2 :], 2, rate=0, threads=4, body=body)
    finally:
        watch.close()
    if errors:
        raise RuntimeError(f"{len(errors)} creates failed, first: {errors[0]}")
    statuses = wait_finished(client, names, timeout=600)
    replace(replicas, leader, Replica(plane.kubeconfig, logs, f"replica-b{n}"))
    time.sleep(2.0)  # the audit log is written as each request completes
    events = list(audit.received(plane.audit_log, began))
    return read_burst(events, leader.identity, standby.identity, killed, statuses)


def read_burst(
    events: Sequence[tuple[dict[str, Any], float]],
    leader: str,
    standby: str,
    killed: float,
    statuses: dict[str, dict[str, Any]],
) -> Burst:
    """A burst's figures from the audit log's events since it began (each with the time the apiserver received it),
    the identities of the killed leader and the standby, the kill's time and each job's final status."""
    agent = {f"ddpjob-operator/{who}": who for who in (leader, standby)}
    ours = [(e, when) for e, when in events if e.get("stage") == "ResponseComplete"
            and e.get("userAgent") in agent and e.get("verb") in WRITES]  # fmt: skip
    leases = [(e, when) for e, when in ours if (e.get("objectRef") or {}).get("resource") == "leases"]
    writes = [(e, when) for e, when in ours if (e.get("objectRef") or {}).get("resource") != "leases"]
    by_standby = [(e, when) for e, when in writes if agent[e["userAgent"]] == standby]
    acquired = min((when for e, when in leases if agent[e["userAgent"]] == standby and when >= killed
                    and _code(e) in (200, 201)), default=float("nan"))  # fmt: skip
    first = min((when for _, when in by_standby if when >= acquired), default=float("nan"))
    creators: dict[str, list[str]] = {}
    for e, _ in writes:
        ref = e.get("objectRef") or {}
        pod = str(ref.get("name"))
        if (
            e.get("verb") == "create"
            and ref.get("resource") == "pods"
            and _code(e) == 201
            and (pod.rsplit("-", 1)[0] in statuses)
        ):  # <job>-<rank> of the burst's (not the in-place probe's pod)
            creators.setdefault(pod, []).append(agent[e["userAgent"]])
    by_job: dict[str, set[str]] = {}
    for pod, who in creators.items():
        by_job.setdefault(pod.rsplit("-", 1)[0], set()).update(who)
    return Burst(
        jobs=len(statuses),
        took_over_s=round(first - killed, 2),
        acquired_s=round(acquired - killed, 2),
        succeeded=sum(1 for s in statuses.values() if s.get("phase") == "Succeeded"),
        restarted=sorted(name for name, s in statuses.items() if s.get("restarts")),
        standby_writes=[_said(e, when, killed) for e, when in by_standby if not when >= acquired],
        pods_by_both=sorted(job for job, who in by_job.items() if len(who) > 1),
        created_twice=sorted(p for p, who in creators.items() if len(who) > 1),
    )


def _code(event: dict[str, Any]) -> int:
    return int((event.get("responseStatus") or {}).get("code") or 0)


def _said(event: dict[str, Any], when: float, since: float) -> str:
    ref = event.get("objectRef") or {}
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{when - since:+.2f}s {event.get('verb')} {ref.get('resource')}{sub}/{ref.get('name')} -> {_code(event)}"


def wait_finished(client: Api, names: Sequence[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Each job's status once every one has finished (or ``timeout`` has passed)."""
    deadline = time.monotonic() + timeout
    while True:
        listed = client.get(jobs_path(NAMESPACE))["items"]
        statuses = {j["metadata"]["name"]: j.get("status") or {} for j in listed if j["metadata"]["name"] in names}
        done = [n for n, s in statuses.items() if s.get("phase") in ("Succeeded", "Failed")]
        if len(done) == len(names):
            return statuses
        if time.monotonic() > deadline:
            left = sorted(set(names) - set(done))
            raise RuntimeError(f"{len(left)} of {len(names)} jobs not finished after {timeout:.0f}s: {left[:10]}")
        time.sleep(2.0)


def settled_leader(client: Api, replicas: dict[str, Replica]) -> Replica:
    """The leader, once the standby has run for a while (as it would have on a cluster); returned at a random point
    between two of the leader's renewals."""
    leader = wait_for_leader(client, replicas)
    (standby,) = [r for r in replicas.values() if r is not leader]
    wait_standing_by(standby)
    time.sleep(3.0 + random.uniform(0.0, TIMING["retry-period"]))
    return leader


def replace(replicas: dict[str, Replica], gone: Replica, new: Replica) -> None:
    """The replica that was killed or frozen gives way to a new one, the next standby."""
    del replicas[gone.identity]
    replicas[new.identity] = new


def wait_standing_by(standby: Replica) -> None:
    deadline = time.monotonic() + 60
    while not standby.standing_by():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{standby.identity} did not start within 60 s; its log:\n{standby.process.log_tail()}")
        time.sleep(0.2)


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
    rss = [memory_mib(r.process.pid).get("VmRSS", float("nan")) for r in (leader, standby)]
    return used[leader.identity] / window, used[standby.identity] / window, *rss


def main(argv: Sequence[str] | None = None) -> Figures:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--hangs", type=int, default=5, help="trials of a leader frozen past its lease, then let go")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs held while a standby's cost is measured; 0: none")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the CPU is counted over")
    parser.add_argument("--burst", type=int, default=100, help="jobs of the burst the leader is killed in (0: none)")
    parser.add_argument("--bursts", type=int, default=1, help="how many such bursts")
    parser.add_argument("--burst-seconds", type=int, default=20, help="how long KWOK runs each of their pods")
    args = parser.parse_args(argv)
    with (
        control_plane_with_crd(audit_requests=True, simulated_nodes=4 if args.burst else 0) as (plane, client),
        tempfile.TemporaryDirectory(prefix="ddpjob-takeover-") as tmp,
    ):
        logs = Path(tmp)
        replicas = {f"replica-{i}": Replica(plane.kubeconfig, logs, f"replica-{i}") for i in (0, 1)}
        takeovers: list[float] = []
        try:
            for n in range(args.trials):
                took = trial(client, plane.kubeconfig, logs, replicas, n)
                log(f"trial {n + 1}: leader killed -> the job's first pod {took:.2f}s")
                takeovers.append(took)
            hangs: list[Hang] = []
            for n in range(args.hangs):
                frozen = hang(client, plane, plane.kubeconfig, logs, replicas, n)
                log(f"hang {n + 1}: {frozen}")
                hangs.append(frozen)
            bursts: list[Burst] = []
            for n in range(args.bursts if args.burst else 0):
                done = burst(client, plane, logs, replicas, args.burst, args.burst_seconds, n)
                log(f"burst {n + 1}: {done}")
                bursts.append(done)
            cost = standby_cost(client, replicas, args.jobs, args.window) if args.jobs else (float("nan"),) * 4
        finally:
            for replica in replicas.values():
                replica.process.stop()
    leader_cpu, standby_cpu, leader_rss, standby_rss = cost
    figures = Figures(
        hangs, takeovers, args.jobs, args.window, leader_cpu, standby_cpu, leader_rss, standby_rss, bursts
    )
    report(figures)
    return figures


def report(f: Figures) -> None:
    target = TIMING["lease-duration"] + 2.0
    rows: list[list[Any]] = [
        ["leader SIGKILLed -> a new job's first pod", len(f.takeovers_s), f"{percentile(f.takeovers_s, 50):.1f}",
         f"{percentile(f.takeovers_s, 99):.1f}", f"{max(f.takeovers_s):.1f}", f"<= {target:g}"],
    ] if f.takeovers_s else []  # fmt: skip
    markdown = table(["from -> to", "trials", "median s", "p99 s", "max s", "target s"], rows) if rows else ""
    if f.hangs:
        markdown += "\n\n" + table(
            ["leader frozen s", "frozen -> a new job's first pod s", "writes received after its renew deadline",
             "writes its fence refused", "it exited"],
            [[h.stopped_s, h.took_over_s, len(h.late_writes), h.refused_writes, "yes" if h.exited else "NO"]
             for h in f.hangs],
        )  # fmt: skip
    if f.bursts:
        markdown += "\n\n" + table(
            ["burst jobs", "killed -> Lease taken s", "killed -> its first write s", "Succeeded", "restarted",
             "standby writes before it led", "jobs whose pods both created", "pods created twice"],
            [[b.jobs, b.acquired_s, b.took_over_s, b.succeeded, len(b.restarted), len(b.standby_writes),
              len(b.pods_by_both), len(b.created_twice)] for b in f.bursts],
        )  # fmt: skip
    if f.jobs:
        markdown += "\n\n" + table(
            ["jobs held", "window s", "leader CPU", "standby CPU", "leader RSS MiB", "standby RSS MiB"],
            [[f.jobs, f"{f.window_s:g}", f"{f.leader_cpu_share:.1%}", f"{f.standby_cpu_share:.1%}",
              f"{f.leader_rss_mib:.0f}", f"{f.standby_rss_mib:.0f}"]],
        )  # fmt: skip
    print(markdown.strip())
    write_results(NAME, {"machine": machine(), **asdict(f)}, markdown)


if __name__ == "__main__":
    main()
