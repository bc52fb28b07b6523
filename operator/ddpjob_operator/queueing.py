"""Pure: a job's Kueue Workload read into what the lifecycle needs, and the Workload status the operator writes.

Kueue runs no controller for an external framework: for a DDPJob labelled ``kueue.x-k8s.io/queue-name`` the
operator does what Kueue's ``jobframework`` reconciler (``ReconcileGenericJob``) does for its built-in kinds. It
keeps one Workload per job (``builders.workload``), creates no pod until Kueue admits it, and tells Kueue what it
observes: ``PodsReady`` while every rank runs, the eviction acknowledged once every pod is gone, ``Finished`` at the
end, and the ranks that no longer need their quota.

``read`` is the one reading of Kueue's objects; ``policies.admission`` turns it into transitions; ``kube`` does the
I/O. A job without the label reads as ``Queueing()``: not queued, and nothing here applies to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ddpjob_contract import kueue
from ddpjob_operator import topology
from ddpjob_operator.status import find_condition
from ddpjob_operator.times import from_time


@dataclass(frozen=True)
class Eviction:
    """Kueue's Evicted condition: Preempted, PodsReadyTimeout, Deactivated, ClusterQueueStopped..."""

    reason: str
    message: str

    def describe(self) -> str:
        return (
            f"evicted by Kueue ({self.reason}): {self.message}" if self.message else f"evicted by Kueue ({self.reason})"
        )


@dataclass(frozen=True, kw_only=True)
class Placement:
    """What an admission adds to every rank's pod: its flavors' node labels and tolerations, and Kueue's labels."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    topology_workload: str = ""
    """Placed by Kueue's topology-aware scheduling: the Workload its pods name for Kueue's topology ungater, which
    removes their gate and sets their nodeSelector to the domain of their rank. Empty: no topology."""
    assigned_nodes: tuple[str, ...] = ()
    """The nodes Kueue's topology assignment names (when its last level is the node)."""

    def keeps_off(self, excluded: tuple[str, ...]) -> tuple[str, ...]:
        """The nodes a rank's pod is kept off (``status.excludedNodes``); none under a topology assignment: Kueue's
        assignment names the pod's node, and an affinity its Workload never saw could leave the pod on no node at
        all (seen in the chaos soak: evicted for PodsReadyTimeout again and again). Kueue replaces a lost node
        itself."""
        return () if self.topology_workload else excluded

    def apply(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod with this placement merged in (a template's own node selector wins no conflict: the flavor's
        labels are where the quota is)."""
        if not (self.node_selector or self.tolerations or self.labels or self.topology_workload):
            return pod
        spec = pod.setdefault("spec", {})
        if self.topology_workload:
            _gate(pod, self.topology_workload)
        if self.node_selector:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **self.node_selector}
        if self.tolerations:
            spec["tolerations"] = [*(spec.get("tolerations") or []), *(dict(t) for t in self.tolerations)]
        if self.labels:
            meta = pod.setdefault("metadata", {})
            meta["labels"] = {**(meta.get("labels") or {}), **self.labels}
        return pod


@dataclass(frozen=True, kw_only=True)
class Queueing:
    """What Kueue says of the job. The default: the job is not queued by Kueue."""

    queue: str = ""
    """The job's LocalQueue (its ``kueue.x-k8s.io/queue-name`` label); empty: not queued."""
    served: bool = True
    """Whether the apiserver serves Kueue's Workload API (False: Kueue is not installed)."""
    watched: bool = False
    """Whether Kueue's writes to the Workload wake the job (the operator's Workload watch has listed its namespace):
    if not, the job looks again every few seconds."""
    name: str = ""
    """The Workload's name."""
    exists: bool = False
    uid: str = ""
    deleting: bool = False
    """The Workload is being deleted (by a user, or with its job): the job stops, then the finalizer goes."""
    finalizer: bool = False
    quota_reserved: bool = False
    admitted: bool = False
    cluster_queue: str = ""
    count: int = 0
    """The admitted number of ranks (below the request under partial admission)."""
    placement: Placement = field(default_factory=Placement)
    waiting: str = ""
    """Why Kueue has not admitted it, in Kueue's words (its QuotaReserved condition's message)."""
    evicted: Eviction | None = None
    finished: bool = False
    requeue_at: str = ""
    """When Kueue will consider an evicted Workload again (its requeueState, after a PodsReadyTimeout)."""
    pods_ready: str = ""
    """The PodsReady condition's reason as last written ("" for none)."""
    reclaimable: int = 0
    priority_missing: str = ""
    """The job names a WorkloadPriorityClass that does not exist."""
    create_failed: str = ""
    """Why the operator's last try to create the Workload failed (none exists yet)."""
    conditions: tuple[Mapping[str, Any], ...] = ()
    """The Workload's conditions as read (kept whole for the eviction's acknowledgement)."""
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def queued(self) -> bool:
        return bool(self.queue)

    def may_run(self) -> bool:
        """Whether the ranks may have pods: admitted, and neither evicted nor being deleted."""
        return self.admitted and self.evicted is None and not self.deleting


NOT_QUEUED = Queueing()


def _gate(pod: dict[str, Any], workload: str) -> None:
    """A rank's pod as Kueue's topology ungater finds it: gated, naming its Workload, and marked as placed by
    topology (unconstrained, when its template asked for no level: a ClusterQueue of topology flavors only places
    every pod set by topology)."""
    meta = pod.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {})
    annotations[kueue.ANNOTATION_WORKLOAD] = workload
    if not topology.asks(annotations):
        annotations[kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY] = "true"
    spec = pod.setdefault("spec", {})
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != kueue.TOPOLOGY_GATE]
    spec["schedulingGates"] = [*gates, {"name": kueue.TOPOLOGY_GATE}]


