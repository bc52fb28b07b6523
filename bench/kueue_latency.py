"""How long Kueue's decisions take to reach the ranks: admission to every rank running, eviction to every pod gone.

    python -m bench.kueue_latency               # 20 trials, then 300 jobs queued
    python -m bench.kueue_latency --trials 3 --queued 100

The box with its node and Kueue (``Box(with_kueue=True)``, as ``ddpjob cluster up --kueue``), the operator as its
own process, and tests/kueue/queues.yaml. Each trial creates a 2-rank DDPJob in the LocalQueue and polls, every
0.1 s, its Workload and its pods:

- admitted -> first pod: from the first poll that sees the Workload's ``Admitted`` condition True to the first that
  sees a pod of the job (the operator hears Kueue's write on its Workload watch, and creates the pods);
- admitted -> running: from the same poll to the first that sees both ranks' trainer containers running (the
  scheduler binds them; kubelet starts them and the init container waits for rank 0's name);
- evicted -> gone: the trial deactivates the Workload (``spec.active: false``, Kueue evicts it with reason
  ``Deactivated``, as an admin would) and times from the first poll that sees ``Evicted`` True to the first that
  finds no pod of the job (the operator deletes them; kubelet stops each rank with SIGTERM, then deletes it).

Then the cost of waiting (``--queued N``, 0: none): N 2-rank jobs in a LocalQueue whose ClusterQueue has no
quota, so Kueue admits none. Once every one is Queued with its Workload, the operator's requests to the apiserver
(its own ``ddpjob_operator_api_requests_total``, by verb and resource) and its CPU are counted over
``--window`` seconds.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.apiserver import Api
from bench.common import log, machine, percentile, table, wait_until, write_results
from bench.operator_scale import apply_crd, cpu_seconds
from ddpjob_box import images
from ddpjob_box.ports import free_port
from ddpjob_contract.kueue import LABEL_QUEUE_NAME

NAME = "kueue_latency"
GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUES = Path(__file__).resolve().parents[1] / "tests" / "kueue" / "queues.yaml"
LOCAL_QUEUE = "user-queue"
POLL = 0.1
TRIAL_TIMEOUT = 300.0


def job(name: str, queue: str = LOCAL_QUEUE) -> dict[str, Any]:
    """Two ranks of a tinycnn run long enough to be evicted while it trains."""
    args = ["--model", "tinycnn", "--image-size", "16", "--batch-size", "8", "--num-workers", "0",
            "--steps", "100000", "--metrics-linger-seconds", "0"]  # fmt: skip
    container = {"name": "trainer", "image": images.image_name("trainer"), "args": args,
                 "resources": {"requests": {"example.com/slot": "1", "cpu": "100m"},
                               "limits": {"example.com/slot": "1"}}}  # fmt: skip
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DDPJob",
        "metadata": {"name": name, "labels": {LABEL_QUEUE_NAME: queue}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [container]}}},
    }


NO_QUOTA = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: bench-no-quota
spec:
  namespaceSelector: {}
  resourceGroups:
    - coveredResources: ["cpu", "memory", "example.com/slot"]
      flavors:
        - name: default-flavor
          resources:
            - {name: cpu, nominalQuota: 0}
            - {name: memory, nominalQuota: 0}
            - {name: example.com/slot, nominalQuota: 0}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: no-quota
spec:
  clusterQueue: bench-no-quota
"""
"""A queue where every job waits: its ClusterQueue grants nothing."""


@dataclass
class Trial:
    admitted_to_first_pod: float
    admitted_to_running: float
    evicted_to_gone: float


@dataclass
class Waiting:
    jobs: int
    seconds: float
    requests: dict[str, float]
    """Requests by "VERB resource" over the window."""
    cpu_seconds: float

    @property
    def per_second(self) -> float:
        return sum(self.requests.values()) / self.seconds


def _condition(obj: dict[str, Any] | None, type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions") or [])  # fmt: skip


def _running(pods: Sequence[Any]) -> bool:
    return len(pods) == 2 and all(
        any(cs.name == "trainer" and cs.state.running for cs in (p.status.container_statuses or [])) for p in pods
    )


def trial(core: Any, custom: Any, namespace: str) -> Trial:
    name = f"k-{uuid.uuid4().hex[:6]}"
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job(name))
    selector = f"ddpjob.dev/job-name={name}"
    deadline = time.monotonic() + TRIAL_TIMEOUT

    def workload() -> dict[str, Any] | None:
        items = custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads",
                                                     label_selector=selector)["items"]  # fmt: skip
        return items[0] if items else None

    admitted = wait_until("the Workload admitted", lambda: _condition(workload(), "Admitted") and time.monotonic(),
                          lambda: deadline, interval=POLL)  # fmt: skip

    def pods() -> list[Any]:
        return list(core.list_namespaced_pod(namespace, label_selector=selector).items)

    first_pod = wait_until("a pod of the job", lambda: pods() and time.monotonic(), lambda: deadline, interval=POLL)
    running = wait_until("both ranks running", lambda: _running(pods()) and time.monotonic(), lambda: deadline,
                         interval=POLL)  # fmt: skip
    found = workload()
    assert found is not None
    custom.patch_namespaced_custom_object(*KUEUE, namespace, "workloads", found["metadata"]["name"],
                                          {"spec": {"active": False}})  # fmt: skip
    evicted = wait_until("the Workload evicted", lambda: _condition(workload(), "Evicted") and time.monotonic(),
                         lambda: deadline, interval=POLL)  # fmt: skip
    gone = wait_until("every pod gone", lambda: not pods() and time.monotonic(), lambda: deadline, interval=POLL)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return Trial(round(first_pod - admitted, 2), round(running - admitted, 2), round(gone - evicted, 2))


