"""Kueue's names that DDPJob reads and writes: the labels users put on a job, and the Workload the operator keeps.

Kueue runs no controller for an external framework (``integrations.externalFrameworks``): the operator does what
Kueue's ``jobframework`` reconciler does for its built-in kinds, with these names.
"""

from __future__ import annotations

GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
"""The Workload API the operator writes (Kueue's storage version since v0.15)."""
EXTERNAL_FRAMEWORK = "DDPJob.v1alpha1.ddpjob.dev"
"""What Kueue's Configuration lists in ``integrations.externalFrameworks`` for DDPJob."""

LABEL_QUEUE_NAME = f"{GROUP}/queue-name"
"""On a DDPJob: the LocalQueue (in the job's namespace) that queues it."""
LABEL_PRIORITY_CLASS = f"{GROUP}/priority-class"
"""On a DDPJob: the WorkloadPriorityClass that orders it in its queue and decides preemption."""
LABEL_JOB_UID = f"{GROUP}/job-uid"
LABEL_POD_SET = f"{GROUP}/podset"
FINALIZER = f"{GROUP}/resource-in-use"
"""Kueue keeps a Workload's quota until this is dropped: the operator drops it once the job's pods are gone."""

ANNOTATION_WORKLOAD = f"{GROUP}/workload"
"""On a pod placed by topology: its Workload, which Kueue's topology ungater finds its pods by."""
TOPOLOGY_GATE = f"{GROUP}/topology"
"""The scheduling gate of a pod placed by topology: Kueue removes it, and sets the pod's nodeSelector to its domain."""
ANNOTATION_REQUIRED_TOPOLOGY = f"{GROUP}/podset-required-topology"
"""On the pod template: every rank inside one domain of this level (a node label), or the job waits."""
ANNOTATION_PREFERRED_TOPOLOGY = f"{GROUP}/podset-preferred-topology"
"""On the pod template: the ranks in as few domains of this level as fit, else spread wider."""
ANNOTATION_UNCONSTRAINED_TOPOLOGY = f"{GROUP}/podset-unconstrained-topology"
"""On the pod template, "true": placed by Kueue's topology-aware scheduling, with no constraint on domains."""
ANNOTATION_SLICE_REQUIRED_TOPOLOGY = f"{GROUP}/podset-slice-required-topology"
"""On the pod template, with ``ANNOTATION_SLICE_SIZE``: each slice of that many ranks in one domain of this level."""
ANNOTATION_SLICE_SIZE = f"{GROUP}/podset-slice-size"
TRUE_WORDS = ("1", "t", "T", "TRUE", "true", "True")
"""What Kueue reads as true in ANNOTATION_UNCONSTRAINED_TOPOLOGY (Go's strconv.ParseBool; its false words are the CRD's
too)."""
TOPOLOGY_ANNOTATIONS = (ANNOTATION_REQUIRED_TOPOLOGY, ANNOTATION_PREFERRED_TOPOLOGY, ANNOTATION_UNCONSTRAINED_TOPOLOGY)
"""At most one of these on a pod template (Kueue's own rule); one of them marks a pod as placed by topology."""

POD_SET = "ranks"
"""The one pod set of a DDPJob's Workload: every rank's pod."""

ADMISSION_MANAGER = "kueue-admission"
"""The field manager of a Workload's admission: clearing it after an eviction must be applied as this manager,
as Kueue's own job reconciler does."""
FIELD_MANAGER = "ddpjob-operator"
"""The prefix of the operator's field managers for what it keeps in a Workload's status: one per field
(``ddpjob-operator-PodsReady``, ``-Finished``, ``-reclaimablePods``), as Kueue names its own, since an apply
removes whatever its manager applied before and left out."""

EVICTED_REQUEUED = frozenset({"Preempted", "NodeFailures"})
"""Eviction reasons after which Kueue expects the Workload's Requeued condition True."""
