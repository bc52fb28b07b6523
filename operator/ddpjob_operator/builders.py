"""Pure: the desired Service and Pods of a job, as plain dicts ready for the API.

Nothing here talks to a cluster; every function is data in, data out.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from ddpjob_contract import kueue
from ddpjob_contract.exits import SIGNAL_EXIT_BASE
from ddpjob_contract.pods import (
    ANNOTATION_EXCLUDED_NODES,
    ANNOTATION_RESTART_COUNT,
    ANNOTATION_SPEC_HASH,
    DEFAULT_TERMINATION_GRACE_SECONDS,
    DEFAULT_TERMINATION_MESSAGE_PATH,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_JOB_NAME,
    ENV_LOCAL_RANK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_MAX_RESTARTS,
    ENV_METRICS_PORT,
    ENV_PET_MASTER_ADDR,
    ENV_PET_MASTER_PORT,
    ENV_PET_NNODES,
    ENV_PET_NODE_RANK,
    ENV_PET_NPROC_PER_NODE,
    ENV_POD_IPS,
    ENV_PYTHONUNBUFFERED,
    ENV_RANK,
    ENV_RANK_ADDR,
    ENV_TERMINATION_GRACE_SECONDS,
    ENV_TERMINATION_MESSAGE_PATH,
    ENV_WORLD_SIZE,
    LABEL_ATTEMPT,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    LABEL_RANK,
    MANAGED_BY,
    POD_GROUP_API,
)
from ddpjob_operator import api, topology, wait_for_master
from ddpjob_operator.api import Job
from ddpjob_operator.queueing import workload_name
from ddpjob_operator.status import PodView


def pod_name(job_name: str, rank: int) -> str:
    return f"{job_name}-{rank}"


def rank_addr(job_name: str, rank: int) -> str:
    """A rank's name through the headless Service; resolvable once its pod has an address."""
    return f"{pod_name(job_name, rank)}.{job_name}"


def master_addr(job_name: str) -> str:
    """Rank 0's name: what every rank meets at."""
    return rank_addr(job_name, 0)


def selector(job_name: str) -> dict[str, str]:
    return {LABEL_JOB_NAME: job_name, LABEL_MANAGED_BY: MANAGED_BY}


def owner_reference(job: Job) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_group_name(job_name: str, attempt: int) -> str:
    return f"{job_name}-attempt-{attempt}"


