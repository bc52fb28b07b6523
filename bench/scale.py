"""Scale under Kueue: queued DDPJobs against queued PyTorchJobs on simulated GPU nodes, side by side on one box.

    python -m bench.scale                        # 2,000 jobs x 8 ranks, 250 nodes, 1,000 GPUs of quota, 60 s, 3 pairs
    python -m bench.scale --jobs 200 --nodes 25 --quota-gpus 200 --train-seconds 20 --pairs 1   # a short run

The box's control plane and one real node (Kueue's manager runs there), ``--nodes`` KWOK nodes of 8
``nvidia.com/gpu`` each (``ddpjob cluster up --simulated-nodes``), Kueue v0.17.0 with DDPJob as an external framework
and its built-in ``kubeflow.org/pytorchjob`` integration, and one ClusterQueue of ``--quota-gpus`` GPUs in a flavor
that places pods on the simulated nodes. Each run: a fresh namespace and its LocalQueue, the operator under test
started (ours with its defaults; training-operator v1.9.3 as ``bench.peer_operator`` runs it), ``--jobs`` jobs of
``--ranks`` pods of 1 GPU each created at ``--rate`` per second, every one queued; KWOK runs each pod for
``--train-seconds``; the run ends when every job's Workload is Finished. The pairs alternate which side runs first.

Figures per run: the operator's requests per second while the queue is full (``--window`` seconds once every job
exists; from the audit log, by the operator's user agent), its CPU and RSS at rest (warmed up, before the load) and at
peak (VmHWM), Workload Admitted -> the job's first pod (p50) and last pod created (p50, p99; from a watch of each, as
they arrive), the time to drain the queue (the first create to the last Workload Finished), the apiserver's CPU per
job, and the operator's requests per job by verb and resource over the whole run. Evictions (Kueue's
``waitForPodsReady``) are counted: a run with any says so.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import apiserver, operator_scale, peer_operator
from bench.apiserver import Api
from bench.common import RESULTS_DIR, log, machine, percentile, publish, stop_on_sigterm, table
from bench.operator_scale import CpuMeter, Operator, PodWatch, create_jobs
from ddpjob_box import audit, toolchain
from ddpjob_box.kwok import RUN_ANNOTATION
from ddpjob_contract.kueue import LABEL_QUEUE_NAME
from ddpjob_contract.pods import LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY

NAME = "scale"
GPU = "nvidia.com/gpu"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "scale-gpu", "scale-cluster-queue", "scale-queue"
APISERVER = "kube-apiserver"
PODS_READY_TIMEOUT = "5m"
"""Kueue's own default, not the box's 60 s: KWOK plays each pod's stages with a delay of 1-5 s each (a DDPJob pod's
init container adds two), and 400 pods admitted at once took more than 60 s on the 2-core box."""


def queues(quota_gpus: int) -> list[tuple[str, dict[str, Any]]]:
    """(path, body): the flavor of the simulated nodes (their label and taint, as tests/kueue/simulated-queues.yaml
    has them) and one ClusterQueue of ``quota_gpus`` GPUs for every namespace."""
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR},
        "spec": {
            "nodeLabels": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    quota = [
        {"name": "cpu", "nominalQuota": 100 * quota_gpus},
        {"name": "memory", "nominalQuota": f"{quota_gpus}Ti"},
        {"name": GPU, "nominalQuota": quota_gpus},
    ]
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {"coveredResources": ["cpu", "memory", GPU], "flavors": [{"name": FLAVOR, "resources": quota}]}
            ],
        },
    }
    return [(f"{KUEUE_API}/resourceflavors", flavor), (f"{KUEUE_API}/clusterqueues", cluster_queue)]  # fmt: skip


def local_queue() -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE},
            "spec": {"clusterQueue": CLUSTER_QUEUE}}  # fmt: skip


def rank_resources() -> dict[str, Any]:
    return {"requests": {GPU: "1", "cpu": "8", "memory": "64Gi"}, "limits": {GPU: "1"}}


def ddpjob_body(ranks: int, seconds: int) -> Callable[[str], dict[str, Any]]:
    def body(name: str) -> dict[str, Any]:
        job = operator_scale.job_body(name, ranks)
        job["metadata"]["labels"] = {LABEL_QUEUE_NAME: LOCAL_QUEUE}
        template = job["spec"]["template"]
        template["metadata"] = {"annotations": {RUN_ANNOTATION: f"{seconds}s"}}
        template["spec"]["containers"] = [{**template["spec"]["containers"][0], "resources": rank_resources()}]
        return job

    return body


def pytorchjob_body(ranks: int, seconds: int) -> Callable[[str], dict[str, Any]]:
    """1 Master + ``ranks - 1`` Workers, as a DDPJob of ``ranks`` ranks."""

    def replicas(n: int) -> dict[str, Any]:
        container = {**peer_operator.PYTORCH, "resources": rank_resources()}
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": {"metadata": {"annotations": {RUN_ANNOTATION: f"{seconds}s"}},
                             "spec": {"containers": [container]}}}  # fmt: skip

    def body(name: str) -> dict[str, Any]:
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": name, "labels": {LABEL_QUEUE_NAME: LOCAL_QUEUE}},
                "spec": {"pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(ranks - 1)}}}  # fmt: skip

    return body


@dataclass(frozen=True)
class Side(peer_operator.Peer):
    """One operator under test (``bench.peer_operator``'s), with the user agents its requests carry."""

    agents: tuple[str, ...] = ()


def sides(client: Api, ranks: int, seconds: int) -> dict[str, Side]:
    return {
        "DDPJob": Side("DDPJob", operator_scale.jobs_path, ddpjob_body(ranks, seconds),
                       f"{LABEL_MANAGED_BY}={MANAGED_BY}", LABEL_JOB_NAME,
                       lambda kubeconfig, log_path: Operator(kubeconfig, log_path), ("ddpjob-operator", "kopf/")),
        "PyTorchJob": Side("PyTorchJob", peer_operator.pytorchjobs_path, pytorchjob_body(ranks, seconds),
                           "training.kubeflow.org/operator-name=pytorchjob-controller",
                           "training.kubeflow.org/job-name",
                           lambda kubeconfig, log_path: peer_operator.TrainingOperator(client, kubeconfig, log_path),
                           ("training-operator",)),
    }  # fmt: skip


@dataclass
class WorkloadTimes:
    admitted: float = 0.0
    finished: float = 0.0
    evictions: int = 0


@dataclass
class WorkloadWatch:
    """When each job's Workload (named by its owner) was first seen Admitted and Finished, from one watch of the
    namespace's Workloads; resumed from the last resourceVersion when the apiserver ends it."""

    client: Api
    namespace: str
    jobs: dict[str, WorkloadTimes] = field(default_factory=dict)
    failed: Exception | None = None

    def __post_init__(self) -> None:
        self._path = f"{KUEUE_API}/namespaces/{self.namespace}/workloads"
        self._version = self.client.get(self._path, limit="1")["metadata"]["resourceVersion"]
        self._closed = False
        self._stream = self._open()
        self._thread = threading.Thread(target=self._run, name="workload-watch", daemon=True)
        self._thread.start()

    def _open(self) -> apiserver.WatchStream:
        return self.client.watch(self._path, resourceVersion=self._version, allowWatchBookmarks="true")

    def _run(self) -> None:
        try:
            while not self._closed:
                for event in self._stream:
                    self._seen(event, time.perf_counter())
                if not self._closed:
                    self._stream = self._open()
        except Exception as err:  # read by finished()
            self.failed = err

    def _seen(self, event: dict[str, Any], now: float) -> None:
        if event.get("type") == "ERROR":
            raise RuntimeError(f"the Workload watch failed: {event.get('object')}")
        workload = event["object"]
        self._version = workload["metadata"]["resourceVersion"]
        owners = workload["metadata"].get("ownerReferences") or []
        if event.get("type") == "BOOKMARK" or not owners:
            return
        times = self.jobs.setdefault(owners[0]["name"], WorkloadTimes())
        said = {c["type"]: c["status"] == "True" for c in (workload.get("status") or {}).get("conditions") or []}
        if said.get("Admitted") and not times.admitted:
            times.admitted = now
        if said.get("Evicted") and times.admitted and not said.get("Admitted"):
            times.evictions, times.admitted = times.evictions + 1, 0.0
        if said.get("Finished") and not times.finished:
            times.finished = now

    def finished(self) -> int:
        if self.failed is not None:
            raise RuntimeError(f"the Workload watch stopped: {self.failed}") from self.failed
        return sum(1 for t in list(self.jobs.values()) if t.finished)  # a copy: the watch's thread adds to it

    def admitted_now(self) -> int:
        return sum(1 for t in list(self.jobs.values()) if t.admitted and not t.finished)

    def close(self) -> None:
        self._closed = True
        self._stream.close()
        self._thread.join(timeout=5)


def requests_by(log_file: Path, since: float, until: float, agents: Sequence[str]) -> Counter[tuple[str, str]]:
    """The requests received in [since, until) whose user agent starts with one of ``agents``, by (verb, resource),
    watches left out (one is held open, not repeated); a request refused is counted apart, its code after the
    resource ("events (409)")."""
    counts: Counter[tuple[str, str]] = Counter()
    oldest = next((when for _, when in audit.received(log_file, 0.0)), since)
    if oldest > since:
        log(f"  the audit log begins {oldest - since:.0f}s after the window: its rotation dropped requests")
    for event, when in audit.received(log_file, since):
        if when >= until or event.get("stage") != "ResponseComplete" or event.get("verb") == "watch":
            continue
        if not str(event.get("userAgent", "")).startswith(tuple(agents)):
            continue
        ref = event.get("objectRef") or {}
        resource = (ref.get("resource") or "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        code = int((event.get("responseStatus") or {}).get("code") or 0)
        counts[str(event.get("verb")), resource + (f" ({code})" if code >= 300 else "")] += 1  # refused apart
    return counts


def run_once(box: Any, client: Api, side: Side, index: int, args: argparse.Namespace) -> dict[str, Any]:
    """One side under the load in a fresh namespace, until every job's Workload is Finished; then its operator
    stops and the namespace is deleted."""
    plane = box.plane
    ns = f"scale-{index}-{side.name.lower()}"
    client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": ns}})
    client.create_if_absent(f"{KUEUE_API}/namespaces/{ns}/localqueues", local_queue())
    pods = PodWatch(client, args.ranks, selector=side.selector, job_label=side.job_label)
    workloads = WorkloadWatch(client, ns)
    op = side.start(plane.kubeconfig, args.out / f"{NAME}.{index}-{side.name.lower()}.log")
    try:
        time.sleep(args.settle)  # started, its caches filled
        op.check_alive()
        rest = operator_scale.memory_mib(op.pid)
        apiserver_pid = next(c.pid for c in plane.components if c.name == APISERVER and c.pid is not None)
        meter = CpuMeter({"operator": op.pid, APISERVER: apiserver_pid})
        names = [f"j{i:05d}" for i in range(args.jobs)]
        since, first = time.time(), time.perf_counter()
        errors = create_jobs(client, pods, ns, names, args.ranks, args.rate, 4, body=side.body, path=side.path(ns))
        time.sleep(5.0)
        full_from, window_meter = time.time(), CpuMeter({"operator": op.pid})
        time.sleep(args.window)
        full_until, full_cpu = time.time(), window_meter.used()["operator"]  # the log is read after the drain
        waiting = args.jobs - workloads.finished() - workloads.admitted_now()
        deadline = time.monotonic() + args.timeout
        while (done := workloads.finished()) < args.jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{side.name}: {done} of {args.jobs} jobs finished in {args.timeout:.0f}s")
            op.check_alive()
            time.sleep(1.0)
        drained = max(t.finished for t in workloads.jobs.values()) - first
        time.sleep(args.settle)
        cpu = meter.used()
        peak = operator_scale.memory_mib(op.pid)
        op.check_alive()
    finally:
        pods.close()
        workloads.close()
        op.stop()
    full = requests_by(plane.audit_log, full_from, full_until, side.agents)
    every = requests_by(plane.audit_log, since, time.time(), side.agents)

    # Admitted -> pods of the jobs admitted once (an evicted job's pods and its second admission do not pair)
    def since_admitted(pod_time: Callable[[operator_scale.JobTimes], float]) -> list[float]:
        return [pod_time(pods.jobs[(ns, n)]) - workloads.jobs[n].admitted for n in names
                if (ns, n) in pods.jobs and pod_time(pods.jobs[(ns, n)]) and n in workloads.jobs
                and workloads.jobs[n].admitted and not workloads.jobs[n].evictions]  # fmt: skip

    to_pods, to_first = since_admitted(lambda t: t.done), since_admitted(lambda t: t.first)
    evictions = sum(t.evictions for t in workloads.jobs.values())
    result = {
        "side": side.name,
        "jobs": args.jobs,
        "create_errors": errors[:10],
        "waiting_in_window": waiting,
        "window_s": args.window,
        "requests_per_s_queue_full": sum(full.values()) / args.window,
        "requests_queue_full": {f"{v} {r}": n for (v, r), n in sorted(full.items())},
        "operator_cpu_queue_full": full_cpu / args.window,
        "operator_rss_rest_mib": rest.get("VmRSS"),
        "operator_rss_peak_mib": peak.get("VmHWM"),
        "operator_cpu_s": cpu["operator"],
        "operator_cpu_ms_per_job": 1000 * cpu["operator"] / args.jobs,
        "apiserver_cpu_ms_per_job": 1000 * cpu[APISERVER] / args.jobs,
        "admitted_to_pods_p50_s": percentile(to_pods, 50),
        "admitted_to_pods_p99_s": percentile(to_pods, 99),
        "admitted_to_pods_measured": len(to_pods),
        "admitted_to_first_pod_p50_s": percentile(to_first, 50),
        "drain_s": drained,
        "evictions": evictions,
        "requests_per_job": sum(every.values()) / args.jobs,
        "requests_per_job_by_kind": {f"{v} {r}": n / args.jobs for (v, r), n in sorted(every.items())},
    }
    log(f"  {side.name}: drained {args.jobs} jobs in {drained:.0f}s, admitted -> first pod p50 "
        f"{result['admitted_to_first_pod_p50_s']:.2f}s, -> pods p50 "
        f"{result['admitted_to_pods_p50_s']:.2f}s p99 {result['admitted_to_pods_p99_s']:.2f}s, "
        f"{result['requests_per_s_queue_full']:.2f} requests/s with {waiting} waiting, "
        f"{result['requests_per_job']:.1f} requests/job, {evictions} evictions")  # fmt: skip
    peer_operator.delete_namespace(client, ns)
    return result


def markdown(runs: Sequence[dict[str, Any]]) -> str:
    rows = [[r["side"], r["jobs"], f"{r['drain_s']:.0f}", f"{r.get('admitted_to_first_pod_p50_s', 0.0):.2f}",
             f"{r['admitted_to_pods_p50_s']:.2f}",
             f"{r['admitted_to_pods_p99_s']:.2f}", f"{r['requests_per_s_queue_full']:.2f} ({r['waiting_in_window']})",
             f"{r['requests_per_job']:.1f}", f"{r['operator_cpu_ms_per_job']:.1f}",
             f"{r['operator_rss_rest_mib']:.0f} / {r['operator_rss_peak_mib']:.0f}",
             f"{r['apiserver_cpu_ms_per_job']:.1f}", r["evictions"]] for r in runs]  # fmt: skip
    out = table(["side", "jobs", "drain s", "admitted -> first pod p50 s", "admitted -> pods p50 s", "p99 s",
                 "requests/s queue full (waiting)",
                 "requests/job", "operator CPU-ms/job", "operator RSS rest / peak MiB", "apiserver CPU-ms/job",
                 "evictions"], rows)  # fmt: skip
    kinds = sorted({k for r in runs for k in r["requests_per_job_by_kind"]})
    by_kind = [[k, *(f"{r['requests_per_job_by_kind'].get(k, 0):.2f}" for r in runs)] for k in kinds]
    return out + "\n\nRequests per job, by verb and resource:\n\n" + table(["", *(r["side"] for r in runs)], by_kind)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=250, help="simulated nodes of 8 GPUs each")
    parser.add_argument("--quota-gpus", type=int, default=1000)
    parser.add_argument("--train-seconds", type=int, default=60, help="how long KWOK runs each pod")
    parser.add_argument("--rate", type=float, default=20.0, help="jobs created per second")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--side", choices=("both", "DDPJob", "PyTorchJob"), default="both")
    parser.add_argument("--window", type=float, default=30.0, help="seconds the full queue's cost is counted over")
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds a run may take to drain")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.quota_gpus < args.ranks or args.nodes * 8 < args.quota_gpus:
        parser.error("--ranks must be 2 or more, --quota-gpus at least --ranks, and --nodes x 8 at least "
                     "--quota-gpus")  # fmt: skip
    stop_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    log("building training-operator (cached after the first time)...")
    toolchain.ensure(toolchain.training_operator_build())

    from ddpjob_box.box import Box

    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-scale-") as tmp,
        Box(
            Path(tmp) / "box",
            with_prometheus=False,
            simulated_nodes=args.nodes,
            audit_requests=True,
            kueue_pods_ready_timeout=PODS_READY_TIMEOUT,
        ) as box,
    ):
        assert box.plane is not None
        client = Api(box.plane.server, box.plane.admin_token, str(box.plane.ca_file))
        operator_scale.apply_crd(client)
        peer_operator.install_training_operator(client)  # the CRD before Kueue starts: its integration finds it
        box.start_kueue()
        for path, body in queues(args.quota_gpus):
            client.create_if_absent(path, body)
        both = sides(client, args.ranks, args.train_seconds)
        chosen = [both[args.side]] if args.side != "both" else list(both.values())
        order = [side for pair in range(args.pairs) for side in (chosen if pair % 2 == 0 else chosen[::-1])]
        for index, side in enumerate(order):
            log(f"run {index + 1}: {side.name}, {args.jobs} jobs x {args.ranks} ranks")
            runs.append(run_once(box, client, side, index, args))
    text = markdown(runs)
    publish(NAME, {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, text,
            args.out, [])  # fmt: skip


if __name__ == "__main__":
    main()
