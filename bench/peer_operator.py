"""DDPJob's operator against Kubeflow's training-operator, side by side on one box, under the same load.

    python -m bench.peer_operator                                  # 500 jobs x 4 pods, 3 alternating pairs, + Disabled
    python -m bench.peer_operator --jobs 50 --pairs 1 --disabled-runs 0   # a short run
    python -m bench.peer_operator --profile                        # + one DDPJob run under py-spy (the dev extra)
    python -m bench.peer_operator --apiserver-profile              # + the apiserver's CPU profile of each load (pprof)

The box's control plane without a node (``ddpjob cluster up --no-node``; pods stay Pending), its apiserver
auditing every request of the clients outside the control plane. training-operator v1.9.3 (tools/training-operator,
built from the Go module proxy into the binary cache on first use; its PyTorchJob CRD from the same module) runs
as ``--enable-scheme=pytorchjob --controller-threads=16 --kube-api-qps=1000 --kube-api-burst=2000``; our operator
runs with its defaults. A DDPJob is 4 ranks with ``gangScheduling: Auto`` (one PodGroup each), a PyTorchJob is
1 Master + 3 Workers. Each run: a fresh namespace, the operator started and warmed up with one job, then
``--jobs`` jobs created as fast as 8 threads can, until each has all its pods; then the operator stops and the
namespace is deleted before the next run. The pairs alternate which operator runs first.

Reports per run: jobs/s (all pods of all jobs created over the time since the first create), create -> all pods
created p50 and p99, the operator's CPU per job and peak RSS (VmHWM) from /proc, the machine's CPU per job, and
from the audit log the operator's requests per job by verb and resource; then the ratios of each pair.
training-operator's validating webhook is not registered: a box without a node cannot route the apiserver to it.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from bench import apiserver, go_profile, operator_scale
from bench.apiserver import Api, ApiError
from bench.common import RESULTS_DIR, log, machine, publish, stop_on_sigterm, table
from bench.operator_scale import MACHINE, CpuMeter, Operator, PodWatch, Profiler, create_jobs, summarize_jobs
from ddpjob_box import audit, toolchain
from ddpjob_box.ports import free_port
from ddpjob_box.processes import spawn, tail
from ddpjob_contract.pods import LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY

NAME = "peer_operator"
REPLICAS = 4
ADMIN = "box-admin"
"""The user both operators and the load generator run as; the user agent tells the load generator apart."""
TO_NAMESPACE = "kubeflow"
TO_SECRET = "training-operator-webhook-cert"
TO_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
"""Where training-operator reads its webhook certificate (fixed in its code; a Secret volume in a cluster)."""
TO_FLAGS = ["--enable-scheme=pytorchjob", "--controller-threads=16", "--kube-api-qps=1000", "--kube-api-burst=2000"]
PYTORCH = {"name": "pytorch", "image": "registry.example/ddp-trainer:1", "command": ["python", "-m", "ddp_trainer"]}
TARGETS = {"jobs_per_s": 1.3, "p99_s": 0.5, "cpu_ms_per_job": 10.0}


class Running(Protocol):
    @property
    def pid(self) -> int: ...

    def check_alive(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Peer:
    """One operator under test: how to start it, what its jobs look like, how its pods are labelled."""

    name: str
    path: Callable[[str], str]
    body: Callable[[str], dict[str, Any]]
    selector: str
    job_label: str
    start: Callable[[Path, Path], Running]


# ---------------------------------------------------------------- DDPJob


def ddpjob(gang_scheduling: str) -> Peer:
    return Peer(
        name="DDPJob" if gang_scheduling == "Auto" else f"DDPJob, gangScheduling {gang_scheduling}",
        path=operator_scale.jobs_path,
        body=lambda name: operator_scale.job_body(name, REPLICAS, gang_scheduling),
        selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
        job_label=LABEL_JOB_NAME,
        start=lambda kubeconfig, log_path: Operator(kubeconfig, log_path),
    )


# ---------------------------------------------------------------- training-operator


TO_CRD = "kubeflow.org_pytorchjobs.yaml"


def pytorchjobs_path(namespace: str) -> str:
    return f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs"


def pytorchjob_body(name: str) -> dict[str, Any]:
    """1 Master + 3 Workers: 4 pods, as a DDPJob of 4 ranks."""

    def replicas(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [PYTORCH]}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(REPLICAS - 1)}}}  # fmt: skip


class TrainingOperator:
    """training-operator as its own process, with the admin's kubeconfig; its webhook certificate is copied from
    the Secret its cert rotator fills to the directory it reads, as a Secret volume would."""

    def __init__(self, client: Api, kubeconfig: Path, log_path: Path, flags: Sequence[str] = ()) -> None:
        binary = toolchain.ensure(toolchain.training_operator_build())["training-operator"]
        self.log_path = log_path
        ports = [f"--metrics-bind-address=127.0.0.1:{free_port()}",
                 f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                 f"--webhook-server-port={free_port()}"]  # fmt: skip
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), MY_POD_NAMESPACE=TO_NAMESPACE)
        with open(log_path, "wb") as out:
            self.proc = spawn([str(binary), *TO_FLAGS, *flags, *ports], stdout=out, stderr=subprocess.STDOUT, env=env)
        self._mount_certificate(client)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _mount_certificate(self, client: Api, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        path = f"/api/v1/namespaces/{TO_NAMESPACE}/secrets/{TO_SECRET}"
        while time.monotonic() < deadline:
            self.check_alive()
            data = client.get(path).get("data") or {}
            if "tls.crt" in data and "tls.key" in data:
                TO_CERT_DIR.mkdir(parents=True, exist_ok=True)
                for key in ("tls.crt", "tls.key", "ca.crt"):
                    if key in data:
                        (TO_CERT_DIR / key).write_bytes(base64.b64decode(data[key]))
                return
            time.sleep(0.5)
        raise RuntimeError(f"training-operator did not write its webhook certificate:\n{tail(self.log_path, 30)}")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"training-operator exited {self.proc.returncode}:\n{tail(self.log_path, 30)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def training_operator(client: Api) -> Peer:
    return Peer(
        name="training-operator",
        path=pytorchjobs_path,
        body=pytorchjob_body,
        selector="training.kubeflow.org/operator-name=pytorchjob-controller",
        job_label="training.kubeflow.org/job-name",
        start=lambda kubeconfig, log_path: TrainingOperator(client, kubeconfig, log_path),
    )


def install_training_operator(client: Api) -> None:
    """Its PyTorchJob CRD from the module it is built from, its namespace and the (empty) Secret its cert rotator
    fills."""
    version = toolchain.training_operator_version()
    source = toolchain.go_module_dir("training-operator", toolchain.TRAINING_OPERATOR_MODULE, version)
    crd = yaml.safe_load((source / "manifests" / "base" / "crds" / TO_CRD).read_text())
    apply_crd(client, crd, pytorchjobs_path("default"))
    client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": TO_NAMESPACE}})
    client.create_if_absent(f"/api/v1/namespaces/{TO_NAMESPACE}/secrets",
                            {"metadata": {"name": TO_SECRET}, "type": "Opaque"})  # fmt: skip


def apply_crd(client: Api, crd: Mapping[str, Any], served: str) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    client.create_if_absent(path, crd)

    def established() -> bool:
        status = client.get(f"{path}/{crd['metadata']['name']}").get("status") or {}
        return any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or [])

    client.wait_for(established, f"the CRD {crd['metadata']['name']} to be established")
    client.wait_for(lambda: client.get(served) is not None, f"{served} to be served")


# ---------------------------------------------------------------- one run


def delete_namespace(client: Api, namespace: str, timeout: float = 600.0) -> None:
    try:
        client.request("DELETE", f"/api/v1/namespaces/{namespace}")
    except ApiError as err:
        if err.status != 404:
            raise

    def gone() -> bool:
        try:
            client.get(f"/api/v1/namespaces/{namespace}")
        except ApiError as err:
            return err.status == 404
        return False

    deadline = time.monotonic() + timeout
    while not gone():
        if time.monotonic() > deadline:
            raise RuntimeError(f"namespace {namespace} still there after {timeout:.0f}s")
        time.sleep(1.0)


def run_once(box: Any, client: Api, peer: Peer, index: int, args: argparse.Namespace,
             profile: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """One operator under the load in fresh namespaces, then stopped and its namespaces deleted."""
    plane = box.plane
    tag = f"{index}-{peer.name.split(',')[0].lower()}"
    warm, ns = f"peer-warm-{tag}", f"peer-load-{tag}"
    for name in (warm, ns):
        client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": name}})
    watch = PodWatch(client, REPLICAS, selector=peer.selector, job_label=peer.job_label)
    op = peer.start(plane.kubeconfig, args.out / f"{NAME}.{tag}.log")
    try:
        started = time.monotonic()
        client.post(peer.path(warm), peer.body("warmup"))
        if watch.wait([(warm, "warmup")], 120) != 1:
            op.check_alive()
            raise RuntimeError(f"{peer.name} did not create the warm-up job's pods")
        time.sleep(args.settle)
        log(f"  {peer.name}: up and warm in {time.monotonic() - started:.1f}s")
        pids = {c.name: c.pid for c in plane.components if c.pid is not None}
        meter = CpuMeter({**pids, "operator": op.pid})
        reconciles = op.reconciles() if isinstance(op, Operator) else None
        before = apiserver.request_durations(client.raw("GET", "/metrics").decode())
        since = time.time()
        profiler = Profiler(op.pid, profile, idle=False) if profile else None
        pprof = (go_profile.CpuProfile(lambda path: client.raw("GET", path), args.out, f"{NAME}.{tag}.apiserver")
                 if args.apiserver_profile else None)  # fmt: skip
        names = [f"j{i:05d}" for i in range(args.jobs)]
        wall = time.perf_counter()
        errors = create_jobs(client, watch, ns, names, REPLICAS, 0, args.creators, body=peer.body, path=peer.path(ns))
        done = watch.wait([(ns, n) for n in names], args.timeout)
        wall = time.perf_counter() - wall
        time.sleep(args.settle)  # the writes that trail the last pod (status, Events) belong to the load too
        if profiler:
            profiler.stop()
        slices = pprof.stop() if pprof else []
        cpu = meter.used()
        rss = operator_scale.memory_mib(op.pid).get("VmHWM", float("nan"))
        reconciled = op.reconciles().minus(reconciles).count if isinstance(op, Operator) and reconciles else None
        after = apiserver.request_durations(client.raw("GET", "/metrics").decode())
        op.check_alive()
    finally:
        watch.close()
        op.stop()
    requests = audit.requests(plane.audit_log, since=since, user=ADMIN, skip_agents=(apiserver.USER_AGENT,))
    everyone = {k: h.count for k, h in apiserver.difference(after, before).items() if h.count > 0}
    figures = summarize_jobs([watch.jobs[(ns, n)] for n in names])
    log(f"  {peer.name}: {done}/{args.jobs} jobs with all pods in {wall:.1f}s, "
        f"{figures['sustained_jobs_per_s']:.1f} jobs/s, p99 {figures['p99_s']:.2f}s, "
        f"operator {1000 * cpu['operator'] / max(1, done):.1f} CPU-ms/job, {len(errors)} create errors"
        + ("" if reconciled is None else f", {reconciled / max(1, done):.1f} reconciles/job"))  # fmt: skip
    for name in (ns, warm):
        delete_namespace(client, name)
    return figures | {
        "operator": peer.name,
        "wall_s": wall,
        "create_errors": errors[:10],
        "cpu_s": cpu,
        "operator_cpu_ms_per_job": 1000 * cpu["operator"] / max(1, figures["done"]),
        "machine_cpu_ms_per_job": 1000 * cpu[MACHINE] / max(1, figures["done"]),
        "operator_peak_rss_mb": rss,
        "reconciles_per_job": None if reconciled is None else reconciled / max(1, figures["done"]),
        "apiserver_profile": [str(p) for p in slices],
        "operator_requests": {f"{v} {r}": n for (v, r), n in sorted(requests.items())},
        "all_requests": {f"{v} {r}": n for (v, r), n in sorted(everyone.items())},
    }


def run_backlog(box: Any, client: Api, peer: Peer, index: int, args: argparse.Namespace) -> dict[str, Any]:
    """The backlog variant (``--backlog``): every job created while the operator is stopped, then the operator
    started; from its start to the last job's last pod. This measures the operator's own rate, not the client's."""
    tag = f"{index}-{peer.name.split(',')[0].lower()}"
    ns = f"peer-backlog-{tag}"
    client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": ns}})
    watch = PodWatch(client, REPLICAS, selector=peer.selector, job_label=peer.job_label)
    names = [f"j{i:05d}" for i in range(args.jobs)]
    try:
        errors = create_jobs(client, watch, ns, names, REPLICAS, 0, args.creators, body=peer.body, path=peer.path(ns))
        started = time.perf_counter()
        op = peer.start(box.plane.kubeconfig, args.out / f"{NAME}.{tag}.backlog.log")
        try:
            done = watch.wait([(ns, n) for n in names], args.timeout)
            op.check_alive()
        finally:
            op.stop()
        last = max((t.done for n in names if (t := watch.jobs[(ns, n)]).done), default=started)
    finally:
        watch.close()
    seconds = last - started
    log(f"  {peer.name}: a backlog of {args.jobs} jobs, {done} with all pods {seconds:.1f}s after its start, "
        f"{len(errors)} create errors")  # fmt: skip
    delete_namespace(client, ns)
    return {"operator": peer.name, "jobs": args.jobs, "done": done, "create_errors": errors[:10], "seconds": seconds,
            "jobs_per_s": done / seconds if seconds > 0 else float("nan")}  # fmt: skip