def pod_group(job: Job, attempt: int) -> dict[str, Any]:
    """The gang of attempt ``attempt``: the scheduler binds all ``replicas`` pods at once or none, and
    preempts them together (disruptionMode all), at the pods' priority."""
    spec: dict[str, Any] = {
        "schedulingPolicy": {"gang": {"minCount": job.spec.replicas}},
        "disruptionMode": {"all": {}},
    }
    priority_class = (job.spec.template.get("spec") or {}).get("priorityClassName")
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": POD_GROUP_API,
        "kind": "PodGroup",
        "metadata": {
            "name": pod_group_name(job.name, attempt),
            "namespace": job.namespace,
            "labels": {**selector(job.name), LABEL_ATTEMPT: str(attempt)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def service(job: Job) -> dict[str, Any]:
    """The headless Service that gives every rank the DNS name `<job>-<rank>.<job>`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": selector(job.name),
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            # Ranks must find each other before any of them is ready.
            "publishNotReadyAddresses": True,
            "selector": selector(job.name),
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in (("rendezvous", job.spec.port), ("metrics", job.spec.metrics_port))
            ],
        },
    }


def injected_env(job: Job, rank: int, attempt: int) -> list[dict[str, str]]:
    """The rendezvous contract (docs/reference.md#environment-contract). RANK and LOCAL_RANK only with one process
    per pod; with more, torchrun derives them from the PET_* variables."""
    spec = job.spec
    master = master_addr(job.name)
    env = {
        ENV_MASTER_ADDR: master,
        ENV_MASTER_PORT: str(spec.port),
        ENV_WORLD_SIZE: str(spec.world_size),
    }
    if spec.nproc_per_node == 1:
        env[ENV_RANK] = str(rank)
        env[ENV_LOCAL_RANK] = "0"
    env |= {
        ENV_PET_NNODES: str(spec.replicas),
        ENV_PET_NPROC_PER_NODE: str(spec.nproc_per_node),
        ENV_PET_NODE_RANK: str(rank),
        ENV_PET_MASTER_ADDR: master,
        ENV_PET_MASTER_PORT: str(spec.port),
        ENV_JOB_NAME: job.name,
        ENV_ATTEMPT: str(attempt),
    }
    if spec.checkpoint is not None:
        env[ENV_CHECKPOINT_DIR] = spec.checkpoint.mount_path
    env[ENV_METRICS_PORT] = str(spec.metrics_port)
    env[ENV_PYTHONUNBUFFERED] = "1"
    return [{"name": k, "value": v} for k, v in env.items()]


METRICS_PORT_NAME = "metrics"
RENDEZVOUS_PORT_NAME = "rendezvous"


def named_ports(job: Job, ports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template's ports plus `metrics` (process 0's /metrics, what a PodMonitor scrapes) and
    `rendezvous`, each unless the template already declares that name or number."""
    taken_names = {p.get("name") for p in ports}
    taken_numbers = {p.get("containerPort") for p in ports}
    added = [
        {"name": name, "containerPort": number, "protocol": "TCP"}
        for name, number in ((METRICS_PORT_NAME, job.spec.metrics_port), (RENDEZVOUS_PORT_NAME, job.spec.port))
        if name not in taken_names and number not in taken_numbers
    ]
    return [*ports, *added]


GRACE_MARGIN_SECONDS = 10
"""Beyond a step and two saves: the trainer's own deadline keeps up to 5 s for its exit, and the rest is slack."""


def termination_grace(job: Job, save_seconds: float | None, step_seconds: float | None) -> int:
    """The rank pods' terminationGracePeriodSeconds: the template's when it sets one (the user's word); else
    Kubernetes's 30 s, or, when it is longer, room for what a stop does before it exits: finish the step under
    way and the next (the ranks' vote on the stop is read a step after it starts), save one checkpoint (twice the
    last measured save, as a disk may be slower now) and the margin."""
    own = job.spec.template.get("spec", {}).get("terminationGracePeriodSeconds")
    if isinstance(own, int) and not isinstance(own, bool):
        return own
    if not save_seconds:
        return DEFAULT_TERMINATION_GRACE_SECONDS
    need = math.ceil(2 * (step_seconds or 0.0) + 2 * save_seconds) + GRACE_MARGIN_SECONDS
    return max(DEFAULT_TERMINATION_GRACE_SECONDS, need)


RESTART_ALL_CONTAINERS = "RestartAllContainers"


def restart_rules(policy: api.RunPolicy) -> list[dict[str, Any]]:
    """The trainer's restart rules for an in-place gang restart: an exit the restart policy retries restarts every
    container of its pod, init containers included, in the same pod (Kubernetes 1.36+); any other exit ends the
    pod as before. None (an empty list) under ``Never``."""
    if policy.restart_policy is api.RestartPolicy.NEVER:
        return []
    if policy.restart_policy is api.RestartPolicy.ON_FAILURE:
        codes: dict[str, Any] = {"operator": "NotIn", "values": [0]}
    else:  # ExitCode: signals and the trainer's retryable code, and the codes the spec adds (at most 255 in all)
        codes = {"operator": "In", "values": sorted(set(range(SIGNAL_EXIT_BASE, 256)) | policy.retryable_exit_codes)}
    return [{"action": RESTART_ALL_CONTAINERS, "exitCodes": codes}]


def adoption(pod: PodView, attempt: int) -> dict[str, Any]:
    """The merge patch that moves a pod restarted in place into ``attempt``: its attempt label, and the trainer's
    restartCount that begins it (``ANNOTATION_RESTART_COUNT``). Its uid makes it a precondition: never a newer pod
    of that name."""
    return {"metadata": {"uid": pod.uid, "labels": {LABEL_ATTEMPT: str(attempt)},
                         "annotations": {ANNOTATION_RESTART_COUNT: str(pod.next_count)}}}  # fmt: skip


def _set_up_trainer(job: Job, trainer: dict[str, Any], rank: int, attempt: int, grace: int, restarts_left: int) -> None:
    """The trainer container (the first): the injected env, the exit message, the named ports."""
    # The exit message: the trainer's summary or one-line error; any other program's log tail on failure.
    trainer.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    message_path = trainer.setdefault("terminationMessagePath", DEFAULT_TERMINATION_MESSAGE_PATH)
    # Injected first, so that user variables may refer to them as $(RANK), $(MASTER_ADDR)...
    trainer["env"] = [
        *injected_env(job, rank, attempt),
        {"name": ENV_TERMINATION_MESSAGE_PATH, "value": message_path},
        {"name": ENV_TERMINATION_GRACE_SECONDS, "value": str(grace)},
        {"name": ENV_MAX_RESTARTS, "value": str(restarts_left)},
        # The trainer's fence: it is its rank while this name resolves to this pod (ddp_trainer.fence).
        {"name": ENV_RANK_ADDR, "value": rank_addr(job.name, rank)},
        {"name": ENV_POD_IPS, "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
        *(trainer.get("env") or []),
    ]
    # Named ports are how scrapers find the trainer's metrics (the chart's PodMonitor, the box's Prometheus).
    trainer["ports"] = named_ports(job, trainer.get("ports") or [])


def pod(
    job: Job,
    rank: int,
    attempt: int,
    *,
    gang: bool,
    grace: int = DEFAULT_TERMINATION_GRACE_SECONDS,
    in_place: bool = False,
    restarts_left: int = 0,
) -> dict[str, Any]:
    """Rank ``rank`` of attempt ``attempt``: the template, plus identity, env, checkpoint and wait;
    ``gang``: a member of the attempt's PodGroup; ``grace``: its termination grace period
    (``termination_grace``), which the trainer is told, to save within it on a stop; ``in_place``: its kubelet
    restarts it in place on a retryable exit (``restart_rules``); ``restarts_left``: how many times the ranks' own
    supervisors may restart the gang's processes in place (``MAX_RESTARTS``, ``in_place.in_process``)."""
    template = copy.deepcopy(dict(job.spec.template))
    name = pod_name(job.name, rank)
    metadata = _pod_metadata(job, template.get("metadata") or {}, name, rank, attempt)
    spec: dict[str, Any] = template["spec"]
    _place(spec, job, name, attempt, gang=gang, grace=grace)
    trainer = spec["containers"][0]
    _set_up_trainer(job, trainer, rank, attempt, grace, restarts_left)
    rules = restart_rules(job.spec.run_policy) if in_place else []
    if rules:
        trainer["restartPolicy"] = "Never"  # a container's rules need its own policy; the rules override it
        trainer["restartPolicyRules"] = rules
    if job.spec.checkpoint is not None:
        _mount_checkpoint(spec, trainer, job.spec.checkpoint)
    if job.spec.wait_for_master_seconds > 0:
        wait = wait_for_master.container(job, trainer, rank, master=master_addr(job.name))
        spec["initContainers"] = [wait, *(spec.get("initContainers") or [])]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _pod_metadata(job: Job, meta: dict[str, Any], name: str, rank: int, attempt: int) -> dict[str, Any]:
    """A rank pod's name and namespace; the template's labels and annotations, plus its rank, attempt and spec
    hash; its owner, the job."""
    labels = {
        **(meta.get("labels") or {}),
        **selector(job.name),
        LABEL_RANK: str(rank),
        LABEL_ATTEMPT: str(attempt),
    }
    annotations = {**(meta.get("annotations") or {}), ANNOTATION_SPEC_HASH: job.spec.spec_hash}
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner_reference(job)],
    }


def _place(spec: dict[str, Any], job: Job, name: str, attempt: int, *, gang: bool, grace: int) -> None:
    """The pod spec's name in the headless Service, restart policy and grace period; ``gang``: its PodGroup."""
    spec["hostname"] = name
    spec["subdomain"] = job.name
    # The operator restarts the whole gang; the kubelet restarting one rank in place would not help.
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = grace
    if gang:
        spec["schedulingGroup"] = {"podGroupName": pod_group_name(job.name, attempt)}


def _mount_checkpoint(spec: dict[str, Any], trainer: dict[str, Any], checkpoint: api.Checkpoint) -> None:
    """The checkpoint's volume (its claim, or an emptyDir) in the pod spec, mounted in the trainer."""
    source = (
        {"persistentVolumeClaim": {"claimName": checkpoint.claim_name}}
        if checkpoint.claim_name is not None
        else {"emptyDir": dict(checkpoint.empty_dir or {})}
    )
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": api.CHECKPOINT_VOLUME, **source}]
    mount = {"name": api.CHECKPOINT_VOLUME, "mountPath": checkpoint.mount_path}
    trainer["volumeMounts"] = [*(trainer.get("volumeMounts") or []), mount]


@dataclass(frozen=True)
class Priority:
    """The WorkloadPriorityClass a job names, and its value."""

    name: str
    value: int


HOSTNAME_LABEL = "kubernetes.io/hostname"


def avoiding(pod: dict[str, Any], nodes: tuple[str, ...]) -> dict[str, Any]:
    """The pod kept off ``nodes`` (``status.excludedNodes``): a required node affinity on the hostname label.

    The terms of ``requiredDuringSchedulingIgnoredDuringExecution`` are ORed, so the exclusion joins each of the
    template's own terms (a template with none gets one); the template's other affinities are kept."""
    if not nodes:
        return pod
    pod.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_EXCLUDED_NODES] = ",".join(sorted(nodes))
    rule = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(nodes)}
    affinity = pod.setdefault("spec", {}).setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), rule]}
                                     for t in terms]  # fmt: skip
    return pod


