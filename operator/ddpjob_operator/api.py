"""The DDPJob API: constants of the contract, and the spec parsed once into frozen dataclasses.

The CRD (helm/ddpjob/crds/ddpjob.yaml) refuses bad specs at admission; ``parse_job`` trusts
what the apiserver accepted but still raises ``SpecError`` (one line, naming the field) instead
of crashing when it meets an object no valid CRD would have admitted.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ddpjob_contract import kueue
from ddpjob_contract.pods import RESERVED_ENV

GROUP = "ddpjob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DDPJob"
PLURAL = "ddpjobs"
SHORT_NAME = "ddpj"

Key = tuple[str, str]
"""A DDPJob by namespace and name: how the work queue, the pod cache and the poller know it."""

# Names the operator adds to the pod; the CRD refuses a template that uses them.
CHECKPOINT_VOLUME = "ddpjob-checkpoint"
WAIT_CONTAINER = "ddpjob-wait-for-master"
GPU_RESOURCE = "nvidia.com/gpu"

# Limits; the CRD states the same numbers (a unit test keeps them in step).
MAX_REPLICAS = 1024
MAX_NPROC_PER_NODE = 64
MAX_BACKOFF_LIMIT = 100
MAX_LABEL = 63  # `<job>-<rank>` is the pod's hostname: a DNS-1123 label
DEFAULT_PORT = 29500
DEFAULT_METRICS_PORT = 9090
DEFAULT_BACKOFF_LIMIT = 3
DEFAULT_WAIT_FOR_MASTER_SECONDS = 300
DEFAULT_CHECKPOINT_MOUNT = "/checkpoints"
DEFAULT_STRAGGLER_FACTOR = 2.0
DEFAULT_STRAGGLER_WINDOW_SECONDS = 60
MAX_STRAGGLER_FACTOR = 1000.0
# Spec fields that pods are not built from: editable at any time, left out of the spec hash.
UNBUILT_FIELDS = frozenset({"runPolicy", "progressDeadlineSeconds", "straggler", "minReplicas"})

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class SpecError(ValueError):
    """A spec the operator cannot run; the message names the field and is shown in the status."""


class RestartPolicy(StrEnum):
    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    EXIT_CODE = "ExitCode"


class CleanPodPolicy(StrEnum):
    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class GangScheduling(StrEnum):
    """How the ranks are placed: all or nothing through a PodGroup, or one by one."""

    AUTO = "Auto"
    """A PodGroup when the cluster serves the API; else one by one, and the status says so."""
    REQUIRED = "Required"
    """A PodGroup, or the job fails at once saying the cluster does not serve the API."""
    DISABLED = "Disabled"
    """One by one: the default scheduler may bind some ranks while others wait."""


class InPlaceRestart(StrEnum):
    """How a retryable failure restarts the gang: in the pods it has, or in new ones."""

    AUTO = "Auto"
    """In place where the cluster supports restart rules with RestartAllContainers (Kubernetes 1.36+, beta); else
    by deleting and recreating the pods."""
    DISABLED = "Disabled"
    """Always by deleting and recreating the pods."""


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    """Gang restarts allowed before the job fails with BackoffLimitExceeded."""
    restart_policy: RestartPolicy = RestartPolicy.EXIT_CODE
    """Which failures restart the gang: none, all, or by exit code."""
    retryable_exit_codes: frozenset[int] = frozenset()
    """With ExitCode: codes below 128 that are retried too (codes >= 128 always are)."""
    active_deadline_seconds: int | None = None
    """Seconds from start (or resume) after which the job fails with DeadlineExceeded."""
    ttl_seconds_after_finished: int | None = None
    """Seconds after completion after which the job is deleted."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Which pods are deleted once the job has finished."""
    suspend: bool = False
    """Delete the pods and keep the job; clearing it starts a new attempt."""
    in_place_restart: InPlaceRestart = InPlaceRestart.AUTO


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    mount_path: str = DEFAULT_CHECKPOINT_MOUNT
    """Where the volume is mounted in every rank; injected as CHECKPOINT_DIR."""
    claim_name: str | None = None
    """A PersistentVolumeClaim shared by all ranks (needs ReadWriteMany across nodes)."""
    empty_dir: Mapping[str, Any] | None = None
    """An emptyDir source (e.g. {"sizeLimit": "1Gi"}); survives container, not pod, restarts."""