def backlog_report(runs: Mapping[str, list[dict[str, Any]]], ours: str, theirs: str, args: argparse.Namespace) -> str:
    median, low, high = ratio_spread([r["jobs_per_s"] for r in runs[ours]], [r["jobs_per_s"] for r in runs[theirs]])
    rows = [[n, ", ".join(f"{r['seconds']:.1f}" for r in runs[n]), ", ".join(f"{r['jobs_per_s']:.1f}" for r in runs[n])]
            for n in (ours, theirs)]  # fmt: skip
    return "\n".join([
        f"### A backlog: {args.jobs} jobs x {REPLICAS} pods created while the operator is stopped, then it starts "
        f"({args.pairs} alternating pairs; box control plane without a node)",
        "",
        table(["operator", "its start -> every job's pods (s)", "jobs/s"], rows),
        "",
        f"{ours} / {theirs}, jobs/s, median of pairs: {median:.2f}x ({low:.2f}-{high:.2f}); target >= 1.5x: "
        f"{_met(median >= 1.5)}",
    ])  # fmt: skip


# ---------------------------------------------------------------- figures (pure)


def per_job(counts: Mapping[str, float], jobs: int, *, long_running: bool = False) -> dict[str, float]:
    """Requests per job by "verb resource"; watches (long-running, not per job) left out unless asked."""
    return {k: n / max(1, jobs) for k, n in counts.items() if long_running or not k.startswith(("watch ", "WATCH "))}


