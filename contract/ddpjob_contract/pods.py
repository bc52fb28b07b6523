"""What the operator puts on every pod: labels, an annotation, and the trainer's environment."""

from __future__ import annotations

# Labels on every child; the first three are the pod contract.
LABEL_JOB_NAME = "ddpjob.dev/job-name"
LABEL_RANK = "ddpjob.dev/rank"
LABEL_ATTEMPT = "ddpjob.dev/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "ddpjob"
# The scheduler's PodGroup API: one gang per attempt, named in every rank's spec.schedulingGroup.
POD_GROUP_API = "scheduling.k8s.io/v1beta1"
# Hash of the spec fields a pod is built from: pods of a stale spec are replaced, never reused.
ANNOTATION_SPEC_HASH = "ddpjob.dev/spec-hash"
# On a pod restarted in place (its kubelet restarted every container on a retryable exit): the trainer container's
# restartCount when its current attempt began. A restart past it is this attempt's failure.
ANNOTATION_RESTART_COUNT = "ddpjob.dev/restart-count"
# The nodes a pod was built to avoid (status.excludedNodes when it was made), comma-separated: a pod not yet placed
# that avoids a node the job no longer excludes is made again.
ANNOTATION_EXCLUDED_NODES = "ddpjob.dev/excluded-nodes"

# The environment injected into the trainer container (the first container).
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_PET_NNODES = "PET_NNODES"
ENV_PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
ENV_PET_NODE_RANK = "PET_NODE_RANK"
ENV_PET_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_PET_MASTER_PORT = "PET_MASTER_PORT"
ENV_JOB_NAME = "DDPJOB_NAME"
ENV_ATTEMPT = "DDPJOB_ATTEMPT"
ENV_RANK_ADDR = "DDPJOB_RANK_ADDR"
"""The rank's name through the job's headless Service (``<job>-<rank>.<job>``): while it resolves to this pod, the
process is its rank; once it resolves to another pod, a newer attempt holds the rank (the trainer's fence)."""
ENV_POD_IPS = "DDPJOB_POD_IPS"
"""The pod's addresses, comma-separated (the downward API's ``status.podIPs``)."""
ENV_CHECKPOINT_DIR = "CHECKPOINT_DIR"
ENV_METRICS_PORT = "METRICS_PORT"
ENV_PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
ENV_TERMINATION_MESSAGE_PATH = "TERMINATION_MESSAGE_PATH"
"""Where the trainer container's program leaves its exit message: the container's terminationMessagePath."""
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
ENV_TERMINATION_GRACE_SECONDS = "TERMINATION_GRACE_SECONDS"
"""The pod's terminationGracePeriodSeconds: how long the trainer has, after SIGTERM, to save at the next step
boundary before the kubelet's SIGKILL."""
DEFAULT_TERMINATION_GRACE_SECONDS = 30
"""Kubernetes's default grace period (a pod that does not set one)."""
ENV_MAX_RESTARTS = "MAX_RESTARTS"
"""How many times the trainer may restart the gang's processes in place, without new containers (its
``--max-restarts``): the restarts the job has left. The operator sets it; unset or 0, a failure ends the process."""
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
"""torchrun's name, which the trainer's own supervisor sets too: how many in-place restarts of the gang's processes
came before this process (0 for the first)."""
ENV_RESTART_REASON = "RESTART_REASON"
"""Set by the trainer's supervisor beside TORCHELASTIC_RESTART_COUNT: why the gang's processes last restarted."""

TORCHRUN_ENV: tuple[str, ...] = (ENV_RANK, ENV_WORLD_SIZE, ENV_LOCAL_RANK, ENV_MASTER_ADDR, ENV_MASTER_PORT)
"""The torchrun convention: the only launch contract the trainer reads."""
RESERVED_ENV: tuple[str, ...] = (
    ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_WORLD_SIZE, ENV_RANK, ENV_LOCAL_RANK,
    ENV_PET_NNODES, ENV_PET_NPROC_PER_NODE, ENV_PET_NODE_RANK, ENV_PET_MASTER_ADDR, ENV_PET_MASTER_PORT,
    ENV_JOB_NAME, ENV_ATTEMPT, ENV_RANK_ADDR, ENV_POD_IPS, ENV_CHECKPOINT_DIR, ENV_METRICS_PORT,
    ENV_PYTHONUNBUFFERED,
)  # fmt: skip
"""Set by the operator; the CRD refuses a template that sets them."""
