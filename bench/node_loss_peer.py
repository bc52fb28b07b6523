"""``bench.node_loss``'s cut under Kubeflow's training-operator v1.9.3: a PyTorchJob on the same kind of 3-node box.

    python -m bench.node_loss_peer                     # one power cut, then one network cut, 10 minutes each at most
    python -m bench.node_loss_peer --fault power --watch 300

The box (3 real nodes, the controller-manager's ``--node-monitor-grace-period`` at ``--grace``), the trainer image,
its arguments, the shared claim and the spread (a required pod anti-affinity on the hostname) are
``bench.node_loss``'s; the job is a PyTorchJob of 1 Master + 1 Worker (``restartPolicy: OnFailure``), run by
training-operator as its own process (``bench.peer_operator.TrainingOperator``, built from the Go module proxy).
Once the job trains and has a checkpoint, the Worker's node (rank 1) loses its power or its network, and the trial
watches for ``--watch`` seconds, every 2 s: the job's pods (node, phase, deletion) and, from every node's pod logs,
the pods that logged a step since the cut. It reports when a pod of each replica type logged a step after the cut
from a node other than the cut one (both ranks training again, elsewhere), or that none did. The node comes back
after each trial.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.apiserver import Api
from bench.common import log, machine, table, wait_until, write_results
from bench.node_loss import bring_back_node, cut_node, job_body, pod_lines, shared_claim
from bench.peer_operator import TrainingOperator, install_training_operator, pytorchjobs_path
from ddpjob_box import images, toolchain
from ddpjob_box.box import Box
from ddpjob_box.processes import tail

JOB_LABEL = "training.kubeflow.org/job-name"
INIT_CONTAINER = """
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits: {cpu: 100m, memory: 64Mi}
    requests: {cpu: 50m, memory: 32Mi}
  command:
    - sh
    - -c
    - >-
      for i in $(seq {{.MaxTries}}); do getent hosts {{.MasterAddr}} && exit 0;
      echo waiting for master; sleep 2; done; exit 1
"""
"""training-operator's own init container template (``pkg/controller.v1/pytorch/initcontainer.go``: each Worker waits
for the Master's name before it starts), with ``getent`` for ``nslookup``: its default image (``alpine``) is served by
no registry here, so it runs in the trainer image, as an admin without registry access would set it up with
``--pytorch-init-container-template-file`` and ``--pytorch-init-container-image``. The memory limit is raised from
20Mi to leave room for a shell under this box's containerd."""
REPLICA_LABEL = "training.kubeflow.org/replica-type"


def pytorchjob(name: str, claim: str) -> dict[str, Any]:
    """``bench.node_loss.job_body``'s trainer and arguments as 1 Master + 1 Worker, each on a node of its own, the
    shared claim mounted where CHECKPOINT_DIR says."""
    trainer = dict(job_body(name, claim)["spec"]["template"]["spec"]["containers"][0], name="pytorch")
    trainer["env"] = [{"name": "CHECKPOINT_DIR", "value": "/checkpoints"}]
    trainer["volumeMounts"] = [{"name": "checkpoints", "mountPath": "/checkpoints"}]
    spread = {"labelSelector": {"matchLabels": {JOB_LABEL: name}}, "topologyKey": "kubernetes.io/hostname"}
    pod = {
        "terminationGracePeriodSeconds": 5,
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [spread]}},
        "containers": [trainer],
        "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}],
    }
    replica = {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": pod}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replica, "Worker": replica}}}  # fmt: skip


class PeerTrial:
    def __init__(self, box: Box, api: Any, client: Api, namespace: str, index: int, fault: str) -> None:
        from kubernetes import client as k8s

        self.box, self.client, self.namespace, self.fault = box, client, namespace, fault
        self.core = k8s.CoreV1Api(api)
        self.name, self.claim = f"peer-{index}", f"peer-ckpt-{index}"

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_LABEL}={self.name}").items)

    def stepped_since(self, when: float) -> set[str]:
        """The uids of the job's pods that logged a step at ``when`` or later (every node's pod logs)."""
        return {
            uid
            for node in self.box.nodes
            for t, uid, _, text in pod_lines(node.layout.pod_logs, self.namespace, self.name, container="pytorch")
            if t >= when and "step=" in text
        }

    def run(self, watch: float) -> dict[str, Any]:
        self.core.create_namespaced_persistent_volume_claim(self.namespace, shared_claim(self.claim))
        self.client.post(pytorchjobs_path(self.namespace), pytorchjob(self.name, self.claim))
        end = time.monotonic() + 300

        def training() -> bool:
            found = self.pods()
            return len(found) == 2 and all(p.status.phase == "Running" for p in found) and bool(self.stepped_since(0))

        wait_until("the PyTorchJob to train", training, lambda: end)
        claim = self.core.read_namespaced_persistent_volume_claim(self.claim, self.namespace)
        directory = Path(self.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)
        wait_until("a checkpoint", lambda: list(directory.glob("step-*.pt")), lambda: end)
        worker = next(p for p in self.pods() if p.metadata.labels[REPLICA_LABEL] == "worker")
        victim = self.box.node_named(worker.spec.node_name)
        log(f"{self.name}: cutting {self.fault} of {victim.name}, the Worker's node")
        cut, cut_at = time.monotonic(), time.time()
        cut_node(self.core, victim, self.fault)
        states: list[list[Any]] = []
        again: float | None = None
        stepped: list[str] = []
        try:
            while time.monotonic() - cut < watch:
                pods = {p.metadata.uid: p for p in self.pods()}
                state = [[p.metadata.name, p.spec.node_name, p.status.phase, bool(p.metadata.deletion_timestamp)]
                         for p in pods.values()]  # fmt: skip
                if not states or states[-1][1] != state:
                    states.append([round(time.monotonic() - cut, 1), state])
                after = [pods[u] for u in self.stepped_since(cut_at) if u in pods]
                stepped = sorted(p.metadata.name for p in after)
                elsewhere = {p.metadata.labels[REPLICA_LABEL] for p in after if p.spec.node_name != victim.name}
                if elsewhere == {"master", "worker"}:
                    again = time.monotonic() - cut
                    break
                time.sleep(2)
        finally:
            bring_back_node(self.core, victim, self.fault)
        said = (
            f"training again elsewhere {again:.1f}s after the cut"
            if again
            else f"not training elsewhere in {watch:.0f}s"
        )
        log(f"{self.name}: {said}")
        return {
            "fault": self.fault,
            "node": victim.name,
            "seconds_to_training_again_elsewhere": round(again, 1) if again is not None else None,
            "watched_s": watch,
            "pod_states": states,
            "pods_that_stepped_after_the_cut": stepped,
        }


def _say_where_things_stood(api: Any, namespace: str, operator: TrainingOperator) -> None:
    """The namespace's pods and training-operator's log tail: what a trial that did not get going stood on."""
    from kubernetes import client as k8s

    for pod in k8s.CoreV1Api(api).list_namespaced_pod(namespace).items:
        log(f"pod {pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase} {pod.status.container_statuses}")
    log(f"training-operator log (tail):\n{tail(operator.log_path, 30)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_loss_peer", description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=("power", "network", "both"), default="both")
    parser.add_argument("--watch", type=float, default=600, help="seconds to watch after each cut")
    parser.add_argument("--grace", default="10s", help="the controller-manager's --node-monitor-grace-period")
    args = parser.parse_args(argv)
    from kubernetes import config

    toolchain.ensure(toolchain.training_operator_build())  # before the box: a cold build takes minutes
    faults = ["power", "network"] if args.fault == "both" else [args.fault]
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ddpjob-node-loss-peer-") as tmp:
        grace = [f"--node-monitor-grace-period={args.grace}", "--node-monitor-period=2s"]
        box = Box(data_dir=Path(tmp) / "box", node_count=3, with_prometheus=False, with_proxy=False,
                  controller_manager_args=grace)  # fmt: skip
        with box:
            assert box.plane is not None
            client = Api(box.plane.server, box.plane.admin_token, str(box.plane.ca_file))
            install_training_operator(client)
            template = Path(tmp) / "init-container.yaml"
            template.write_text(INIT_CONTAINER)
            flags = [f"--pytorch-init-container-template-file={template}",
                     f"--pytorch-init-container-image={images.image_name('trainer')}"]  # fmt: skip
            operator = TrainingOperator(client, box.plane.kubeconfig, Path(tmp) / "training-operator.log", flags)
            api = config.new_client_from_config(config_file=str(box.plane.kubeconfig))
            namespace = "node-loss-peer"
            client.create_if_absent("/api/v1/namespaces", {"metadata": {"name": namespace}})
            try:
                for index, fault in enumerate(faults):
                    result = PeerTrial(box, api, client, namespace, index, fault).run(args.watch)
                    log(json.dumps(result))
                    trials.append(result)
            finally:
                operator.stop()
                _say_where_things_stood(api, namespace, operator)
    rows = [
        [t["fault"], t["node"], t["seconds_to_training_again_elsewhere"] or f"not within {t['watched_s']:.0f} s",
         ", ".join(t["pods_that_stepped_after_the_cut"]) or "none"]
        for t in trials
    ]  # fmt: skip
    markdown = table(["cut", "node", "cut -> both ranks training elsewhere, s", "pods that logged a step after"], rows)
    print(markdown)
    write_results("node_loss_peer", {"machine": machine(), "grace": args.grace, "trials": trials}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