def ratio_spread(ours: Sequence[float], theirs: Sequence[float]) -> tuple[float, float, float]:
    """Median, min and max of the pairs' ratios ours_i / theirs_i."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b]
    if not ratios:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(ratios), min(ratios), max(ratios)


FIGURES: list[tuple[str, str, str]] = [
    ("jobs/s (all 4 pods created)", "sustained_jobs_per_s", "{:.1f}"),
    ("create -> all 4 pods, p50 (s)", "p50_s", "{:.2f}"),
    ("create -> all 4 pods, p99 (s)", "p99_s", "{:.2f}"),
    ("operator CPU per job (ms)", "operator_cpu_ms_per_job", "{:.1f}"),
    ("operator peak RSS (MiB)", "operator_peak_rss_mb", "{:.0f}"),
    ("machine CPU per job (ms, all processes)", "machine_cpu_ms_per_job", "{:.0f}"),
    ("operator requests per job (audit log)", "operator_requests_per_job", "{:.1f}"),
    ("apiserver requests per job, every client but watches (its metrics)", "all_requests_per_job", "{:.1f}"),
]


def with_totals(run: dict[str, Any]) -> dict[str, Any]:
    jobs = run["done"]
    return run | {
        "operator_requests_per_job": sum(per_job(run["operator_requests"], jobs).values()),
        "all_requests_per_job": sum(per_job(run["all_requests"], jobs).values()),
    }


def report(runs: Mapping[str, list[dict[str, Any]]], ours: str, theirs: str, args: argparse.Namespace) -> str:
    names = list(runs)
    rows = []
    for label, key, fmt in FIGURES:
        cells = [", ".join(fmt.format(r[key]) for r in runs[n]) for n in names]
        median, low, high = ratio_spread([r[key] for r in runs[ours]], [r[key] for r in runs[theirs]])
        rows.append([label, *cells, f"{median:.2f}x ({low:.2f}-{high:.2f})"])
    verbs = sorted({k for rs in runs.values() for r in rs for k in per_job(r["operator_requests"], r["done"])})
    request_rows = [
        [k, *(f"{statistics.median(per_job(r['operator_requests'], r['done']).get(k, 0.0) for r in runs[n]):.2f}"
              for n in names)]
        for k in verbs
    ]  # fmt: skip
    m_ours = {k: statistics.median(r[k] for r in runs[ours]) for _, k, _ in FIGURES}
    m_theirs = {k: statistics.median(r[k] for r in runs[theirs]) for _, k, _ in FIGURES}
    jobs_ratio = ratio_spread([r["sustained_jobs_per_s"] for r in runs[ours]],
                              [r["sustained_jobs_per_s"] for r in runs[theirs]])[0]  # fmt: skip
    p99_ratio = ratio_spread([r["p99_s"] for r in runs[ours]], [r["p99_s"] for r in runs[theirs]])[0]
    targets = [
        ["throughput ratio", f"{jobs_ratio:.2f}x", f">= {TARGETS['jobs_per_s']}x", _met(jobs_ratio >= 1.3)],
        ["p99 ratio", f"{p99_ratio:.2f}x", f"<= {TARGETS['p99_s']}x", _met(p99_ratio <= 0.5)],
        ["operator CPU per job, median", f"{m_ours['operator_cpu_ms_per_job']:.1f} ms", "<= 10 ms",
         _met(m_ours["operator_cpu_ms_per_job"] <= 10.0)],
        ["operator requests per job, median", f"{m_ours['operator_requests_per_job']:.1f} vs "
         f"{m_theirs['operator_requests_per_job']:.1f}", "<= training-operator's",
         _met(m_ours["operator_requests_per_job"] <= m_theirs["operator_requests_per_job"])],
    ]  # fmt: skip
    by_process = {n: cpu_by_process(runs[n]) for n in names}
    processes = list(dict.fromkeys(k for n in names for k in by_process[n]))
    cpu_rows = [[k, *(f"{by_process[n].get(k, 0.0):.1f}" for n in names)] for k in processes]
    return "\n".join([
        f"### {ours} against {theirs} ({args.jobs} jobs x {REPLICAS} pods, created as fast as {args.creators} "
        f"threads can, {args.pairs} alternating pairs; box control plane without a node)",
        "",
        table(["figure", *names, f"{ours} / {theirs}, median of pairs (range)"], rows),
        "",
        table(["target", "measured", "target", ""], targets),
        "",
        "The operator's requests per job, by verb and resource (the audit log; median over its runs; "
        "watches left out):",
        "",
        table(["verb resource", *names], request_rows),
        "",
        "Where the machine's CPU per job went, by process (CPU-ms per job from /proc; median over its runs):",
        "",
        table(["process", *names], cpu_rows),
    ])  # fmt: skip


def cpu_by_process(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The median over ``runs`` of each process's CPU-ms per job (``cpu_s``: the operator, the control plane's
    components), and of the rest of the machine (the benchmark's own client, the kernel, other tenants)."""
    per_run = []
    for run in runs:
        cpu, jobs = run["cpu_s"], max(1, run["done"])
        named = {k: 1000 * v / jobs for k, v in cpu.items() if k != MACHINE}
        per_run.append(named | {"the rest of the machine": 1000 * cpu[MACHINE] / jobs - sum(named.values())})
    keys = list(dict.fromkeys(k for run in per_run for k in run))
    return {k: statistics.median(run.get(k, 0.0) for run in per_run) for k in keys}


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500, help="jobs per run")
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs of runs")
    parser.add_argument("--disabled-runs", type=int, default=1,
                        help="runs of DDPJob with gangScheduling Disabled, after the pairs")  # fmt: skip
    parser.add_argument("--creators", type=int, default=8, help="threads creating jobs")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the warm-up and after the load")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on jobs not done this long after")
    parser.add_argument("--profile", action="store_true", help="one more DDPJob run, under py-spy (--gil)")
    parser.add_argument("--apiserver-profile", action="store_true",
                        help="the apiserver's CPU profile (pprof) in each load; its top in the report")  # fmt: skip
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="only the backlog variant: the jobs created while the operator is stopped, then it starts",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON, markdown and logs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from ddpjob_box.box import Box

    toolchain.ensure(toolchain.training_operator_build())  # before the box: a cold build takes minutes
    log(f"{NAME}: {args.jobs} jobs x {REPLICAS} pods, {args.pairs} pairs, {args.disabled_runs} Disabled runs")
    ours, disabled = ddpjob("Auto"), ddpjob("Disabled")
    runs: dict[str, list[dict[str, Any]]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-bench-") as tmp,
        Box(data_dir=Path(tmp) / "box", with_node=False, with_prometheus=False, audit_requests=True) as box,
    ):
        client = Api(box.plane.server, box.plane.admin_token, str(box.plane.ca_file))  # type: ignore[union-attr]
        operator_scale.apply_crd(client)
        install_training_operator(client)
        theirs = training_operator(client)
        order = 0
        if args.backlog:
            for pair in range(args.pairs):
                for peer in (ours, theirs) if pair % 2 == 0 else (theirs, ours):
                    order += 1
                    runs.setdefault(peer.name, []).append(run_backlog(box, client, peer, order, args))
            markdown = backlog_report(runs, ours.name, theirs.name, args)
            data = {"name": NAME, "machine": machine(), "settings": vars(args) | {"out": str(args.out)}, "runs": runs}
            return publish(f"{NAME}_backlog", data, markdown, args.out, [])
        for pair in range(args.pairs):
            for peer in (ours, theirs) if pair % 2 == 0 else (theirs, ours):
                order += 1
                runs.setdefault(peer.name, []).append(with_totals(run_once(box, client, peer, order, args)))
        for _ in range(args.disabled_runs):
            order += 1
            runs.setdefault(disabled.name, []).append(with_totals(run_once(box, client, disabled, order, args)))
        profile = None
        if args.profile:
            order += 1
            profile = args.out / f"{NAME}.pyspy.txt"
            runs.setdefault("DDPJob under py-spy", []).append(
                with_totals(run_once(box, client, ours, order, args, profile=profile)))  # fmt: skip
    markdown = report(runs, ours.name, theirs.name, args) if runs.get(ours.name) and runs.get(theirs.name) else ""
    if profile is not None:
        markdown += "\n\n" + profile_report(profile)
    if args.apiserver_profile:
        markdown += "\n\n" + apiserver_profile_report(runs)
    data = {"name": NAME, "machine": machine(), "settings": vars(args) | {"out": str(args.out)}, "runs": runs}
    return publish(NAME, data, markdown, args.out, [])