def _true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    return find_condition(conditions, type_).get("status") == "True"


def workload_name(job_name: str, job_uid: str) -> str:
    """One Workload per incarnation of the job: a job made again under the same name never adopts the old one's."""
    return f"ddpjob-{job_name}-{job_uid[:8]}"


def read(
    queue: str,
    workload: Mapping[str, Any] | None,
    flavors: Mapping[str, Mapping[str, Any]],
    *,
    name: str,
    served: bool = True,
    watched: bool = False,
    priority_missing: str = "",
    create_failed: str = "",
) -> Queueing:
    """The job's Workload (None: none yet) and the ResourceFlavors its admission names, as observed state.
    ``create_failed``: why the last try to create it failed."""
    if not queue:
        return NOT_QUEUED
    if not served or workload is None:
        return Queueing(queue=queue, served=served, watched=watched, name=name, priority_missing=priority_missing,
                        create_failed=create_failed)  # fmt: skip
    meta = workload.get("metadata") or {}
    status = workload.get("status") or {}
    conditions = tuple(c for c in status.get("conditions") or [] if isinstance(c, Mapping))
    reserved = find_condition(conditions, "QuotaReserved")
    admission = status.get("admission") or {}
    assignment: Mapping[str, Any] = next(iter(admission.get("podSetAssignments") or []), {}) or {}
    return Queueing(
        queue=queue,
        watched=watched,
        name=str(meta.get("name") or name),
        exists=True,
        uid=str(meta.get("uid") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        finalizer=kueue.FINALIZER in (meta.get("finalizers") or []),
        quota_reserved=reserved.get("status") == "True",
        admitted=_true(conditions, "Admitted"),
        cluster_queue=str(admission.get("clusterQueue") or ""),
        count=_admitted_count(workload, assignment),
        placement=_placement(assignment, flavors, str(meta.get("name") or name)),
        waiting=str(reserved.get("message") or "") if reserved.get("status") != "True" else "",
        evicted=_eviction(conditions),
        finished=_true(conditions, "Finished"),
        requeue_at=str((status.get("requeueState") or {}).get("requeueAt") or ""),
        pods_ready=str(find_condition(conditions, "PodsReady").get("reason") or ""),
        reclaimable=_reclaimable(status),
        priority_missing=priority_missing,
        conditions=conditions,
        body=workload,
    )


def _admitted_count(workload: Mapping[str, Any], assignment: Mapping[str, Any]) -> int:
    """The ranks the admission assigned; else the count the Workload asks for."""
    requested: Mapping[str, Any] = next(iter((workload.get("spec") or {}).get("podSets") or []), {}) or {}
    count = assignment.get("count", requested.get("count", 0))
    return int(count or 0)


def _eviction(conditions: Sequence[Mapping[str, Any]]) -> Eviction | None:
    """Why Kueue evicted the Workload, while its Evicted condition is True."""
    evicted = find_condition(conditions, "Evicted")
    if evicted.get("status") != "True":
        return None
    return Eviction(str(evicted.get("reason") or ""), str(evicted.get("message") or ""))


def _reclaimable(status: Mapping[str, Any]) -> int:
    """The count of the ranks' pods Kueue may reclaim, from the Workload's status.reclaimablePods."""
    reclaimable = next(
        (r.get("count", 0) for r in status.get("reclaimablePods") or [] if r.get("name") == kueue.POD_SET), 0
    )
    return int(reclaimable or 0)


def assigned_flavors(workload: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceFlavors an admission assigned (to be read before ``read``)."""
    admission = (workload.get("status") or {}).get("admission") or {}
    names = {str(f) for a in admission.get("podSetAssignments") or [] for f in (a.get("flavors") or {}).values()}
    return tuple(sorted(names))


def _placement(assignment: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]], workload: str) -> Placement:
    """Each assigned flavor's node labels and tolerations (Kueue's ``podset.FromAssignment``), and the pod-set label;
    under a topology assignment, the Workload the gated pods name."""
    if not assignment:
        return Placement()
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for flavor in sorted({str(f) for f in (assignment.get("flavors") or {}).values()}):
        spec = (flavors.get(flavor) or {}).get("spec") or {}
        selector.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
        tolerations.extend(t for t in spec.get("tolerations") or [] if t not in tolerations)
    placed_by_topology = bool(assignment.get("topologyAssignment"))
    return Placement(
        node_selector=selector,
        tolerations=tuple(tolerations),
        labels={kueue.LABEL_POD_SET: kueue.POD_SET},
        topology_workload=workload if placed_by_topology else "",
        assigned_nodes=topology.nodes(assignment),
    )


# ---------------------------------------------------------------------------------------------
# What the operator writes to the Workload's status


@dataclass(frozen=True, kw_only=True)
class StatusApply:
    """A server-side apply of the Workload's status, as ``manager`` (forced, as Kueue's own writers do)."""

    manager: str
    body: Mapping[str, Any]


def _base(q: Queueing) -> dict[str, Any]:
    """What every apply names (Kueue's ``BaseSSAWorkload``): the object, its uid, its labels and annotations."""
    meta = q.body.get("metadata") or {}
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "Workload",
        "metadata": {"name": q.name, "namespace": meta.get("namespace"), "uid": q.uid},
        "status": {},
    }


