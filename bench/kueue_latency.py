"""How long Kueue's decisions take to reach the ranks: admission to every rank running, eviction to every pod gone.

    python -m bench.kueue_latency               # 20 trials
    python -m bench.kueue_latency --trials 3

The box with its node and Kueue (``Box(with_kueue=True)``, as ``ddpjob cluster up --kueue``), the operator as its
own process, and tests/kueue/queues.yaml. Each trial creates a 2-rank DDPJob in the LocalQueue and polls, every
0.1 s, its Workload and its pods:

- admitted -> running: from the first poll that sees the Workload's ``Admitted`` condition True to the first that
  sees both ranks' trainer containers running (the operator reads the Workload, creates the pods; the scheduler
  binds them; kubelet starts them and the init container waits for rank 0's name);
- evicted -> gone: the trial deactivates the Workload (``spec.active: false``, Kueue evicts it with reason
  ``Deactivated``, as an admin would) and times from the first poll that sees ``Evicted`` True to the first that
  finds no pod of the job (the operator deletes them; kubelet stops each rank with SIGTERM, then deletes it).

The operator reads a labelled job's Workload every 2 s (no watch yet), which bounds the first figure from below.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.apiserver import Api
from bench.common import log, machine, percentile, table, wait_until, write_results
from bench.operator_scale import apply_crd
from ddpjob_box import images
from ddpjob_contract.kueue import LABEL_QUEUE_NAME

NAME = "kueue_latency"
GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUES = Path(__file__).resolve().parents[1] / "tests" / "kueue" / "queues.yaml"
LOCAL_QUEUE = "user-queue"
POLL = 0.1
TRIAL_TIMEOUT = 300.0


def job(name: str) -> dict[str, Any]:
    """Two ranks of a tinycnn run long enough to be evicted while it trains."""
    args = ["--model", "tinycnn", "--image-size", "16", "--batch-size", "8", "--num-workers", "0",
            "--steps", "100000", "--metrics-linger-seconds", "0"]  # fmt: skip
    container = {"name": "trainer", "image": images.image_name("trainer"), "args": args,
                 "resources": {"requests": {"example.com/slot": "1", "cpu": "100m"},
                               "limits": {"example.com/slot": "1"}}}  # fmt: skip
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DDPJob",
        "metadata": {"name": name, "labels": {LABEL_QUEUE_NAME: LOCAL_QUEUE}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [container]}}},
    }


@dataclass
class Trial:
    admitted_to_running: float
    evicted_to_gone: float


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
    return Trial(round(running - admitted, 2), round(gone - evicted, 2))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
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
        operator = OperatorProcess(plane.kubeconfig, Path(tmp) / "operator.log", namespaces=[namespace])
        trials: list[Trial] = []
        try:
            for i in range(args.trials):
                result = trial(core, custom, namespace)
                log(f"trial {i + 1}: admitted -> running {result.admitted_to_running}s, "
                    f"evicted -> gone {result.evicted_to_gone}s")  # fmt: skip
                trials.append(result)
        finally:
            operator.stop()
            api.close()
    rows = []
    for label, values in (("Workload admitted -> every rank running", [t.admitted_to_running for t in trials]),
                          ("Workload evicted -> every pod gone", [t.evicted_to_gone for t in trials])):  # fmt: skip
        rows.append([label, len(values), f"{percentile(values, 50):.1f}", f"{percentile(values, 99):.1f}",
                     f"{max(values):.1f}"])  # fmt: skip
    markdown = table(["from -> to", "trials", "median s", "p99 s", "max s"], rows)
    print(markdown)
    write_results(NAME, {"machine": machine(), "trials": [asdict(t) for t in trials]}, markdown)


if __name__ == "__main__":
    main()
