"""Recovery: how fast a gang trains again after a failure, and how many steps a stop costs.

    python -m bench.recovery                  # 10 trials of each, every way
    python -m bench.recovery --trials 2 --only failure --ways recreate,processes

The box with its node (no Prometheus), the operator as its own process. Two-rank tinycnn jobs, with a
PersistentVolumeClaim for checkpoints. Every figure is taken side by side in one run, the two ways alternating:

- **Failure to training again.** Rank 1's training process is SIGKILLed on the host (as an OOM killer or a crash
  would), and the time runs until every rank has finished a step in a process started after the kill (its
  ``ddp_steps_total`` at least 1, read from each rank's own /metrics every 0.1 s). Three ways (``--ways``):
  ``recreate``: the gang's pods are deleted and made again (``spec.runPolicy.inPlaceRestart: Disabled``, no
  supervisor); ``kubelet``: the kubelet restarts every rank's containers in their pods (``Auto``, the trainer run
  with ``--max-restarts 0``, so its container's first process is the one killed); ``processes``: each rank's
  supervisor restarts the gang's training processes in their containers (``Auto``, the default: the child of the
  supervisor is the one killed). Checkpoints every 20 steps.
- **Steps lost per stop.** The job is suspended at a random step and resumed; the steps redone are the furthest step
  any rank was seen at before the stop (polled every 0.1 s until its pods are gone, so a lower bound) less the step
  the resumed rank 0 loaded. ``at once``: the trainer exits at SIGTERM (``--stop-grace-seconds 0``, the behaviour
  before save-on-stop); ``saves first``: the ranks agree on a step and save it. Checkpoints every 50 steps.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.apiserver import Api
from bench.common import log, machine, percentile, table, wait_until, write_results
from bench.operator_scale import apply_crd
from ddpjob_box import images

NAME = "recovery"
GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
POLL = 0.1
TRIAL_TIMEOUT = 300.0
METRICS_PORT = 9090


WAYS = ("recreate", "kubelet", "processes")


def job(name: str, *, interval: int, way: str = "processes", extra: Sequence[str] = ()) -> dict[str, Any]:
    if way == "kubelet":
        extra = (*extra, "--max-restarts", "0")
    args = ["--model", "tinycnn", "--image-size", "16", "--batch-size", "8", "--num-workers", "0",
            "--steps", "1000000", "--checkpoint-interval", str(interval), "--metrics-linger-seconds", "0",
            "--slow-rank", "0", "--slow-seconds", "0.02", *extra]  # fmt: skip
    container = {"name": "trainer", "image": images.image_name("trainer"), "args": args,
                 "resources": {"requests": {"cpu": "100m"}}}  # fmt: skip
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "checkpoint": {"claimName": name},
            "runPolicy": {"backoffLimit": 100, "inPlaceRestart": "Disabled" if way == "recreate" else "Auto"},
            "template": {"spec": {"containers": [container]}},
        },
    }


def scrape(ip: str) -> dict[str, float]:
    """The unlabelled samples of a rank's /metrics ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{METRICS_PORT}/metrics", timeout=1) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) (\S+)$", text, re.MULTILINE)}


class Cluster:
    def __init__(self, core: Any, custom: Any, namespace: str, node: Any) -> None:
        self.core, self.custom, self.ns, self.node = core, custom, namespace, node

    def pods(self, name: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns, label_selector=f"ddpjob.dev/job-name={name}").items)

    def start(self, body: dict[str, Any]) -> str:
        name = str(body["metadata"]["name"])
        self.core.create_namespaced_persistent_volume_claim(self.ns, {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        })  # fmt: skip
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)
        deadline = time.monotonic() + TRIAL_TIMEOUT
        wait_until(f"{name} Running", lambda: self.phase(name) == "Running", lambda: deadline, interval=POLL)
        return name

    def phase(self, name: str) -> str:
        job = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        return str((job.get("status") or {}).get("phase") or "")

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        deadline = time.monotonic() + TRIAL_TIMEOUT
        wait_until(f"{name}'s pods gone", lambda: not self.pods(name), lambda: deadline, interval=0.5)
        self.core.delete_namespaced_persistent_volume_claim(name, self.ns)

    def ranks(self, name: str) -> dict[int, Any]:
        return {int(p.metadata.labels["ddpjob.dev/rank"]): p for p in self.pods(name)}

    def steps(self, name: str) -> list[dict[str, float]]:
        return [scrape(p.status.pod_ip) for p in self.ranks(name).values() if p.status.pod_ip]

    def training_pid(self, pod: Any) -> int:
        """The rank's training process: under a supervisor, its child; else the container's first process."""
        found = [s for s in pod.status.container_statuses or [] if s.name == "trainer" and s.state.running]
        return int(self.node.training_pid(found[0].container_id))


@dataclass
class Recovery:
    seconds: float
    """SIGKILL -> every rank of the next attempt past a step."""
    started: float
    """SIGKILL -> the last rank's new process started (``process_start_time_seconds``): Kubernetes' share."""


def failure_to_training(cluster: Cluster, name: str) -> Recovery:
    """One SIGKILL of rank 1; seconds until every rank of the next attempt has trained a step."""
    deadline = time.monotonic() + TRIAL_TIMEOUT
    wait_until("a step past the first checkpoint", lambda: all(s.get("ddp_step", 0) >= 25 for s in cluster.steps(name))
               and len(cluster.steps(name)) == 2, lambda: deadline, interval=0.5)  # fmt: skip
    pid = cluster.training_pid(cluster.ranks(name)[1])
    killed_wall, killed = time.time(), time.monotonic()
    os.kill(pid, signal.SIGKILL)
    found: list[dict[str, float]] = []

    def training() -> bool:
        found[:] = cluster.steps(name)
        return len(found) == 2 and all(
            s.get("process_start_time_seconds", 0) > killed_wall - 1 and s.get("ddp_steps_total", 0) >= 1 for s in found
        )

    wait_until("every rank of the next attempt past a step", training, lambda: deadline, interval=POLL)
    started = max(s["process_start_time_seconds"] for s in found) - killed_wall
    return Recovery(round(time.monotonic() - killed, 2), round(started, 2))


