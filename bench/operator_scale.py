"""Benchmark 4: the operator at scale, in the box: 1,000 DDPJobs of 4 ranks each.

    python -m bench.operator_scale                      # 1,000 jobs offered at 25 jobs/s
    python -m bench.operator_scale --rate 0             # as fast as the creators can: peak throughput
    python -m bench.operator_scale --jobs 5 --rate 0    # the smoke test's size
    python -m bench.operator_scale --profile            # plus a py-spy profile of the operator

The box's real control plane (etcd, apiserver, controller-manager, scheduler) without its local
node: the operator creates every pod and they stay Pending, so this measures the operator, not pods
running. The operator runs as its own process (``python -m ddpjob_operator operator``), exactly as
deployed, after a warm-up job. Jobs are created through the API at ``--rate`` jobs/s by a few
threads; a watch on pods notes when each job's last pod appears.

Reports: create -> all pods created (from sending the job's POST to the watch event of its last
pod), p50 and p99; jobs/s sustained (jobs done over the time from the first create to the last
job done); the operator's peak RSS (VmHWM) and CPU seconds, from /proc; the apiserver's latency
for mutating requests during the load, from the difference of two scrapes of its /metrics.
Targets: p99 <= 5 s, >= 20 jobs/s, RSS <= 300 MB. These are absolute figures from one run, not
ratios: there is no second implementation to run beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import apiserver
from bench.apiserver import Api
from bench.common import REPO, RESULTS_DIR, log, machine, percentile, publish, stop_on_sigterm, table, verdict
from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.operator_process import OperatorProcess
from ddpjob_box.ports import free_port
from ddpjob_contract.pods import LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY

NAME = "operator_scale"
CRD_FILE = REPO / "helm" / "ddpjob" / "crds" / "ddpjob.yaml"
P99_TARGET_S = 5.0
RATE_TARGET = 20.0
RSS_TARGET_MB = 300.0
RECONCILE = "ddpjob_operator_reconcile_duration_seconds"
TRAINER = {"name": "trainer", "image": "registry.example/ddp-trainer:1", "command": ["python", "-m", "ddp_trainer"]}


def job_body(name: str, replicas: int, gang_scheduling: str = "Auto") -> dict[str, Any]:
    from ddpjob_operator import api

    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "gangScheduling": gang_scheduling,
            "template": {"spec": {"containers": [TRAINER]}},
        },
    }


def jobs_path(namespace: str) -> str:
    from ddpjob_operator import api

    return f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.PLURAL}"


def apply_crd(client: Api) -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    client.create_if_absent(path, crd)

    def established() -> bool:
        status = client.get(f"{path}/{crd['metadata']['name']}").get("status") or {}
        conditions = status.get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    client.wait_for(established, "the DDPJob CRD to be established")
    client.wait_for(lambda: client.get(jobs_path("default")) is not None, "the DDPJob API to be served")


@contextmanager
def control_plane_with_crd(
    *, audit_requests: bool = False, simulated_nodes: int = 0
) -> Iterator[tuple[ControlPlane, Api]]:
    """The box's control plane alone (no node, no Prometheus) in a temporary directory, the DDPJob CRD applied;
    yields the plane and an admin client of its apiserver. ``audit_requests``: its audit log records every
    request of the clients outside the control plane (``ddpjob_box.audit``); ``simulated_nodes``: KWOK nodes that
    run the pods put on them (``ddpjob_box.kwok``)."""
    from ddpjob_box.box import Box

    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-bench-") as tmp,
        Box(
            data_dir=Path(tmp) / "box",
            with_node=False,
            with_prometheus=False,
            audit_requests=audit_requests,
            simulated_nodes=simulated_nodes,
        ) as box,
    ):
        assert box.plane is not None
        client = Api(box.plane.server, box.plane.admin_token, str(box.plane.ca_file))
        apply_crd(client)
        yield box.plane, client


# ---------------------------------------------------------------- watching pods appear


@dataclass
class JobTimes:
    sent: float = 0.0  # when its POST was sent
    created: float = 0.0  # when the POST returned
    pods: set[str] = field(default_factory=set)
    done: float = 0.0  # when the watch delivered its last pod
    first: float = 0.0  # when the watch delivered its first pod


class PodWatch:
    """Notes, from one watch on every DDPJob pod, when each job's ``replicas``-th pod appears.

    The apiserver may end a watch (it drops a watcher that falls behind a burst); the watch then
    resumes from the last resourceVersion it saw, so no event is lost. ``resumed`` counts that.
    """

    def __init__(self, client: Api, replicas: int, *, selector: str = f"{LABEL_MANAGED_BY}={MANAGED_BY}",
                 job_label: str = LABEL_JOB_NAME) -> None:  # fmt: skip
        """``selector`` picks the operator's pods; ``job_label`` names a pod's job (DDPJob's by default)."""
        self.replicas = replicas
        self.jobs: dict[tuple[str, str], JobTimes] = {}
        self.done = threading.Condition()
        self.events = 0
        self.resumed = 0
        self.failed: Exception | None = None
        self._client = client
        self._job_label = job_label
        self._selector = selector
        listed = client.get("/api/v1/pods", labelSelector=self._selector, limit="1")
        self._version = listed["metadata"]["resourceVersion"]
        self._closed = False
        self._stream = self._open()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()

    def _open(self) -> apiserver.WatchStream:
        return self._client.watch("/api/v1/pods", labelSelector=self._selector, resourceVersion=self._version,
                                  allowWatchBookmarks="true")  # fmt: skip

    def job(self, namespace: str, name: str) -> JobTimes:
        with self.done:
            return self.jobs.setdefault((namespace, name), JobTimes())

    def _run(self) -> None:
        try:
            while True:
                self._follow(self._stream)
                if self._closed:
                    return
                self.resumed += 1
                self._stream = self._open()
        except Exception as err:  # handed to the thread that waits
            self.failed = err
            with self.done:
                self.done.notify_all()

    def _follow(self, stream: apiserver.WatchStream) -> None:
        for event in stream:
            now = time.perf_counter()
            if event.get("type") == "ERROR":  # e.g. 410 Gone: events were lost; say so, do not guess
                raise RuntimeError(f"the pod watch failed: {event.get('object')}")
            meta = event["object"]["metadata"]
            self._version = meta["resourceVersion"]
            if event.get("type") != "ADDED":
                continue
            self.events += 1
            with self.done:
                times = self.jobs.setdefault((meta["namespace"], meta["labels"][self._job_label]), JobTimes())
                times.pods.add(meta["name"])
                times.first = times.first or now
                if len(times.pods) >= self.replicas and not times.done:
                    times.done = now
                    self.done.notify_all()

    def wait(self, keys: Sequence[tuple[str, str]], timeout: float) -> int:
        """Wait until every job in ``keys`` is done or ``timeout`` passes; returns how many are done."""
        deadline = time.monotonic() + timeout

        def finished() -> int:
            return sum(1 for k in keys if k in self.jobs and self.jobs[k].done)

        with self.done:
            while (n := finished()) < len(keys) and time.monotonic() < deadline:
                if self.failed is not None:
                    raise RuntimeError(f"the pod watch stopped: {self.failed}") from self.failed
                self.done.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            return n

    def close(self) -> None:
        self._closed = True
        self._stream.close()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------- the operator process


class Operator(OperatorProcess):
    """The operator as deployed: its own process, every namespace, liveness off.

    Its metrics server is on (a free port), only so that we can read its reconcile histogram
    before and after the load: the server thread idles between those two scrapes.
    """

    def __init__(self, kubeconfig: Path, log_path: Path, workers: int = 0) -> None:
        self.metrics_port = free_port()
        super().__init__(kubeconfig, log_path, metrics_port=self.metrics_port, workers=workers)

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"the operator exited {self.proc.returncode}; its log:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def memory_mb(self) -> dict[str, float]:
        """VmHWM (peak resident set) and VmRSS (now), in MiB."""
        return memory_mib(self.pid)

    def reconciles(self) -> apiserver.Histogram:
        """The operator's ``ddpjob_operator_reconcile_duration_seconds`` histogram, now."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return apiserver.histograms(text, RECONCILE).get(("", ""), apiserver.Histogram())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def memory_mib(pid: int) -> dict[str, float]:
    """A process's VmHWM (peak resident set) and VmRSS (now), in MiB, from /proc."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) / 1024
    return out


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy (not idle or waiting for I/O) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


MACHINE = "machine (all processes)"
"""CpuMeter's name for the whole machine's CPU."""


class CpuMeter:
    """CPU seconds used by each named process, and by the whole machine, between two readings."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        out = {MACHINE: machine_cpu_seconds()}
        for name, pid in self.pids.items():
            try:
                out[name] = cpu_seconds(pid)
            except OSError:
                out[name] = float("nan")
        return out

    def used(self) -> dict[str, float]:
        end = self._read()
        return {name: end[name] - self._start[name] for name in end}


class Profiler:
    """py-spy sampling the operator's threads, without pausing it, as collapsed stacks.

    ``--idle`` keeps the samples of threads blocked in a system call (waiting for the apiserver):
    for a process that mostly waits, that is where its wall time goes.
    """

    def __init__(self, pid: int, out: Path, *, idle: bool = True) -> None:
        """``idle`` False: only the samples of the thread holding the GIL (``--gil``): where the process's Python
        CPU time goes. (Without ``--idle`` alone, py-spy still counts threads blocked in an SSL read or a select.)"""
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            raise SystemExit("--profile needs py-spy (in the dev extra): .venv/bin/pip install -e '.[dev]'")
        self.out = out
        which = ["--idle"] if idle else ["--gil"]
        argv = [exe, "record", "--pid", str(pid), "--rate", "100", "--nonblocking", *which, "--format", "raw",
                "-o", str(out)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def collapsed_stacks(collapsed: str) -> Iterator[tuple[str, int]]:
    """Each stack of py-spy's collapsed output (``frame;frame;... count``) with its samples; other lines skipped."""
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack, int(count)


def profile_summary(
    collapsed: str, top: int = 15, within: str = ""
) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's collapsed stacks: samples, and the functions with the largest inclusive and self shares.

    With ``within``, only the stacks that pass through a function of that name count.
    """
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for stack, n in collapsed_stacks(collapsed):
        frames = [_frame_name(f) for f in stack.split(";")]
        if within and not any(f.startswith(within + " ") for f in frames):
            continue
        total += n
        for name in set(frames):
            inclusive[name] += n
        own[frames[-1]] += n
    share = 100.0 / total if total else 0.0
    return (
        total,
        [(name, n * share) for name, n in inclusive.most_common(top)],
        [(name, n * share) for name, n in own.most_common(top)],
    )


def statement_shares(collapsed: str, function: str, source: Path) -> list[tuple[str, float]]:
    """Share of the samples inside ``function`` (a function of ``source``) spent at each of its lines.

    With py-spy's ``--idle`` samples this is where the function's wall time goes, statement by statement;
    each line is labelled with its source text.
    """
    lines = source.read_text().splitlines() if source.exists() else []
    marker = f"{function} ("
    counts: Counter[int] = Counter()
    for stack, samples in collapsed_stacks(collapsed):
        ours = [f for f in stack.split(";") if f.startswith(marker) and f"/{source.name}:" in f]
        if ours:
            counts[int(ours[-1].rsplit(":", 1)[1].rstrip(")"))] += samples
    total = sum(counts.values())

    def label(n: int) -> str:
        text = lines[n - 1].strip() if 0 < n <= len(lines) else "?"
        return f"{source.name}:{n} `{text}`"

    return [(label(n), 100.0 * c / total) for n, c in counts.most_common()] if total else []


def _frame_name(frame: str) -> str:
    """``reconcile (ddpjob_operator/controller.py:45)`` -> ``reconcile (ddpjob_operator/controller.py)``."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})" if where else name


# ---------------------------------------------------------------- the load


def create_jobs(client: Api, watch: PodWatch, namespace: str, names: list[str], replicas: int, rate: float,
                threads: int, gang_scheduling: str = "Auto", *,
                body: Callable[[str], dict[str, Any]] | None = None, path: str = "") -> list[str]:  # fmt: skip
    """Create the jobs at ``rate`` per second (0: as fast as possible) from ``threads`` threads; returns errors.

    DDPJobs, unless ``body`` (a job's body from its name) and ``path`` (where to POST them) say otherwise.
    """
    make = body or (lambda name: job_body(name, replicas, gang_scheduling))
    where = path or jobs_path(namespace)
    errors: list[str] = []
    lock = threading.Lock()
    next_index = iter(range(len(names)))
    start = time.perf_counter() + 0.1

    def work() -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            if rate > 0:
                time.sleep(max(0.0, start + i / rate - time.perf_counter()))
            times = watch.job(namespace, names[i])
            times.sent = time.perf_counter()
            try:
                client.post(where, make(names[i]))
            except (apiserver.ApiError, OSError) as err:
                with lock:
                    errors.append(f"{names[i]}: {err}")
            times.created = time.perf_counter()

    workers = [threading.Thread(target=work, name=f"creator-{n}") for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return errors


def summarize_jobs(jobs: Sequence[JobTimes]) -> dict[str, Any]:
    """Latency and throughput figures from each job's times (pure; the unit of time is the second)."""
    done = [j for j in jobs if j.done]
    latencies = [j.done - j.sent for j in done]
    first_sent = min((j.sent for j in jobs), default=0.0)
    last_sent = max((j.sent for j in jobs), default=0.0)
    last_done = max((j.done for j in done), default=0.0)
    span = last_done - first_sent
    return {
        "jobs": len(jobs),
        "done": len(done),
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "max_s": max(latencies, default=float("nan")),
        "sustained_jobs_per_s": len(done) / span if span > 0 else float("nan"),
        "created_jobs_per_s": (len(jobs) - 1) / (last_sent - first_sent) if last_sent > first_sent else float("nan"),
        "post_p50_ms": 1000 * percentile([j.created - j.sent for j in jobs], 50),
        "post_p99_ms": 1000 * percentile([j.created - j.sent for j in jobs], 99),
        "span_s": span,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=4, help="ranks (pods) per job")
    parser.add_argument("--rate", type=float, default=25.0, help="jobs offered per second; 0: as fast as possible")
    parser.add_argument("--creators", type=int, default=8, help="threads creating jobs")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on jobs not done this long after")
    parser.add_argument("--profile", action="store_true", help="record the operator with py-spy during the load")
    parser.add_argument(
        "--workers", type=int, default=0,
        help="the operator's --workers (reconciles in flight at once); 0: its default",
    )  # fmt: skip
    parser.add_argument(
        "--gang-scheduling", default="Auto", choices=["Auto", "Disabled"],
        help="the jobs' spec.gangScheduling: Auto makes one PodGroup per job (the box serves them)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)

    offered = f"offered at {args.rate:g} jobs/s" if args.rate else "created as fast as possible"
    log(f"{NAME}: {args.jobs} jobs x {args.replicas} ranks, {offered}, gangScheduling {args.gang_scheduling}")
    with control_plane_with_crd() as (plane, client):
        for ns in ("bench-warmup", "bench-scale"):
            client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": ns}})
        args.out.mkdir(parents=True, exist_ok=True)
        op = Operator(plane.kubeconfig, args.out / f"{NAME}.operator.log", args.workers)
        watch = PodWatch(client, args.replicas)
        try:
            started = time.monotonic()
            client.post(jobs_path("bench-warmup"), job_body("warmup", args.replicas, args.gang_scheduling))
            if watch.wait([("bench-warmup", "warmup")], 60) != 1:
                op.check_alive()
                raise RuntimeError(f"the operator did not create the warm-up job's pods:\n{op.log_tail()}")
            log(f"  operator up and warm in {time.monotonic() - started:.1f}s")

            before = apiserver.request_durations(client.raw("GET", "/metrics").decode())
            cpu_before = op.cpu_seconds()
            pids = {c.name: c.pid for c in plane.components if c.pid is not None}
            meter = CpuMeter({**pids, "operator": op.pid, "this benchmark (load + watch)": os.getpid()})
            load_before = os.getloadavg()[0]
            reconciles_before = op.reconciles()
            profiler = Profiler(op.pid, args.out / f"{NAME}.pyspy.txt") if args.profile else None
            names = [f"j{i:05d}" for i in range(args.jobs)]
            wall = time.perf_counter()
            create_errors = create_jobs(client, watch, "bench-scale", names, args.replicas, args.rate, args.creators,
                                        args.gang_scheduling)  # fmt: skip
            log(f"  {args.jobs} creates sent in {time.perf_counter() - wall:.1f}s ({len(create_errors)} errors)")
            done = watch.wait([("bench-scale", n) for n in names], args.timeout)
            wall = time.perf_counter() - wall
            if profiler:
                profiler.stop()
            cpu = op.cpu_seconds()
            cpu_by_process = meter.used()
            memory = op.memory_mb()
            load_after = os.getloadavg()[0]
            reconciles = op.reconciles().minus(reconciles_before)
            after = apiserver.request_durations(client.raw("GET", "/metrics").decode())
            op.check_alive()
            log(f"  {done}/{args.jobs} jobs have all their pods after {wall:.1f}s")
        finally:
            watch.close()
            op.stop()
        jobs = [watch.jobs[("bench-scale", n)] for n in names]
        operator_errors = op.errors()

    figures = summarize_jobs(jobs)
    figures |= {
        "operator_cpu_s": cpu - cpu_before,
        "operator_cpu_s_total": cpu,
        "operator_peak_rss_mb": memory.get("VmHWM", float("nan")),
        "operator_rss_end_mb": memory.get("VmRSS", float("nan")),
        "wall_s": wall,
        "load_average_1m": [round(load_before, 2), round(load_after, 2)],
        "pod_watch_resumed": watch.resumed,
        "cpu_seconds_by_process": cpu_by_process,
        "reconciles": reconciles.count,
        "reconcile_mean_s": reconciles.mean,
        "reconcile_p50_s": reconciles.quantile(0.5),
        "reconcile_p99_s": reconciles.quantile(0.99),
        "reconciles_in_flight": reconciles.total / wall if wall > 0 else float("nan"),
        "create_errors": create_errors[:20],
        "operator_error_lines": operator_errors[:20],
    }
    during = apiserver.difference(after, before)
    verbs = apiserver.by_verb(during)
    markdown = report(args, figures, verbs, during)
    if args.profile:
        markdown += "\n\n" + profile_report(args.out / f"{NAME}.pyspy.txt")
    data = {"name": NAME, "machine": machine(), "settings": vars(args) | {"out": str(args.out)}, "figures": figures,
            "apiserver_mutating": {v: _hist(h) for v, h in verbs.items()},
            "apiserver_by_resource": {f"{v} {r}": _hist(h) for (v, r), h in during.items()
                                      if v in apiserver.MUTATING and h.count > 0}}  # fmt: skip
    return publish(NAME, data, markdown, args.out, targets(figures))


def targets(f: dict[str, Any]) -> list[tuple[str, float, str, str]]:
    return [
        ("create -> all pods created, p99 (s)", f["p99_s"], f"<= {P99_TARGET_S:g}",
         verdict(f["p99_s"], P99_TARGET_S, at_most=True)),
        ("jobs/s sustained", f["sustained_jobs_per_s"], f">= {RATE_TARGET:g}",
         verdict(f["sustained_jobs_per_s"], RATE_TARGET)),
        ("operator peak RSS (MiB)", f["operator_peak_rss_mb"], f"<= {RSS_TARGET_MB:g}",
         verdict(f["operator_peak_rss_mb"], RSS_TARGET_MB, at_most=True)),
    ]  # fmt: skip


def _hist(h: apiserver.Histogram) -> dict[str, float]:
    return {"count": h.count, "p50_s": h.quantile(0.5), "p99_s": h.quantile(0.99), "mean_s": h.mean}


def report(
    args: argparse.Namespace,
    f: dict[str, Any],
    verbs: dict[str, apiserver.Histogram],
    during: dict[tuple[str, str], apiserver.Histogram],
) -> str:
    offered = f"{args.rate:g} jobs/s offered" if args.rate else "created as fast as possible"
    if args.workers:
        offered += f", operator with --workers {args.workers}"
    rows = [
        ["jobs with all pods created", f"{f['done']} / {f['jobs']}", "", ""],
        ["create -> all pods created, p50", f"{f['p50_s']:.2f} s", "", ""],
        *[[name, f"{value:.2f}", target, v] for name, value, target, v in targets(f)[:2]],
        ["create -> all pods created, max", f"{f['max_s']:.2f} s", "", ""],
        ["jobs/s created (achieved by the load generator)", f"{f['created_jobs_per_s']:.1f}", "", ""],
        ["job POST, p50 / p99 (client side)", f"{f['post_p50_ms']:.0f} / {f['post_p99_ms']:.0f} ms", "", ""],
        [targets(f)[2][0], f"{f['operator_peak_rss_mb']:.0f}", targets(f)[2][2], targets(f)[2][3]],
        ["operator CPU seconds, load / since start", f"{f['operator_cpu_s']:.1f} / {f['operator_cpu_s_total']:.1f}",
         "", ""],
        ["operator CPU use during the load", f"{f['operator_cpu_s'] / f['wall_s']:.2f} cores", "", ""],
        ["operator reconciles, per job", f"{f['reconciles']:.0f}, {f['reconciles'] / max(1, f['jobs']):.1f}", "", ""],
        ["reconcile duration, mean / p50 / p99",
         f"{_ms(f['reconcile_mean_s'])} / {_ms(f['reconcile_p50_s'])} / {_ms(f['reconcile_p99_s'])} ms", "", ""],
        ["reconciles in flight on average (time in reconcile / wall)", f"{f['reconciles_in_flight']:.1f}", "", ""],
        ["machine load average (1 min) at the start / end of the load", " / ".join(map(str, f["load_average_1m"])),
         "", ""],
        ["operator log lines with ERROR or Traceback", str(len(f["operator_error_lines"])), "", ""],
        ["times the apiserver ended the bench's pod watch (resumed, no event lost)", str(f["pod_watch_resumed"]),
         "", ""],
    ]  # fmt: skip
    verb_rows = [[v, f"{h.count:.0f}", _ms(h.quantile(0.5)), _ms(h.quantile(0.99)), _ms(h.mean)]
                 for v, h in sorted(verbs.items())]  # fmt: skip
    busiest = sorted(((k, h) for k, h in during.items() if k[0] in apiserver.MUTATING and h.count > 0),
                     key=lambda kh: -kh[1].count)[:8]  # fmt: skip
    resource_rows = [[f"{v} {r}", f"{h.count:.0f}", _ms(h.quantile(0.5)), _ms(h.quantile(0.99)), _ms(h.mean)]
                     for (v, r), h in busiest]  # fmt: skip
    columns = ["requests", "p50 ms", "p99 ms", "mean ms"]
    cores = os.cpu_count() or 1
    cpu = f["cpu_seconds_by_process"]
    cpu_rows = [[name, f"{used:.1f}", f"{used / max(1, f['done']) * 1000:.1f}", f"{used / f['wall_s']:.2f}"]
                for name, used in sorted(cpu.items(), key=lambda kv: -kv[1])]  # fmt: skip
    return "\n".join([
        f"### Operator at scale ({f['jobs']} DDPJobs x {args.replicas} ranks, {offered}, box control plane "
        "without a node)",
        "",
        table(["figure", "value", "target", ""], rows),
        "",
        "Apiserver latency of mutating requests during the load (`apiserver_request_duration_seconds`; "
        "quantiles interpolated within its buckets, as `histogram_quantile` does):",
        "",
        table(["verb", *columns], verb_rows),
        "",
        table(["busiest (verb resource)", *columns], resource_rows),
        "",
        f"CPU used during the load, by process (from /proc; the machine has {cores} cores, so it can give at most "
        f"{cores} core-seconds per second):",
        "",
        table(["process", "CPU seconds", "CPU ms per job", "cores, on average"], cpu_rows),
    ])  # fmt: skip


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def profile_report(path: Path) -> str:
    if not path.exists():
        return "(py-spy wrote no profile)"
    text = path.read_text()
    total, _, own = profile_summary(text, top=8, within="reconcile")
    everything, _, _ = profile_summary(text)
    controller = REPO / "operator" / "ddpjob_operator" / "controller.py"
    statements = [[where, f"{share:.1f}%"] for where, share in statement_shares(text, "_reconcile", controller)[:10]]
    self_rows = [[name, f"{share:.1f}%"] for name, share in own]
    return "\n".join([
        f"Where the reconciles' wall time goes (py-spy at 100 Hz with `--idle` during the load: {total} samples "
        f"inside `reconcile` out of {everything} from all threads, blocked ones included), by statement of "
        "`_reconcile`, then by innermost function:",
        "",
        table(["statement", "share of reconcile samples"], statements),
        "",
        table(["function (self)", "share of reconcile samples"], self_rows),
    ])  # fmt: skip


if __name__ == "__main__":
    stop_on_sigterm()
    main()