def requests_so_far(port: int) -> dict[str, float]:
    """The operator's requests by "VERB resource", from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for labels, value in re.findall(r"^ddpjob_operator_api_requests_total\{(.*)\} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"{found.get('verb')} {found.get('resource')}"
        out[key] = out.get(key, 0.0) + float(value)
    return out


def waiting(custom: Any, kueue: Any, namespace: str, count: int, port: int, pid: int, window: float) -> Waiting:
    """``count`` jobs queued where Kueue admits none; the operator's requests and CPU over ``window`` s once each
    is Queued with its Workload."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as queues:
        queues.write(NO_QUOTA)
        queues.flush()
        kueue.kubectl("apply", "-n", namespace, "-f", queues.name)
    names = [f"q-{i:04d}" for i in range(count)]
    for name in names:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job(name, queue="no-quota"))

    def all_queued() -> bool:
        jobs = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        queued = [j for j in jobs if j["metadata"]["name"].startswith("q-")
                  and (j.get("status") or {}).get("phase") == "Queued"]  # fmt: skip
        workloads = custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
        return len(queued) == count and sum(1 for w in workloads if w.get("status")) >= count

    deadline = time.monotonic() + TRIAL_TIMEOUT + count
    wait_until(f"{count} jobs Queued with their Workloads", all_queued, lambda: deadline, interval=2.0)
    time.sleep(5.0)  # the last jobs' first reconciles end
    before, cpu = requests_so_far(port), cpu_seconds(pid)
    time.sleep(window)
    after, used = requests_so_far(port), cpu_seconds(pid) - cpu
    delta = {k: round(v - before.get(k, 0.0), 1) for k, v in after.items() if v - before.get(k, 0.0) > 0}
    for name in names:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return Waiting(count, window, delta, round(used, 2))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--queued", type=int, default=300, help="jobs left waiting in a queue with no quota")
    parser.add_argument("--window", type=float, default=30.0, help="seconds their cost is counted over")
    args = parser.parse_args(argv)

    from kubernetes import client, config

    from ddpjob_box.box import Box
    from ddpjob_box.operator_process import OperatorProcess

    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-kueue-") as tmp,
        Box(Path(tmp) / "box", with_prometheus=False, with_kueue=True) as box,
    ):
        plane = box.plane
        assert plane is not None and box.kueue is not None
        apply_crd(Api(plane.server, plane.admin_token, str(plane.ca_file)))
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespace = "bench-kueue"
        core.create_namespace({"metadata": {"name": namespace}})
        box.kueue.kubectl("apply", "-n", namespace, "-f", str(QUEUES))
        box.kueue.kubectl("wait", "-n", namespace, f"localqueue/{LOCAL_QUEUE}", "--for=condition=Active",
                          "--timeout=120s")  # fmt: skip
        port = free_port()
        operator = OperatorProcess(plane.kubeconfig, Path(tmp) / "operator.log", namespaces=[namespace],
                                   metrics_port=port)  # fmt: skip
        trials: list[Trial] = []
        cost: Waiting | None = None
        try:
            for i in range(args.trials):
                result = trial(core, custom, namespace)
                log(f"trial {i + 1}: admitted -> first pod {result.admitted_to_first_pod}s, admitted -> running "
                    f"{result.admitted_to_running}s, evicted -> gone {result.evicted_to_gone}s")  # fmt: skip
                trials.append(result)
            if args.queued:
                cost = waiting(custom, box.kueue, namespace, args.queued, port, operator.pid, args.window)
                log(f"{cost.jobs} jobs waiting: {cost.per_second:.2f} requests/s from the operator "
                    f"({cost.requests}), {cost.cpu_seconds / cost.seconds:.1%} of a core")  # fmt: skip
        finally:
            operator.stop()
            api.close()
    rows = []
    for label, values in (("Workload admitted -> a pod of the job", [t.admitted_to_first_pod for t in trials]),
                          ("Workload admitted -> every rank running", [t.admitted_to_running for t in trials]),
                          ("Workload evicted -> every pod gone", [t.evicted_to_gone for t in trials])):  # fmt: skip
        rows.append([label, len(values), f"{percentile(values, 50):.1f}", f"{percentile(values, 99):.1f}",
                     f"{max(values):.1f}"])  # fmt: skip
    markdown = table(["from -> to", "trials", "median s", "p99 s", "max s"], rows)
    if cost is not None:
        markdown += "\n\n" + table(
            ["jobs waiting", "window s", "operator requests/s", "by verb and resource", "operator CPU"],
            [[cost.jobs, f"{cost.seconds:.0f}", f"{cost.per_second:.2f}",
              ", ".join(f"{k} {v:g}" for k, v in sorted(cost.requests.items())) or "none",
              f"{cost.cpu_seconds / cost.seconds:.1%}"]],
        )  # fmt: skip
    print(markdown)
    waited = asdict(cost) if cost is not None else None
    write_results(NAME, {"machine": machine(), "trials": [asdict(t) for t in trials], "waiting": waited}, markdown)


if __name__ == "__main__":
    main()