@dataclass(frozen=True, kw_only=True)
class StragglerPolicy:
    factor: float = DEFAULT_STRAGGLER_FACTOR
    """A rank is a straggler when its work time per step exceeds the others' median by this factor."""
    window_seconds: int = DEFAULT_STRAGGLER_WINDOW_SECONDS
    """... and stays so for this long."""


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    replicas: int
    nproc_per_node: int
    """Processes per pod, with ``auto`` already resolved from the GPU request."""
    port: int = DEFAULT_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    wait_for_master_seconds: int = DEFAULT_WAIT_FOR_MASTER_SECONDS
    template: Mapping[str, Any] = field(default_factory=dict)
    run_policy: RunPolicy = field(default_factory=RunPolicy)
    checkpoint: Checkpoint | None = None
    progress_deadline_seconds: int | None = None
    """Restart the gang (NoProgress) when no rank advances its step for this long; None: never."""
    straggler: StragglerPolicy = field(default_factory=StragglerPolicy)
    gang_scheduling: GangScheduling = GangScheduling.AUTO
    min_replicas: int | None = None
    """Under Kueue: the fewest ranks the job may run with when the quota admits fewer than ``replicas``."""
    spec_hash: str = ""
    """Hash of the fields pods are built from (replicas, template, ports, checkpoint...)."""

    @property
    def world_size(self) -> int:
        return self.replicas * self.nproc_per_node

    @property
    def trainer_container(self) -> str:
        return str(self.template["spec"]["containers"][0]["name"])


@dataclass(frozen=True, kw_only=True)
class Job:
    namespace: str
    name: str
    uid: str
    generation: int
    spec: JobSpec
    queue: str = ""
    """The Kueue LocalQueue that queues the job (its kueue.x-k8s.io/queue-name label); empty: not queued."""
    priority_class: str = ""
    """The WorkloadPriorityClass named by its kueue.x-k8s.io/priority-class label."""


def _int(spec: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int, path: str) -> int | None:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(f"{path}.{key}: must be an integer from {lo} to {hi}, got {value!r}")
    return value


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path}: must be an object, got {type(value).__name__}")
    return value


def gpus_requested(container: Mapping[str, Any]) -> int:
    """GPUs the container asks for (limits win over requests, as the scheduler reads them); 0 if none."""
    resources = _mapping(container.get("resources"), "resources")
    for section in ("limits", "requests"):
        value = _mapping(resources.get(section), section).get(GPU_RESOURCE)
        if value is not None:
            try:
                return max(0, int(str(value)))
            except ValueError:
                return 0
    return 0


def _nproc(value: Any, trainer: Mapping[str, Any]) -> int:
    if value is None:
        return 1
    if value == "auto":
        return max(1, gpus_requested(trainer))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NPROC_PER_NODE:
        raise SpecError(f'spec.nprocPerNode: must be 1 to {MAX_NPROC_PER_NODE} or "auto", got {value!r}')
    return value


def _template(value: Any) -> dict[str, Any]:
    template = copy.deepcopy(dict(_mapping(value, "spec.template")))
    pod_spec = _mapping(template.get("spec"), "spec.template.spec")
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], Mapping):
        raise SpecError("spec.template.spec.containers: needs at least one container (the trainer)")
    trainer = containers[0]
    if not isinstance(trainer.get("name"), str) or not trainer["name"]:
        raise SpecError("spec.template.spec.containers[0].name: must be set")
    if not isinstance(trainer.get("image"), str) or not trainer["image"].strip():
        raise SpecError("spec.template.spec.containers[0].image: must not be empty")
    for env in trainer.get("env") or []:
        if isinstance(env, Mapping) and env.get("name") in RESERVED_ENV:
            raise SpecError(f"spec.template.spec.containers[0].env: {env['name']} is reserved (set by the operator)")
    return template


def _run_policy(value: Any) -> RunPolicy:
    rp = _mapping(value, "spec.runPolicy")
    path = "spec.runPolicy"
    try:
        restart = RestartPolicy(rp.get("restartPolicy", RestartPolicy.EXIT_CODE))
        clean = CleanPodPolicy(rp.get("cleanPodPolicy", CleanPodPolicy.RUNNING))
    except ValueError as err:
        raise SpecError(f"{path}: {err}") from None
    codes = rp.get("retryableExitCodes") or []
    if not isinstance(codes, list) or not all(isinstance(c, int) and 1 <= c <= 255 for c in codes):
        raise SpecError(f"{path}.retryableExitCodes: must be a list of integers from 1 to 255")
    backoff = _int(rp, "backoffLimit", DEFAULT_BACKOFF_LIMIT, 0, MAX_BACKOFF_LIMIT, path)
    return RunPolicy(
        backoff_limit=backoff if backoff is not None else DEFAULT_BACKOFF_LIMIT,
        restart_policy=restart,
        retryable_exit_codes=frozenset(codes),
        active_deadline_seconds=_int(rp, "activeDeadlineSeconds", None, 1, 2**31 - 1, path),
        ttl_seconds_after_finished=_int(rp, "ttlSecondsAfterFinished", None, 0, 2**31 - 1, path),
        clean_pod_policy=clean,
        suspend=rp.get("suspend") is True,
        in_place_restart=_in_place(rp.get("inPlaceRestart"), path),
    )


def _in_place(value: Any, path: str) -> InPlaceRestart:
    try:
        return InPlaceRestart(value if value is not None else InPlaceRestart.AUTO)
    except ValueError:
        allowed = ", ".join(v.value for v in InPlaceRestart)
        raise SpecError(f"{path}.inPlaceRestart: must be one of {allowed}, got {value!r}") from None