def apiserver_profile_report(runs: Mapping[str, list[dict[str, Any]]]) -> str:
    """Per operator, the apiserver's profile over the loads of all its runs, merged: its top functions."""
    parts = []
    for name, its_runs in runs.items():
        slices = [Path(p) for run in its_runs for p in run.get("apiserver_profile", [])]
        if slices:
            jobs = sum(run["done"] for run in its_runs)
            parts.append(f"### The apiserver under {name} ({jobs} jobs, {len(slices)} slices of "
                         f"{go_profile.SLICE_S} s)\n\n```\n{go_profile.top(slices)}\n"
                         f"{go_profile.top(slices, cumulative=True)}```")  # fmt: skip
    return "\n\n".join(parts)


AREAS: list[tuple[str, tuple[str, ...]]] = [
    (
        "Kopf's per-event work (its watch, a worker per object, causes, the handler's call)",
        ("kopf/_core/reactor/queueing.py", "kopf/_core/reactor/processing.py", "kopf/_cogs/clients/watching.py"),
    ),
    ("creating pods (POST; the create pool)", ("_create_pods.<locals>.create",)),
    ("Events (POST; the event pool)", ("_post_events",)),
    ("status writes (PUT)", ("_write_status",)),
    # the Service and the PodGroup are made on the create pool since 0325906
    (
        "the rest of each reconcile (plan, Service, PodGroup)",
        ("Controller.reconcile", "Controller._create_before_pods"),
    ),
    # one loop for both since listwatch.ListWatch (its frames do not say which); before it, PodCache's and JobWatch's
    ("the watches, pods and DDPJobs (read, decode, slim, wake)", ("ListWatch._run", "PodCache._run", "JobWatch._run")),
    ("the event loop (work queue, wake-ups)", ("BaseEventLoop.run_forever",)),
]
"""Where a sample's stack belongs: the first area one of whose markers a frame contains."""
ACROSS: list[tuple[str, tuple[str, ...]]] = [
    ("HTTP requests (client, TLS, headers), in all areas", ("Kube._call",)),
    # json's decoder only: orjson's is native code, which py-spy counts in the line that calls it
    ("JSON decoding, in all areas", ("json/decoder.py",)),
]
_PLUMBING = (
    "threading.py",
    "runpy",
    "asyncio/runners.py",
    "asyncio/base_events.py",
    "futures/thread.py",
    "reactor/running.py",
    "ddpjob_operator/cli.py",
    "ddpjob_operator/__main__.py",
    "asyncio/events.py",
)


