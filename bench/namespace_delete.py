"""Deleting a namespace of idle DDPJobs: what the operator spends on it, against what creating them cost.

    python -m bench.namespace_delete                  # 300 jobs x 4 ranks
    python -m bench.namespace_delete --jobs 30

The box's control plane without its node (pods stay Pending); the operator as its own process.
Creates ``--jobs`` DDPJobs, waits until every one has launched its pods and the operator has
posted their Events, then ``delete ns`` and waits until the namespace is gone, plus ``--settle``
seconds for work that trails it. Reports the
operator's CPU seconds for each half (from /proc), and for the deletion: restarts, POSTs (the
operator's own ``ddpjob_operator_api_requests_total``), and its log lines at ERROR or with a traceback.
"""

from __future__ import annotations

import argparse
import re
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.apiserver import Api, ApiError
from bench.common import RESULTS_DIR, log, machine, table, write_results
from bench.operator_scale import Operator, control_plane_with_crd, job_body, jobs_path

NAME = "namespace_delete"
NAMESPACE = "bench-nsdelete"


def scrape(op: Operator) -> dict[str, float]:
    """POSTs by resource and restarts so far, from the operator's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        post = re.match(r"ddpjob_operator_api_requests_total\{(.*)\} (\S+)", line)
        if post and 'verb="POST"' in post[1]:
            resource = re.search(r'resource="([^"]*)"', post[1])
            key = f"POST {resource[1] if resource else '?'}"
            out[key] = out.get(key, 0.0) + float(post[2])
        if line.startswith("ddpjob_operator_jobs_restarted_total "):
            out["restarts"] = float(line.split()[1])
    return out


def settle(op: Operator, quiet: float = 3.0, timeout: float = 300.0) -> None:
    """Wait until the operator's POSTs stop (the Events of the creates trail them, posted in the background)."""
    deadline = time.monotonic() + timeout
    last = scrape(op)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = scrape(op)
        if now == last:
            return
        last = now
    raise TimeoutError(f"the operator still posts after {timeout:.0f}s")


def serving(op: Operator) -> bool:
    op.check_alive()
    try:
        scrape(op)
    except OSError:
        return False
    return True


def launched(client: Api, jobs: int) -> bool:
    items: list[dict[str, Any]] = client.get(jobs_path(NAMESPACE))["items"]
    done = [j for j in items if (j.get("status") or {}).get("launchedAttempt") == 0]
    return len(done) == jobs


def gone(client: Api) -> bool:
    try:
        client.get(f"/api/v1/namespaces/{NAMESPACE}")
    except ApiError as err:
        return err.status == 404
    return False


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds to keep watching after the namespace is gone"
    )
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle operator CPU, the baseline")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)

    log(f"{NAME}: {args.jobs} jobs x {args.replicas} ranks, then delete the namespace")
    with control_plane_with_crd() as (plane, client):
        client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        args.out.mkdir(parents=True, exist_ok=True)
        op = Operator(plane.kubeconfig, args.out / f"{NAME}.operator.log")
        try:
            client.wait_for(lambda: serving(op), "the operator's metrics", 60)
            cpu0, wall0 = op.cpu_seconds(), time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: client.post(jobs_path(NAMESPACE), job_body(f"idle-{i:04d}", args.replicas)),
                              range(args.jobs)))  # fmt: skip
            client.wait_for(lambda: launched(client, args.jobs), f"{args.jobs} jobs launched", 600)
            create_wall = time.monotonic() - wall0
            settle(op)
            create_cpu = op.cpu_seconds() - cpu0
            idle0 = op.cpu_seconds()
            time.sleep(args.idle)
            idle_rate = (op.cpu_seconds() - idle0) / args.idle
            log(f"  created and launched in {create_wall:.1f}s; operator CPU {create_cpu:.2f}s")
            before, lines_before = scrape(op), len(op.log().splitlines())
            cpu1, wall1 = op.cpu_seconds(), time.monotonic()
            client.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}", {"propagationPolicy": "Background"})
            client.wait_for(lambda: gone(client), f"namespace {NAMESPACE} to be gone", 600)
            delete_wall = time.monotonic() - wall1
            time.sleep(args.settle)
            delete_cpu = op.cpu_seconds() - cpu1
            delete_idle = idle_rate * (delete_wall + args.settle)
            after = scrape(op)
            op.check_alive()
            new_lines = op.log().splitlines()[lines_before:]
        finally:
            op.stop()
    during = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}
    errors = [line for line in new_lines if "ERROR" in line or "Traceback" in line]
    figures = {
        "jobs": args.jobs,
        "create_wall_s": create_wall,
        "create_operator_cpu_s": create_cpu,
        "delete_wall_s": delete_wall,
        "delete_operator_cpu_s": delete_cpu,
        "idle_operator_cpu_s_per_s": idle_rate,
        "delete_operator_cpu_above_idle_s": delete_cpu - delete_idle,
        "delete_restarts": during.get("restarts", 0.0),
        "delete_posts": {k: v for k, v in during.items() if k.startswith("POST")},
        "delete_log_lines": len(new_lines),
        "delete_error_lines": len(errors),
        "delete_error_sample": errors[:10],
    }
    rows = [
        ["create + launch", f"{create_wall:.1f}", f"{create_cpu:.2f}", "", "", ""],
        ["idle (baseline)", f"{args.idle:.1f}", f"{idle_rate * args.idle:.2f}", "", "", ""],
        ["delete ns (+ settle)", f"{delete_wall + args.settle:.1f}",
         f"{delete_cpu:.2f} ({delete_cpu - delete_idle:.2f} above idle)", f"{figures['delete_restarts']:g}",
         f"{sum(figures['delete_posts'].values()):g}", f"{len(errors)}"],
    ]  # fmt: skip
    markdown = f"### Deleting a namespace of {args.jobs} idle DDPJobs ({args.replicas} ranks each)\n\n" + table(
        ["phase", "wall s", "operator CPU s", "restarts", "POSTs", "error lines"], rows
    )
    write_results(NAME, {"name": NAME, "machine": machine(), "settings": vars(args) | {"out": str(args.out)},
                         "figures": figures}, markdown, args.out)  # fmt: skip
    print(markdown)
    return {"name": NAME, "markdown": markdown}


if __name__ == "__main__":
    main()
