"""Two gangs that each need 3 of the node's 4 slots, created at the same instant: does either deadlock?

    python -m bench.gang_deadlock                 # 20 trials with gangScheduling Disabled, 20 with Auto
    python -m bench.gang_deadlock --trials 3 --modes Auto

The box with its node (4 ``example.com/slot``) and the operator as its own process. In each trial
two DDPJobs of 3 ranks, one slot each, are created from two threads at once. The trial watches
every pod's ``spec.nodeName``:

- ``partial``: a job has some pods bound and others not, for ``STUCK_SECONDS`` on end (a gang's
  binds are three API calls: a glimpse between two is not a partial placement);
- ``deadlock``: both jobs partial at once: neither can ever finish (the trial then deletes them);
- otherwise both jobs run to Succeeded, and the order they finished in is recorded.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.apiserver import Api
from bench.common import log, machine, table, wait_until, write_results
from bench.operator_scale import apply_crd
from ddpjob_box import images

NAME = "gang_deadlock"
GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
SLOT = "example.com/slot"
RANKS = 3
STUCK_SECONDS = 3.0
"""A job partly bound for this long is partly placed, not caught between two binds."""
TRIAL_TIMEOUT = 300.0


def gang_job(name: str, mode: str, *, ranks: int = RANKS, steps: int = 10, **spec: Any) -> dict[str, Any]:
    """A short tinycnn run whose every rank takes one slot."""
    args = ["--model", "tinycnn", "--image-size", "16", "--batch-size", "8", "--num-workers", "0",
            "--log-interval", "5", "--steps", str(steps), "--metrics-linger-seconds", "0"]  # fmt: skip
    container = {
        "name": "trainer",
        "image": images.image_name("trainer"),
        "args": args,
        "resources": {"limits": {SLOT: "1"}},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {"replicas": ranks, "gangScheduling": mode, "template": {"spec": {"containers": [container]}}, **spec},
    }


@dataclass
class Trial:
    mode: str
    outcome: str
    """"succeeded" (both ran), "deadlock" (both partly placed), "failed" (a job failed), "timeout"."""
    partial: int
    """Jobs seen partly placed (some pods bound, others not) for STUCK_SECONDS on end."""
    order: str
    """The job that finished first, then the other ("a,b"); empty unless both succeeded."""
    seconds: float
    timeline: list[str]


class Watch:
    """Polls the jobs' pods and remembers, per job, since when it has been partly bound."""

    def __init__(self, core: Any, namespace: str, jobs: Sequence[str]) -> None:
        self.core, self.namespace, self.jobs = core, namespace, jobs
        self.partial_since: dict[str, float | None] = dict.fromkeys(jobs)
        self.seen_partial: set[str] = set()
        self.started = time.monotonic()
        self.timeline: list[str] = []
        """'<seconds> <job>: <bound pods>' whenever a job's bound pods change."""
        self._bound: dict[str, list[str]] = {}

    def poll(self) -> set[str]:
        """The jobs partly placed for STUCK_SECONDS on end, as of now."""
        pods = self.core.list_namespaced_pod(self.namespace).items
        now = time.monotonic()
        for job in self.jobs:
            mine = [p for p in pods if (p.metadata.labels or {}).get("ddpjob.dev/job-name") == job]
            names = sorted(f"{p.metadata.name}({p.status.phase})" for p in mine if p.spec.node_name)
            if names != self._bound.get(job):
                self._bound[job] = names
                self.timeline.append(f"{now - self.started:.2f} {job}: {len(mine)} pods, bound {names}")
            bound = len(names)
            if 0 < bound < RANKS:
                since = self.partial_since[job] or now
                self.partial_since[job] = since
                if now - since >= STUCK_SECONDS:
                    self.seen_partial.add(job)
            else:
                self.partial_since[job] = None
        return {j for j, since in self.partial_since.items() if since is not None and now - since >= STUCK_SECONDS}