def workload(job: Job, priority: Priority | None) -> dict[str, Any]:
    """The job's Kueue Workload: one pod set of every rank (``count`` = replicas, ``minCount`` = minReplicas),
    from rank 0's pod as built, in the job's LocalQueue; owned by the job, held by Kueue's finalizer. The template's
    topology annotations make its ``topologyRequest`` (``topology.request``)."""
    rank0 = pod(job, 0, 0, gang=False)
    meta = rank0["metadata"]
    pod_set: dict[str, Any] = {
        "name": kueue.POD_SET,
        "count": job.spec.replicas,
        # A Workload's template may carry only labels and annotations of the pod's metadata.
        "template": {"metadata": {"labels": meta["labels"], "annotations": meta["annotations"]}, "spec": rank0["spec"]},
    }
    if job.spec.min_replicas is not None and job.spec.min_replicas < job.spec.replicas:
        pod_set["minCount"] = job.spec.min_replicas
    placed_by = topology.request((job.spec.template.get("metadata") or {}).get("annotations") or {})
    if placed_by is not None:
        pod_set["topologyRequest"] = placed_by
    spec: dict[str, Any] = {"queueName": job.queue, "podSets": [pod_set]}
    if priority is not None:
        spec["priorityClassRef"] = {"group": kueue.GROUP, "kind": "WorkloadPriorityClass", "name": priority.name}
        spec["priority"] = priority.value
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job.name, job.uid),
            "namespace": job.namespace,
            "labels": {**selector(job.name), kueue.LABEL_JOB_UID: job.uid},
            "finalizers": [kueue.FINALIZER],
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }
