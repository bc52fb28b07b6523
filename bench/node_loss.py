"""Node loss on the multi-node box: a node under a running gang loses power or its network; how long until the gang
trains again, elsewhere.

    python -m bench.node_loss --trials 10                 # power cuts, then network cuts
    python -m bench.node_loss --trials 1 --fault power     # one smoke trial
    python -m bench.node_loss --trials 2 --fault taint     # a node tainted unhealthy under a rank

The box has 3 real nodes (``Box(node_count=3)``: each its own kubelet and containerd) and a controller-manager with
``--node-monitor-grace-period`` at ``--grace`` (kind and kubeadm users shorten it so; Kubernetes' default is 50 s).
Each trial runs a 2-rank tinycnn DDPJob whose ranks sit on two different nodes (a required pod anti-affinity on the
hostname) and checkpoint to one ReadWriteMany claim (``box-shared``), cuts the node of rank 1 once the job is
Running, and measures from the cut to the job Running again (every rank of the next attempt joined its process
group: training resumes at once, from the newest checkpoint). It then checks what the operator promises: one
restart, with reason NodeLost naming the node; the job Succeeded at its last step; no pod of the job left on the
cut node once it is back; and, from every node's pod logs and the shared claim's files, that the cut node's old rank
logged no step and wrote no checkpoint once the next attempt's first step was logged (the fence). The trials
alternate the cut between rank 1's node and rank 0's (whose name is MASTER_ADDR). The node is brought back (power on,
or the network healed) before the next trial.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import log, machine, percentile, table, wait_until, write_results
from ddpjob_box import images, toolchain
from ddpjob_box.box import Box
from ddpjob_box.operator_process import OperatorProcess

GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
STEPS = 400
CRD = Path(__file__).resolve().parents[1] / "manifests" / "crd.yaml"
UNHEALTHY = {"key": "ddpjob.dev/unhealthy", "effect": "NoSchedule"}
"""A taint the operator honours by default (a GPU health checker's, say): the ``taint`` fault."""
REASONS = {"power": "NodeLost", "network": "NodeLost", "taint": "NodeUnhealthy"}


def job_body(name: str, claim: str, *, steps: int = STEPS, replicas: int = 2) -> dict[str, Any]:
    """A tinycnn job of ``replicas`` ranks, each on a node of its own, checkpointing every 20 steps to ``claim``."""
    args = [
        "--model",
        "tinycnn",
        "--image-size",
        "16",
        "--batch-size",
        "8",
        "--num-workers",
        "0",
        "--log-interval",
        "5",
        "--steps",
        str(steps),
        "--checkpoint-interval",
        "20",
        "--slow-rank",
        "0",
        "--slow-seconds",
        "0.1",
        "--pg-timeout-seconds",
        "60",
    ]
    spread = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"ddpjob.dev/job-name": name}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "runPolicy": {"backoffLimit": 3},
            "checkpoint": {"claimName": claim},
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "affinity": {"podAntiAffinity": spread},
                    "containers": [{"name": "trainer", "image": images.image_name("trainer"), "args": args}],
                }
            },
        },
    }


def shared_claim(name: str) -> dict[str, Any]:
    """A claim every node mounts (the box's ReadWriteMany class, as NFS or a CSI filesystem on a real cluster)."""
    return {
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "box-shared",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


class Trial:
    def __init__(
        self, box: Box, api: Any, namespace: str, index: int, fault: str, rank: int = 1, steps: int = STEPS
    ) -> None:
        from kubernetes import client

        self.box, self.namespace, self.fault, self.rank, self.steps = box, namespace, fault, rank, steps
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.name, self.claim = f"loss-{index}", f"ckpt-{index}"

    def status(self) -> dict[str, Any]:
        job = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        return dict(job.get("status") or {})

    def pods(self) -> list[Any]:
        selector = f"ddpjob.dev/job-name={self.name}"
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def run(self) -> dict[str, Any]:
        self.core.create_namespaced_persistent_volume_claim(self.namespace, shared_claim(self.claim))
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, job_body(self.name, self.claim, steps=self.steps)
        )
        wait_until("the job to run", lambda: self.status().get("phase") == "Running", _deadline(300))
        wait_until("a checkpoint", lambda: (self.status().get("lastCheckpoint") or {}).get("step"), _deadline(120))
        pods = self.pods()
        placed = {p.metadata.labels["ddpjob.dev/rank"]: p.spec.node_name for p in pods}
        victim_uid = next(p.metadata.uid for p in pods if p.metadata.labels["ddpjob.dev/rank"] == str(self.rank))
        victim = self.box.node_named(placed[str(self.rank)])
        log(f"{self.name}: ranks on {placed}; cutting {self.fault} of {victim.name}, rank {self.rank}'s node")
        cut, cut_at = time.monotonic(), time.time()
        cut_node(self.core, victim, self.fault)
        try:
            wait_until(
                "the next attempt to run",
                lambda: (s := self.status()).get("attempt", 0) >= 1 and s.get("phase") == "Running",
                _deadline(300),
            )
            again = time.monotonic() - cut
            log(f"{self.name}: training again {again:.1f}s after the cut")
            left_running = [
                p.metadata.name
                for p in self.pods()
                if p.spec.node_name == victim.name and not p.metadata.deletion_timestamp
            ]
            final = wait_until(
                "the job to end",
                lambda: (s := self.status()).get("phase") in ("Succeeded", "Failed") and s,
                _deadline(600),
            )
            # Read while the node is still cut: once back, its kubelet removes the deleted pods and their logs.
            fence = self.fenced(victim_uid, cut_at)
        finally:
            bring_back_node(self.core, victim, self.fault)
        wait_until(
            "the cut node's pods to go",
            lambda: not [p for p in self.pods() if p.spec.node_name == victim.name],
            _deadline(180),
        )
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={self.name}")
        said = [e for e in events.items if e.reason in REASONS.values() and victim.name in (e.message or "")]
        return {
            "fault": self.fault,
            "rank": self.rank,
            "node": victim.name,
            "seconds_to_training_again": round(again, 1),
            "phase": final.get("phase"),
            "restarts": final.get("restarts"),
            "reason": said[0].reason if said else None,
            "message": said[0].message if said else None,
            "step": (final.get("progress") or {}).get("step"),
            "steps": self.steps,
            "excluded": {e.get("name"): e.get("reason") for e in final.get("excludedNodes") or []},
            "new_pods_on_cut_node_while_cut": left_running,
            **fence,
        }

    def fenced(self, victim_uid: str, cut_at: float) -> dict[str, Any]:
        """What the cut rank's old pod did after the next attempt's first step, from every node's pod logs (their CRI
        timestamps) and the shared claim's files. The next attempt's lines are those of the other pods' log files
        begun after the cut (new pods, and containers their kubelet restarted in place). ``old_after_new_began``:
        the step and checkpoint lines the old pod logged from that first step on; ``files_not_written_by_new``: the
        checkpoint files written from then on that no rank of the next attempt logged writing."""
        lines = [line for node in self.box.nodes for line in pod_lines(node.layout.pod_logs, self.namespace, self.name)]
        new = [(t, text) for t, uid, begun, text in lines if uid != victim_uid and begun >= cut_at]
        began = min((t for t, text in new if "step=" in text), default=float("inf"))
        old = [(t, text) for t, uid, _, text in lines if uid == victim_uid]
        after = [text for t, text in old if t >= began and ("step=" in text or "checkpoint " in text)]
        claim = self.core.read_namespaced_persistent_volume_claim(self.claim, self.namespace)
        directory = Path(self.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)
        logged = {text.rsplit("/", 1)[-1] for _, text in new if "checkpoint " in text}
        written = [f.name for f in directory.glob("step-*.pt") if f.stat().st_mtime >= began]
        return {
            "next_attempt_began_after_cut_s": round(began - cut_at, 1) if began != float("inf") else None,
            "old_lines": len(old),
            "old_after_new_began": after,
            "files_not_written_by_new": sorted(set(written) - logged),
        }


def cut_node(core: Any, node: Any, fault: str) -> None:
    """``fault`` on a box node: its power or its network cut, or a health checker's taint on it (it stays Ready)."""
    match fault:
        case "power":
            node.power_cut()
        case "network":
            node.cut_network()
        case "taint":
            core.patch_node(node.name, {"spec": {"taints": [*taints(core, node.name), UNHEALTHY]}})


def bring_back_node(core: Any, node: Any, fault: str) -> None:
    """The node as it was before ``cut_node``."""
    match fault:
        case "power":
            node.power_on()
        case "network":
            node.heal_network()
        case "taint":
            kept = [t for t in taints(core, node.name) if t["key"] != UNHEALTHY["key"]]
            core.patch_node(node.name, {"spec": {"taints": kept or None}})


def taints(core: Any, node: str) -> list[dict[str, Any]]:
    """The node's taints, as a patch writes them."""
    said = core.read_node(node).spec.taints or []
    return [{k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v} for t in said]


def kept_its_promises(trial: dict[str, Any]) -> bool:
    """Succeeded at the last step, after one restart put down to the cut node (NodeLost; NodeUnhealthy for a taint),
    which the job excludes, with no pod of the job made on that node while it was cut, and nothing logged or written
    by the cut rank's old pod once the next attempt trained."""
    return (
        trial["phase"] == "Succeeded"
        and trial["restarts"] == 1
        and trial["step"] == trial["steps"]
        and trial["reason"] == REASONS[trial["fault"]]
        and trial["excluded"].get(trial["node"]) == REASONS[trial["fault"]]
        and not trial["new_pods_on_cut_node_while_cut"]
        and trial["next_attempt_began_after_cut_s"] is not None
        and not trial["old_after_new_began"]
        and not trial["files_not_written_by_new"]
    )


def pod_lines(
    pod_logs: Path, namespace: str, job: str, container: str = "trainer"
) -> Iterator[tuple[float, str, float, str]]:
    """(time, pod uid, when its log file began, text) of each line the job's trainers logged on one node: the
    kubelet's files are ``<namespace>_<pod>_<uid>/<container>/<restarts>.log``, each line ``<RFC 3339 time>
    <stream> <tag> <text>``."""
    for pod_dir in pod_logs.glob(f"{namespace}_{job}-*_*"):
        uid = pod_dir.name.rsplit("_", 1)[-1]
        for path in sorted(pod_dir.glob(f"{container}/*.log")):
            parsed = [_cri_line(line) for line in path.read_text(errors="replace").splitlines() if line]
            for t, text in parsed:
                yield t, uid, parsed[0][0], text


def _cri_line(line: str) -> tuple[float, str]:
    """Seconds since the epoch and text of one CRI log line (its nanoseconds cut to microseconds)."""
    stamp, _, rest = line.partition(" ")
    head, _, fraction = stamp.rstrip("Z").partition(".")
    when = datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}+00:00").timestamp()
    return when, rest.split(" ", 2)[-1]


def _deadline(seconds: float) -> Any:
    end = time.monotonic() + seconds
    return lambda: end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_loss", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials per fault")
    parser.add_argument("--fault", choices=("power", "network", "taint", "both"), default="both")
    parser.add_argument("--grace", default="10s", help="the controller-manager's --node-monitor-grace-period")
    args = parser.parse_args(argv)
    from kubernetes import config

    faults = ["power", "network"] if args.fault == "both" else [args.fault]
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ddpjob-node-loss-") as tmp:
        grace = [f"--node-monitor-grace-period={args.grace}", "--node-monitor-period=2s"]
        box = Box(
            data_dir=Path(tmp) / "box",
            node_count=3,
            with_prometheus=False,
            with_proxy=False,
            controller_manager_args=grace,
        )
        with box:
            assert box.plane is not None
            kubectl = toolchain.ensure(toolchain.kubernetes_build())["kubectl"]
            ctl = [str(kubectl), "--kubeconfig", str(box.plane.kubeconfig)]
            subprocess.run([*ctl, "apply", "--server-side", "-f", str(CRD)], check=True, capture_output=True)
            established = ["wait", "--for=condition=Established", "crd/ddpjobs.ddpjob.dev", "--timeout=60s"]
            subprocess.run([*ctl, *established], check=True, capture_output=True)
            api = config.new_client_from_config(config_file=str(box.plane.kubeconfig))
            from kubernetes import client

            namespace = "node-loss"
            client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
            operator = OperatorProcess(box.plane.kubeconfig, Path(tmp) / "operator.log", namespaces=[namespace])
            try:
                index = 0
                for fault in faults:
                    for _ in range(args.trials):
                        result = Trial(box, api, namespace, index, fault, rank=index % 2).run()
                        log(json.dumps(result))
                        trials.append(result)
                        index += 1
            finally:
                operator.stop()
                print(operator.log_tail(40))
    rows = []
    for fault in faults:
        seconds = [t["seconds_to_training_again"] for t in trials if t["fault"] == fault]
        ok = sum(kept_its_promises(t) for t in trials if t["fault"] == fault)
        rows.append(
            [
                fault,
                len(seconds),
                f"{statistics.median(seconds):.1f}",
                f"{percentile(seconds, 90):.1f}",
                f"{ok}/{len(seconds)}",
            ]
        )
    markdown = table(
        ["cut", "trials", "cut -> training again, median s", "p90 s", "Succeeded, 1 NodeLost restart"], rows
    )
    print(markdown)
    write_results("node_loss", {"machine": machine(), "grace": args.grace, "trials": trials}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
