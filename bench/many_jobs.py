"""Many jobs: the operator's memory, and how soon it is caught up after a restart, with ``--jobs`` DDPJobs in the
cluster, most of them finished.

    python -m bench.many_jobs                    # 10,000 jobs, 100 of them still running
    python -m bench.many_jobs --jobs 500         # a short run

The box's control plane and ``--nodes`` KWOK nodes (``ddpjob cluster up --no-node --simulated-nodes``), the operator
as its own process with its defaults. Each job is ``--ranks`` ranks on the simulated nodes, ``cleanPodPolicy: All``;
KWOK runs its pods for 1 s, and the operator finishes it (its own status writes), except the last ``--running``, which
run for an hour. Then the operator is stopped (SIGTERM) and started again, and a new job is created the moment its
process starts: caught up is from the process's start to that job's last pod created (a watch), which includes the
interpreter's start and the relist of every job. The operator's RSS (VmRSS) is read once it is caught up and
again ``--settle`` seconds later, with its peak (VmHWM).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import operator_scale
from bench.apiserver import Api
from bench.common import RESULTS_DIR, log, machine, publish, stop_on_sigterm, table
from bench.operator_scale import Operator, PodWatch, create_jobs
from ddpjob_box.kwok import RUN_ANNOTATION

NAME = "many_jobs"
NAMESPACE = "many-jobs"
RSS_TARGET_MIB = 400.0
CATCH_UP_TARGET_S = 30.0


def job_body(ranks: int, seconds: int) -> Any:
    def body(name: str) -> dict[str, Any]:
        job = operator_scale.job_body(name, ranks)
        job["spec"]["runPolicy"] = {"cleanPodPolicy": "All"}
        template = job["spec"]["template"]
        template["metadata"] = {"annotations": {RUN_ANNOTATION: f"{seconds}s"}}
        template["spec"]["nodeSelector"] = {"type": "kwok"}
        template["spec"]["tolerations"] = [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]
        return job

    return body


def phases(client: Api) -> dict[str, int]:
    """How many of the namespace's jobs are in each phase, from a paged LIST."""
    counts: dict[str, int] = {}
    page: dict[str, str] = {"limit": "500"}
    while True:
        listed = client.get(operator_scale.jobs_path(NAMESPACE), **page)
        for job in listed["items"]:
            phase = str((job.get("status") or {}).get("phase") or "none")
            counts[phase] = counts.get(phase, 0) + 1
        more = (listed.get("metadata") or {}).get("continue")
        if not more:
            return counts
        page = {"limit": "500", "continue": more}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10000, help="jobs in the cluster")
    parser.add_argument("--running", type=int, default=100, help="of them, still running")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=16, help="simulated nodes (110 pods each)")
    parser.add_argument("--rate", type=float, default=20.0, help="jobs created per second")
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the jobs may take to finish")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not 0 <= args.running < args.jobs or args.running * args.ranks > args.nodes * 110:
        parser.error("--running must be below --jobs, and its pods must fit on --nodes nodes of 110 pods")
    stop_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)

    from ddpjob_box.box import Box

    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-many-") as tmp,
        Box(Path(tmp) / "box", with_node=False, with_prometheus=False, simulated_nodes=args.nodes) as box,
    ):
        assert box.plane is not None
        client = Api(box.plane.server, box.plane.admin_token, str(box.plane.ca_file))
        operator_scale.apply_crd(client)
        client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        pods = PodWatch(client, args.ranks)
        first = Operator(box.plane.kubeconfig, Path(tmp) / "operator-0.log")
        try:
            finished = [f"done-{i:05d}" for i in range(args.jobs - args.running)]
            running = [f"run-{i:05d}" for i in range(args.running)]
            started = time.monotonic()
            where = operator_scale.jobs_path(NAMESPACE)
            errors = [
                *create_jobs(client, pods, NAMESPACE, finished, args.ranks, args.rate, 4,
                             body=job_body(args.ranks, 1), path=where),
                *create_jobs(client, pods, NAMESPACE, running, args.ranks, args.rate, 4,
                             body=job_body(args.ranks, 3600), path=where),
            ]  # fmt: skip
            if errors:
                raise RuntimeError(f"{len(errors)} creates failed: {errors[:3]}")
            deadline = time.monotonic() + args.timeout
            while (seen := phases(client)).get("Succeeded", 0) < len(finished):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not every job finished in {args.timeout:.0f}s: {seen}")
                first.check_alive()
                log(f"  {seen}")
                time.sleep(15.0)
            loaded = time.monotonic() - started
            before = operator_scale.memory_mib(first.pid)
            log(f"{args.jobs} jobs in the cluster after {loaded:.0f}s ({seen}); the operator's RSS {before}")
        finally:
            first.stop()
        restarted_at = time.perf_counter()
        second = Operator(box.plane.kubeconfig, Path(tmp) / "operator-1.log")
        try:
            failed = create_jobs(client, pods, NAMESPACE, ["probe"], args.ranks, 0, 1,
                                 body=job_body(args.ranks, 3600), path=operator_scale.jobs_path(NAMESPACE))  # fmt: skip
            if failed:
                raise RuntimeError(f"the new job could not be created: {failed[0]}")
            if pods.wait([(NAMESPACE, "probe")], 300) != 1:
                second.check_alive()
                raise RuntimeError("the restarted operator made no pod for a new job in 300 s")
            caught_up = pods.jobs[(NAMESPACE, "probe")].done - restarted_at
            at_catch_up = operator_scale.memory_mib(second.pid)
            time.sleep(args.settle)
            settled = operator_scale.memory_mib(second.pid)
            second.check_alive()
        finally:
            second.stop()
            pods.close()
    rss, peak = settled["VmRSS"], settled["VmHWM"]
    rows = [
        ["jobs in the cluster (finished / running)", f"{args.jobs:,} ({len(finished):,} / {len(running):,})", ""],
        ["operator start -> a new job's pods created", f"{caught_up:.1f} s", f"<= {CATCH_UP_TARGET_S:.0f} s"],
        ["operator RSS once caught up", f"{at_catch_up['VmRSS']:.0f} MiB", ""],
        [f"operator RSS {args.settle:.0f} s later / peak (VmHWM)", f"{rss:.0f} / {peak:.0f} MiB",
         f"<= {RSS_TARGET_MIB:.0f} MiB"],
        ["the first operator's RSS with them all (VmRSS / VmHWM)", f"{before['VmRSS']:.0f} / {before['VmHWM']:.0f} MiB",
         ""],
        ["time to create and finish them", f"{loaded:.0f} s", ""],
    ]  # fmt: skip
    markdown = table(["figure", "value", "target"], rows)
    data = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "caught_up_s": caught_up,
            "rss_caught_up": at_catch_up, "rss_settled": settled, "rss_first": before, "load_s": loaded}  # fmt: skip
    publish(NAME, data, markdown, args.out, [])


if __name__ == "__main__":
    main()