def trial(core: Any, custom: Any, namespace: str, mode: str) -> Trial:
    """One trial in ``namespace``, which it leaves empty of DDPJobs."""
    suffix = uuid.uuid4().hex[:4]
    names = [f"a-{suffix}", f"b-{suffix}"]
    started = time.monotonic()
    barrier = threading.Barrier(len(names))

    def create(name: str) -> None:
        barrier.wait()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, gang_job(name, mode))

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    watch = Watch(core, namespace, names)
    finished: list[str] = []
    outcome = "timeout"
    try:
        while time.monotonic() - started < TRIAL_TIMEOUT:
            stuck = watch.poll()
            if len(stuck) == len(names):
                outcome = "deadlock"
                break
            for name in names:
                phase = (custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status")
                         or {}).get("phase")  # fmt: skip
                if phase == "Succeeded" and name not in finished:
                    finished.append(name)
                if phase == "Failed":
                    outcome = "failed"
            if outcome == "failed" or len(finished) == len(names):
                outcome = "succeeded" if len(finished) == len(names) else outcome
                break
            time.sleep(0.25)
    finally:
        for name in names:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                   body={"propagationPolicy": "Foreground"})  # fmt: skip
        _wait_empty(core, namespace)
    order = ",".join(n.split("-")[0] for n in finished) if outcome == "succeeded" else ""
    seconds = round(time.monotonic() - started, 1)
    return Trial(mode, outcome, len(watch.seen_partial), order, seconds, watch.timeline)


def _wait_empty(core: Any, namespace: str, timeout: float = 120.0) -> None:
    """Until the trial's pods are gone: the next trial must find all 4 slots free."""
    deadline = time.monotonic() + timeout
    wait_until(
        f"the pods of namespace {namespace} to go after their jobs",
        lambda: not core.list_namespaced_pod(namespace).items,
        lambda: deadline,
    )


def summarize(trials: Sequence[Trial]) -> list[list[Any]]:
    rows = []
    for mode in dict.fromkeys(t.mode for t in trials):
        mine = [t for t in trials if t.mode == mode]
        outcomes = Counter(t.outcome for t in mine)
        rows.append([mode, len(mine), sum(t.partial > 0 for t in mine), outcomes["deadlock"], outcomes["succeeded"],
                     outcomes["failed"] + outcomes["timeout"], f"{sum(t.seconds for t in mine):.0f}"])  # fmt: skip
    return rows


HEADERS = ["gangScheduling", "trials", "with a partly placed job", "deadlocked", "both succeeded", "other", "seconds"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--modes", nargs="+", default=["Disabled", "Auto"])
    args = parser.parse_args(argv)

    from kubernetes import client, config

    from ddpjob_box.box import Box
    from ddpjob_box.operator_process import OperatorProcess

    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-gang-") as tmp,
        Box(Path(tmp) / "box", with_prometheus=False) as box,
    ):
        plane = box.plane
        assert plane is not None
        apply_crd(Api(plane.server, plane.admin_token, str(plane.ca_file)))
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespace = "bench-gang"
        core.create_namespace({"metadata": {"name": namespace}})
        operator = OperatorProcess(plane.kubeconfig, Path(tmp) / "operator.log", namespaces=[namespace])
        trials: list[Trial] = []
        try:
            for mode in args.modes:
                for i in range(args.trials):
                    result = trial(core, custom, namespace, mode)
                    log(f"{mode} trial {i + 1}: {result.outcome}, partly placed jobs {result.partial}, "
                        f"order {result.order or '-'}, {result.seconds}s")  # fmt: skip
                    trials.append(result)
        finally:
            operator.stop()
            api.close()
    markdown = table(HEADERS, summarize(trials))
    print(markdown)
    write_results(NAME, {"machine": machine(), "trials": [asdict(t) for t in trials]}, markdown)


if __name__ == "__main__":
    main()