def _checkpoint(value: Any) -> Checkpoint | None:
    if value is None:
        return None
    cp = _mapping(value, "spec.checkpoint")
    claim = cp.get("claimName")
    empty = cp.get("emptyDir")
    if (claim is None) == (empty is None):
        raise SpecError("spec.checkpoint: set exactly one of claimName and emptyDir")
    mount = cp.get("mountPath", DEFAULT_CHECKPOINT_MOUNT)
    if not isinstance(mount, str) or not mount.startswith("/"):
        raise SpecError("spec.checkpoint.mountPath: must be an absolute path")
    return Checkpoint(
        mount_path=mount,
        claim_name=str(claim) if claim is not None else None,
        empty_dir=dict(_mapping(empty, "spec.checkpoint.emptyDir")) if empty is not None else None,
    )


def _straggler(value: Any) -> StragglerPolicy:
    st = _mapping(value, "spec.straggler")
    factor = st.get("factor", DEFAULT_STRAGGLER_FACTOR)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 < factor <= MAX_STRAGGLER_FACTOR:
        raise SpecError(f"spec.straggler.factor: must be a number above 1 and at most {MAX_STRAGGLER_FACTOR:g}")
    window = _int(st, "windowSeconds", DEFAULT_STRAGGLER_WINDOW_SECONDS, 1, 86400, "spec.straggler")
    assert window is not None
    return StragglerPolicy(factor=float(factor), window_seconds=window)


def _gang_scheduling(value: Any) -> GangScheduling:
    try:
        return GangScheduling(value if value is not None else GangScheduling.AUTO)
    except ValueError:
        allowed = ", ".join(g.value for g in GangScheduling)
        raise SpecError(f"spec.gangScheduling: must be one of {allowed}, got {value!r}") from None


def spec_hash(spec: Mapping[str, Any]) -> str:
    """Stable hash of every spec field a pod is built from; the editable policies are left out."""
    built_from = {k: v for k, v in spec.items() if k not in UNBUILT_FIELDS}
    return hashlib.sha256(json.dumps(built_from, sort_keys=True, default=str).encode()).hexdigest()[:16]


def max_name_length(replicas: int) -> int:
    """Longest job name for which `<job>-<max rank>` is still a DNS-1123 label."""
    return MAX_LABEL - 1 - len(str(max(replicas, 1) - 1))


def parse_spec(name: str, spec: Mapping[str, Any]) -> JobSpec:
    replicas = _int(spec, "replicas", None, 1, MAX_REPLICAS, "spec")
    if replicas is None:
        raise SpecError("spec.replicas: required")
    if not _DNS1035.match(name) or len(name) > max_name_length(replicas):
        raise SpecError(
            f"metadata.name: must be a DNS-1035 label of at most {max_name_length(replicas)} characters "
            f"so that `<name>-{replicas - 1}` fits in 63"
        )
    template = _template(spec.get("template"))
    trainer = template["spec"]["containers"][0]
    port = _int(spec, "port", DEFAULT_PORT, 1, 65535, "spec")
    metrics_port = _int(spec, "metricsPort", DEFAULT_METRICS_PORT, 1, 65535, "spec")
    wait = _int(spec, "waitForMasterSeconds", DEFAULT_WAIT_FOR_MASTER_SECONDS, 0, 86400, "spec")
    assert port is not None and metrics_port is not None and wait is not None
    return JobSpec(
        replicas=replicas,
        nproc_per_node=_nproc(spec.get("nprocPerNode"), trainer),
        port=port,
        metrics_port=metrics_port,
        wait_for_master_seconds=wait,
        template=template,
        run_policy=_run_policy(spec.get("runPolicy")),
        checkpoint=_checkpoint(spec.get("checkpoint")),
        progress_deadline_seconds=_int(spec, "progressDeadlineSeconds", None, 1, 2**31 - 1, "spec"),
        straggler=_straggler(spec.get("straggler")),
        gang_scheduling=_gang_scheduling(spec.get("gangScheduling")),
        min_replicas=_int(spec, "minReplicas", None, 1, replicas, "spec"),
        spec_hash=spec_hash(spec),
    )


def parse_job(body: Mapping[str, Any]) -> Job:
    """Turn a DDPJob body (a dict from the API) into a typed Job; SpecError names the bad field."""
    meta = _mapping(body.get("metadata"), "metadata")
    name = str(meta.get("name", ""))
    labels = _mapping(meta.get("labels"), "metadata.labels")
    return Job(
        namespace=str(meta.get("namespace", "")),
        name=name,
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        spec=parse_spec(name, _mapping(body.get("spec"), "spec")),
        queue=str(labels.get(kueue.LABEL_QUEUE_NAME) or ""),
        priority_class=str(labels.get(kueue.LABEL_PRIORITY_CLASS) or ""),
    )
