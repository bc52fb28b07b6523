"""Operator high availability across nodes: the leader's node cut off the control plane, and back.

    python -m bench.leader_cut                    # 3 trials
    python -m bench.leader_cut --trials 1 --cut-seconds 40

A box of 3 real nodes with kube-proxy (the operator's pods reach the apiserver through kubernetes.default.svc, as
on a cluster), the controller-manager's node grace at 20 s, and every request of the operator's service account
audited. The chart installed as users install it: 2 replicas spread over the nodes by hostname, leader election
with its durations (lease 15 s, renew deadline 10 s, retry 2 s). Each trial:

1. reads the Lease's holder (a pod's name) and cuts that pod's node (``KubeletNode.cut_network``: neither its
   kubelet nor its pods reach the apiserver any more; they keep running);
2. creates a DDPJob at once, which only a leader serves;
3. times the Lease taken by the standby on another node (its ``acquireTime``) and the job's first pod;
4. heals the node after ``--cut-seconds`` and waits until the old replica is back as a standby: Ready, with a
   restart more (it stopped writing at its renew deadline and exited) and its ``ddpjob_operator_leader`` gauge at 0,
   the new leader's at 1;
5. reads the audit log, where each replica's requests name it (``ddpjob-operator/<pod>``): the old leader's writes
   received after the cut, and any received after its renew deadline (the cut + 10 s: none may be).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.apiserver import Api
from bench.common import log, machine, table, write_results
from bench.operator_scale import job_body, jobs_path
from bench.takeover import writes_after
from ddpjob_box import toolchain
from ddpjob_box.box import Box
from ddpjob_box.errors import BoxError
from ddpjob_operator.kube import user_agent

NAME = "leader_cut"
NAMESPACE = "ddpjob-system"
RELEASE = "ddpjob"
"""The chart's fullname for this release: its Deployment, ServiceAccount and Lease are all named so."""
CHART = Path(__file__).resolve().parent.parent / "helm" / "ddpjob"
LEASE_SECONDS, RENEW_DEADLINE = 15.0, 10.0
"""The chart's defaults (values.yaml, leaderElection)."""
NODE_GRACE = "--node-monitor-grace-period=20s"
METRICS_PORT = 8080


@dataclass(frozen=True)
class Trial:
    cut_node: str
    old_leader: str
    new_leader: str
    new_leader_node: str
    lease_taken: float
    """Seconds from the cut to the standby's acquireTime."""
    first_pod: float
    """Seconds from the cut to the new job's first pod."""
    old_writes: tuple[str, ...]
    """The old leader's writes received after the cut: when, verb, object, answer."""
    late_writes: tuple[str, ...]
    """Those received after its renew deadline (must be none)."""
    rejoined: float
    """Seconds from the heal to the old replica Ready again as a standby (gauge 0)."""
    old_restarts: int
    """Its container's restarts during the trial (its exit once fenced)."""
    old_exit: float
    """Seconds from the cut to that exit (its container's last termination, in whole seconds)."""
    last_renewal: float
    """Seconds from its last write the apiserver received (a renewal) to the cut."""


def lease(client: Api) -> dict[str, Any]:
    return dict(client.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}").get("spec") or {})


def operator_pods(client: Api) -> dict[str, dict[str, Any]]:
    pods = client.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"app.kubernetes.io/instance={RELEASE}")
    return {p["metadata"]["name"]: p for p in pods.get("items") or [] if not p["metadata"].get("deletionTimestamp")}


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def leader_gauge(pod: dict[str, Any]) -> float | None:
    """The replica's ``ddpjob_operator_leader``, read from its pod IP (the host routes to every node's bridge)."""
    ip = (pod.get("status") or {}).get("podIP")
    try:
        with urllib.request.urlopen(f"http://{ip}:{METRICS_PORT}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    found = [line.split()[-1] for line in text.splitlines() if line.startswith("ddpjob_operator_leader ")]
    return float(found[0]) if found else None


def wait(what: str, check: Any, timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(interval)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s")


def settled(client: Api) -> tuple[str, dict[str, dict[str, Any]]]:
    """The leader's pod name, once both replicas are Ready on two nodes and their gauges say who leads."""

    def both() -> tuple[str, dict[str, dict[str, Any]]] | None:
        pods = operator_pods(client)
        holder = str(lease(client).get("holderIdentity") or "")
        if len(pods) != 2 or holder not in pods or not all(ready(p) for p in pods.values()):
            return None
        gauges = {name: leader_gauge(p) for name, p in pods.items()}
        if gauges != {name: 1.0 if name == holder else 0.0 for name in pods}:
            return None
        return holder, pods

    return wait("two Ready replicas, one leading", both, 300)  # type: ignore[no-any-return]


def trial(box: Box, client: Api, n: int, cut_seconds: float) -> Trial:
    old, pods = settled(client)
    node = box.node_named(pods[old]["spec"]["nodeName"])
    restarts_before = restarts(pods[old])
    name = f"cut-{n:02d}"
    cut_at = time.time()
    node.cut_network()
    try:
        client.post(jobs_path(NAMESPACE), job_body(name, 1))
        log(f"trial {n}: {node.name} cut under the leader {old}; job {name} created")
        spec = wait(
            "the standby to take the Lease", lambda: (s := lease(client)).get("holderIdentity") != old and s, 60
        )
        taken = datetime.fromisoformat(spec["acquireTime"]).timestamp() - cut_at
        first = wait("the job's first pod", lambda: _first_pod(client, name), 60) - cut_at
        time.sleep(max(0.0, cut_at + cut_seconds - time.time()))
    finally:
        node.heal_network()
    healed = time.time()

    def back() -> dict[str, Any] | None:
        pod = operator_pods(client).get(old)
        return pod if pod and ready(pod) and leader_gauge(pod) == 0.0 else None

    rejoined = wait(f"{old} back as a standby", back, 300)
    new = str(spec["holderIdentity"])
    assert client.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{new}")["spec"]["nodeName"] != node.name
    writes = writes_after(box_audit_log(box), user_agent(old), cut_at)
    before = writes_after(box_audit_log(box), user_agent(old), cut_at - 2 * LEASE_SECONDS)
    last = max(
        (float(w.split("s ", 1)[0]) for w in before if float(w.split("s ", 1)[0]) < 2 * LEASE_SECONDS), default=0
    )
    ended = ((rejoined.get("status") or {}).get("containerStatuses") or [{}])[0].get("lastState", {}).get("terminated")
    late = [w for w in writes if float(w.split("s ", 1)[0]) > RENEW_DEADLINE]
    return Trial(
        cut_node=node.name,
        old_leader=old,
        new_leader=new,
        new_leader_node=str(operator_pods(client)[new]["spec"]["nodeName"]),
        lease_taken=round(taken, 2),
        first_pod=round(first, 2),
        old_writes=tuple(writes),
        late_writes=tuple(late),
        rejoined=round(time.time() - healed, 1),
        old_restarts=restarts(rejoined) - restarts_before,
        old_exit=round(datetime.fromisoformat(ended["finishedAt"]).timestamp() - cut_at, 1) if ended else -1.0,
        last_renewal=round(2 * LEASE_SECONDS - last, 2),
    )


def _first_pod(client: Api, job: str) -> float | None:
    pods = client.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"ddpjob.dev/job-name={job}")
    made = [datetime.fromisoformat(p["metadata"]["creationTimestamp"]).timestamp() for p in pods.get("items") or []]
    return min(made) if made else None


def box_audit_log(box: Box) -> Path:
    assert box.plane is not None
    return box.plane.audit_log


def install_chart(box: Box) -> None:
    assert box.plane is not None
    helm = toolchain.ensure(toolchain.helm_build())["helm"]
    argv = [str(helm), f"--kubeconfig={box.plane.kubeconfig}", "install", RELEASE, str(CHART), "-n", NAMESPACE,
            "--create-namespace", "--wait", "--timeout=5m"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise BoxError(f"helm install failed: {done.stderr.strip()}")


def main(argv: Sequence[str] | None = None) -> list[Trial]:
    parser = argparse.ArgumentParser(prog="python -m bench.leader_cut", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cut-seconds", type=float, default=40.0, help="how long each cut lasts")
    args = parser.parse_args(argv)
    started = time.time()
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="ddpjob-bench-") as tmp:
        box = Box(data_dir=Path(tmp) / "box", node_count=3, with_prometheus=False, audit_requests=True,
                  audit_accounts=(f"{NAMESPACE}:{RELEASE}",), controller_manager_args=[NODE_GRACE])  # fmt: skip
        with box:
            assert box.plane is not None
            install_chart(box)
            client = Api(box.plane.server, box.plane.admin_token, str(box.plane.ca_file))
            for n in range(args.trials):
                trials.append(trial(box, client, n, args.cut_seconds))
                log(f"trial {n}: {trials[-1]}")
    report(trials, args, time.time() - started)
    return trials


def report(trials: Sequence[Trial], args: argparse.Namespace, wall: float) -> None:
    rows = [[t.cut_node, t.old_leader, f"{t.new_leader} ({t.new_leader_node})", f"{t.lease_taken:.1f} s",
             f"{t.first_pod:.1f} s", f"{t.last_renewal:.1f} s", len(t.old_writes), len(t.late_writes),
             f"{t.old_restarts} ({t.old_exit:.0f} s)", f"{t.rejoined:.0f} s"]
            for t in trials]  # fmt: skip
    headers = ["node cut", "its leader", "new leader (node)", "cut -> Lease taken", "cut -> new job's first pod",
               "its last write before the cut", "its writes after the cut", "after its renew deadline",
               "its restarts (cut -> exit)", "heal -> standby"]  # fmt: skip
    markdown = table(headers, rows)
    markdown += f"\n\ntarget: no write after the renew deadline ({RENEW_DEADLINE:.0f} s); Lease taken within the lease"
    markdown += f" ({LEASE_SECONDS:.0f} s) + the renew wait; {args.trials} trials, {args.cut_seconds:.0f} s cuts,"
    markdown += f" {wall / 60:.1f} min\n"
    for t in trials:
        markdown += "".join(f"\n- {t.old_leader}: {w}" for w in t.old_writes)
    print(markdown, flush=True)
    write_results(NAME, {"machine": machine(), "trials": [asdict(t) for t in trials]}, markdown)


if __name__ == "__main__":
    main()
