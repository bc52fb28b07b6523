"""What each chaos run is made of: its job (the DDPJob's body, and where it lives: ``JobRef``), its namespace's
Kueue queues with ``--kueue``, and its record (``Run``), which the invariants check and the runner writes out; with
the job's numbers (its steps, its backoffLimit, none to spare in every 8th run) and the queue and priorities it
goes under."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpjob_box import images
from ddpjob_contract.kueue import ANNOTATION_REQUIRED_TOPOLOGY, LABEL_PRIORITY_CLASS, LABEL_QUEUE_NAME

SLOT = "example.com/slot"
GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
STEPS = 120
BACKOFF_LIMIT = 5
SPARELESS_EVERY = 8
"""Every 8th run's job has ``backoffLimit: 0``: a fault that costs a restart must end it Failed with
BackoffLimitExceeded instead."""
QUEUE, LOW, HIGH = "user-queue", "low-priority", "high-priority"


@dataclass
class Run:
    seed: int
    run: int
    faults: list[str]
    outcome: str = ""
    restarts: int = -1
    step: int = -1
    reason: str = ""
    """The reason on the condition the job ended with."""
    backoff_limit: int = BACKOFF_LIMIT
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Faults not injected (the job had ended, or the rank's process had just gone), or a pod deleted too late
    to cost a restart (every rank of that attempt had already exited 0)."""
    timeline: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    operator_log: str = ""
    removals: list[str] = field(default_factory=list)
    """On a violation, every deletion of this job's pods, Service and PodGroups, and every change to its
    PodGroups (a finalizer's removal), that the apiserver answered: when, who, which."""
    alongside: list[int] = field(default_factory=list)
    """The runs of the same seed that went on at some moment of this one."""
    node_hits: int = 0
    """Other runs' node cuts under a live rank of this run's job: each may cost it one restart more."""
    status: dict[str, Any] = field(default_factory=dict)
    """On a violation, the job's status as the run ended (its progress: each rank's last step and poll error)."""
    pods: list[str] = field(default_factory=list)
    """On a violation, each of the job's pods (phase, node, each container's state), and under Kueue its Workloads and
    ClusterQueue."""

    @property
    def replay(self) -> str:
        together = ",".join(f"{self.seed}:{run}" for run in sorted({self.run, *self.alongside}))
        return f"python -m bench.chaos --replay {together}"


def backoff_limit(index: int) -> int:
    return 0 if index % SPARELESS_EVERY == SPARELESS_EVERY - 1 else BACKOFF_LIMIT


def chaos_job(
    name: str, claim: str, backoff_limit: int, *, kueue: bool = False, rack: str = "", avoid: str = ""
) -> dict[str, Any]:
    """The run's job; with ``kueue``, queued in the namespace's LocalQueue at low priority, a slot per rank; with
    ``rack`` (a node label), placed by Kueue's topology-aware scheduling, every rank in one domain of it; ``avoid``:
    a node its ranks never go to (the one that runs Kueue's manager, which node faults spare)."""
    args = ["--model", "tinycnn", "--image-size", "16", "--batch-size", "8", "--num-workers", "0",
            "--log-interval", "5", "--steps", str(STEPS), "--checkpoint-interval", "10",
            "--slow-rank", "0", "--slow-seconds", "0.15", "--pg-timeout-seconds", "60"]  # fmt: skip
    container: dict[str, Any] = {"name": "trainer", "image": images.image_name("trainer"), "args": args}
    labels = {}
    if kueue:
        labels = {LABEL_QUEUE_NAME: QUEUE, LABEL_PRIORITY_CLASS: LOW}
        container["resources"] = {"requests": {SLOT: "1"}, "limits": {SLOT: "1"}}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 5, "containers": [container]}
    if avoid:
        away = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [avoid]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [away]}]}}}  # fmt: skip
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DDPJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 2,
            "progressDeadlineSeconds": 20,  # a hung (SIGSTOPped) rank is restarted well before the 60 s timeout
            "runPolicy": {"backoffLimit": backoff_limit},
            "checkpoint": {"claimName": claim},
            "template": {
                "metadata": {"annotations": {ANNOTATION_REQUIRED_TOPOLOGY: rack} if rack else {}},
                "spec": spec,
            },
        },
    }


@dataclass(frozen=True)
class JobRef:
    """Where a run's job lives: its namespace (the run's alone while it goes on), its name and its checkpoints'
    PVC."""

    namespace: str
    name: str
    claim: str


def kueue_queues(namespace: str, flavor: str = "chaos-flavor") -> list[tuple[str, dict[str, Any]]]:
    """(plural, body): a ClusterQueue of 2 slots of ``flavor`` for this namespace alone, its LocalQueue (namespaced),
    and what they share (a flavor, the two priorities: made once, 409 after). The box's topology flavor
    (``ddpjob_box.topology.TOPOLOGY_NAME``) places the namespace's jobs by topology."""
    api = "kueue.x-k8s.io/v1beta2"
    quota = [{"name": "cpu", "nominalQuota": 8}, {"name": "memory", "nominalQuota": "16Gi"},
             {"name": SLOT, "nominalQuota": 2}]  # fmt: skip
    cluster_queue = {
        "apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": f"cq-{namespace}"},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", SLOT],
                                     "flavors": [{"name": flavor, "resources": quota}]}]},
    }  # fmt: skip
    return [
        ("resourceflavors", {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": "chaos-flavor"}}),
        ("workloadpriorityclasses", {"apiVersion": api, "kind": "WorkloadPriorityClass", "metadata": {"name": LOW},
                                     "value": 100}),
        ("workloadpriorityclasses", {"apiVersion": api, "kind": "WorkloadPriorityClass", "metadata": {"name": HIGH},
                                     "value": 10000}),
        ("clusterqueues", cluster_queue),
        ("localqueues", {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": namespace},
                         "spec": {"clusterQueue": f"cq-{namespace}"}}),
    ]  # fmt: skip