def steps_lost(cluster: Cluster, name: str, rng: random.Random) -> int:
    """Suspend at a random step, resume; the steps the resumed run redoes."""
    deadline = time.monotonic() + TRIAL_TIMEOUT
    target = rng.randint(60, 140)
    wait_until(f"step {target}", lambda: max((s.get("ddp_step", 0) for s in cluster.steps(name)), default=0) >= target,
               lambda: deadline, interval=POLL)  # fmt: skip
    ips = [p.status.pod_ip for p in cluster.ranks(name).values()]
    patch = {"spec": {"runPolicy": {"suspend": True}}}
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.ns, PLURAL, name, patch)
    seen = 0.0
    while cluster.pods(name) and time.monotonic() < deadline:
        seen = max([seen, *(scrape(ip).get("ddp_step", 0.0) for ip in ips)])
        time.sleep(POLL)
    patch = {"spec": {"runPolicy": {"suspend": False}}}
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.ns, PLURAL, name, patch)

    def resumed() -> int | None:
        try:
            text = str(cluster.core.read_namespaced_pod_log(f"{name}-0", cluster.ns, container="trainer"))
        except Exception:
            return None
        found = re.search(r"resumed from step (\d+) ", text)
        if found:
            return int(found.group(1))
        return 0 if "training tinycnn" in text else None

    loaded = wait_until("the resumed rank 0 to load", resumed, lambda: deadline, interval=0.5)
    return max(0, int(seen) - int(loaded))


@dataclass
class Results:
    recreate: list[Recovery]
    kubelet: list[Recovery]
    processes: list[Recovery]
    at_once: list[int]
    saves_first: list[int]


def alternate(trials: int, *runs: Callable[[], None]) -> None:
    """Each trial runs every way once, the order turned by one each time: no way always goes first."""
    for i in range(trials):
        for j in range(len(runs)):
            runs[(i + j) % len(runs)]()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=["failure", "stop"], default="", help="one of the two figures")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"the failure's ways, of {', '.join(WAYS)}")
    args = parser.parse_args(argv)
    ways = [w for w in args.ways.split(",") if w]
    if not ways or set(ways) - set(WAYS):
        parser.error(f"--ways: choose among {', '.join(WAYS)}, comma-separated (got {args.ways!r})")
    rng = random.Random(args.seed)

    from kubernetes import client, config

    from ddpjob_box.box import Box
    from ddpjob_box.operator_process import OperatorProcess

    results = Results([], [], [], [], [])
    with tempfile.TemporaryDirectory(prefix="ddpjob-recovery-") as tmp, Box(Path(tmp) / "box",
                                                                            with_prometheus=False) as box:  # fmt: skip
        plane = box.plane
        assert plane is not None and box.node is not None
        apply_crd(Api(plane.server, plane.admin_token, str(plane.ca_file)))
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        namespace = "bench-recovery"
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": namespace}})
        cluster = Cluster(core, client.CustomObjectsApi(api), namespace, box.node)
        operator = OperatorProcess(plane.kubeconfig, Path(tmp) / "operator.log", namespaces=[namespace])
        try:

            def kill(way: str) -> Callable[[], None]:
                into: list[Recovery] = getattr(results, way)

                def run() -> None:
                    name = cluster.start(job(f"r-{uuid.uuid4().hex[:6]}", interval=20, way=way))
                    into.append(failure_to_training(cluster, name))
                    log(f"{way}: failure -> training {into[-1].seconds}s "
                        f"(new processes started after {into[-1].started}s)")  # fmt: skip
                    cluster.delete(name)

                return run

            def stop(saves: bool, into: list[int]) -> Callable[[], None]:
                def run() -> None:
                    extra = () if saves else ("--stop-grace-seconds", "0")
                    name = cluster.start(job(f"s-{uuid.uuid4().hex[:6]}", interval=50, extra=extra))
                    into.append(steps_lost(cluster, name, rng))
                    log(f"{'saves first' if saves else 'at once'}: {into[-1]} steps redone")
                    cluster.delete(name)

                return run

            if args.only in ("", "failure"):
                alternate(args.trials, *(kill(way) for way in ways))
            if args.only in ("", "stop"):
                alternate(args.trials, stop(False, results.at_once), stop(True, results.saves_first))
        finally:
            operator.stop()
            api.close()
    rows: list[list[Any]] = []
    for label, how, values in (
        *(("failure -> training again, s", way, [r.seconds for r in getattr(results, way)]) for way in WAYS),
        *(("failure -> new processes started, s", way, [r.started for r in getattr(results, way)]) for way in WAYS),
        ("steps lost per stop", "at once", [float(v) for v in results.at_once]),
        ("steps lost per stop", "saves first", [float(v) for v in results.saves_first]),
    ):
        floats = [float(v) for v in values]
        if not floats:
            continue
        rows.append([label, how, len(values), f"{percentile(floats, 50):.1f}", f"{percentile(floats, 90):.1f}",
                     f"{max(floats):.1f}"])  # fmt: skip
    markdown = table(["figure", "how", "trials", "median", "p90", "max"], rows)
    print(markdown)
    write_results(NAME, {"machine": machine(), **asdict(results)}, markdown)


if __name__ == "__main__":
    main()