def _cond(type_: str, status: bool, reason: str, message: str, now: datetime, generation: int) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": from_time(now),
        "observedGeneration": generation,
    }


def _same(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return all(old.get(k) == new[k] for k in ("status", "reason", "message"))


def _with(conditions: Sequence[Mapping[str, Any]], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Set one condition; its transition time stays when its status does not flip."""
    old = find_condition(conditions, str(new["type"]))
    kept = dict(new)
    if old.get("status") == new["status"] and old.get("lastTransitionTime"):
        kept["lastTransitionTime"] = old["lastTransitionTime"]
    return [dict(c) for c in conditions if c.get("type") != new["type"]] + [kept]


ADMISSION_CONDITIONS = (
    "QuotaReserved", "BlockedOnPreemptionGates", "Evicted", "Admitted", "Preempted", "Requeued",
    "DeactivationTarget", "Finished",
)  # fmt: skip
"""The conditions Kueue's admission manager owns (``admissionManagedConditions``): an apply as that manager
restates every one of them, or the apply would remove it."""


def eviction_done(q: Queueing, now: datetime) -> StatusApply:
    """Every pod of an evicted job is gone: give the quota back as Kueue's reconciler does (QuotaReserved False
    with reason Pending, the admission cleared, Admitted False, Requeued True after a preemption)."""
    assert q.evicted is not None
    generation = int((q.body.get("metadata") or {}).get("generation") or 0)
    message = q.evicted.message or q.evicted.reason
    conditions = [dict(c) for c in q.conditions if c.get("type") in ADMISSION_CONDITIONS]
    requeued = q.evicted.reason in kueue.EVICTED_REQUEUED
    conditions = _with(conditions, _cond("Requeued", requeued, q.evicted.reason, message, now, generation))
    conditions = _with(conditions, _cond("QuotaReserved", False, "Pending", message, now, generation))
    conditions = _with(conditions, _cond("Admitted", False, "NoReservation", "The workload has no reservation", now,
                                         generation))  # fmt: skip
    body = _base(q)
    status = q.body.get("status") or {}
    body["status"] = {"conditions": conditions}
    for kept in ("requeueState", "resourceRequests", "accumulatedPastExecutionTimeSeconds", "schedulingStats"):
        if status.get(kept) is not None:
            body["status"][kept] = status[kept]
    return StatusApply(manager=kueue.ADMISSION_MANAGER, body=body)


def pods_ready(q: Queueing, ready: bool, now: datetime) -> StatusApply | None:
    """The PodsReady condition (``waitForPodsReady``), as Kueue's ``generatePodsReadyCondition`` words it; None
    when the Workload already says so."""
    generation = int((q.body.get("metadata") or {}).get("generation") or 0)
    old = find_condition(q.conditions, "PodsReady")
    if ready:
        recovering = old.get("reason") in ("WaitForRecovery", "Recovered")
        new = _cond("PodsReady", True, "Recovered" if recovering else "Started",
                    "All pods reached readiness and the workload is running", now, generation)  # fmt: skip
    elif old.get("status") == "True" or old.get("reason") == "WaitForRecovery":
        new = _cond("PodsReady", False, "WaitForRecovery", "At least one pod has failed, waiting for recovery", now,
                    generation)  # fmt: skip
    else:
        new = _cond("PodsReady", False, "WaitForStart", "Not all pods are ready or succeeded", now, generation)
    if old and _same(old, new):
        return None
    if old.get("status") == new["status"]:
        new["lastTransitionTime"] = old.get("lastTransitionTime") or new["lastTransitionTime"]
    body = _base(q)
    body["status"] = {"conditions": [new]}
    return StatusApply(manager=f"{kueue.FIELD_MANAGER}-PodsReady", body=body)


def finished(q: Queueing, succeeded: bool, message: str, now: datetime) -> StatusApply:
    generation = int((q.body.get("metadata") or {}).get("generation") or 0)
    body = _base(q)
    reason = "Succeeded" if succeeded else "Failed"
    body["status"] = {"conditions": [_cond("Finished", True, reason, message, now, generation)]}
    return StatusApply(manager=f"{kueue.FIELD_MANAGER}-Finished", body=body)


def reclaimable(q: Queueing, count: int) -> StatusApply:
    """Ranks that exited 0 need no quota any more (it may only grow while the quota is held)."""
    body = _base(q)
    body["status"] = {"reclaimablePods": [{"name": kueue.POD_SET, "count": count}]}
    return StatusApply(manager=f"{kueue.FIELD_MANAGER}-reclaimablePods", body=body)