def profile_areas(collapsed: str) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's raw (collapsed) stacks: samples, each area's share (AREAS, then "other"), and the shares of the
    cross-cutting work (ACROSS)."""
    areas: dict[str, int] = {}
    across: dict[str, int] = {}
    total = 0
    for stack, n in operator_scale.collapsed_stacks(collapsed):
        total += n
        area = next((name for name, marks in AREAS if any(m in stack for m in marks)), "other")
        areas[area] = areas.get(area, 0) + n
        for name, marks in ACROSS:
            if any(m in stack for m in marks):
                across[name] = across.get(name, 0) + n
    share = 100.0 / total if total else 0.0
    ordered = sorted(areas.items(), key=lambda kv: -kv[1])
    return total, [(k, v * share) for k, v in ordered], [(k, across.get(k, 0) * share) for k, _ in ACROSS]


def profile_report(path: Path, top: int = 15) -> str:
    if not path.exists():
        return "(py-spy wrote no profile)"
    text = path.read_text()
    total, areas, across = profile_areas(text)
    _, inclusive, own = operator_scale.profile_summary(text, top=top + 40)
    inclusive = [(n, s) for n, s in inclusive if not any(p in n for p in _PLUMBING)][:top]
    return "\n".join([
        f"Where our operator's CPU went (py-spy at 100 Hz, samples of the thread holding the GIL, {total} samples):",
        "",
        table(["area", "share"], [[n, f"{s:.1f}%"] for n, s in [*areas, *across]]),
        "",
        table(["function (inclusive; threads' and the event loop's plumbing left out)", "share"],
              [[n, f"{s:.1f}%"] for n, s in inclusive]),
        "",
        table(["function (self)", "share"], [[n, f"{s:.1f}%"] for n, s in own[:top]]),
    ])  # fmt: skip


if __name__ == "__main__":
    stop_on_sigterm()
    main()
