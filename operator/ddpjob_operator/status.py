"""Pure: what the pods say, and the status the operator writes back.

``observe`` reads the pods that exist and says which ranks run, finished, failed or are missing.
``JobStatus`` is the only memory the operator keeps (attempt, restarts, times, conditions); it lives
in the object's status so that a restarted operator carries on where the last one stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ddpjob_contract import kueue
from ddpjob_contract.pods import (
    ANNOTATION_EXCLUDED_NODES,
    ANNOTATION_RESTART_COUNT,
    ANNOTATION_SPEC_HASH,
    LABEL_ATTEMPT,
    LABEL_RANK,
)
from ddpjob_contract.status import ConditionType, Phase
from ddpjob_operator.progress import Checkpoint, ProgressStatus
from ddpjob_operator.times import from_time, to_time

# ---------------------------------------------------------------------------------------------
# Pods as observed


@dataclass(frozen=True)
class Disruption:
    """A pod's DisruptionTarget condition: preempted, evicted, drained, shut down with its node..."""

    reason: str
    """PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager, TerminationByKubelet..."""
    message: str

    @property
    def preempted(self) -> bool:
        return self.reason == "PreemptionByScheduler"

    def describe(self) -> str:
        what = "was preempted" if self.preempted else f"was disrupted ({self.reason})"
        return f"{what}: {self.message}" if self.message else what


@dataclass(frozen=True, kw_only=True)
class PodView:
    """The facts about one pod that the lifecycle rules need."""

    name: str
    uid: str = ""
    rank: int | None = None
    attempt: int | None = None
    spec_hash: str = ""
    phase: str = "Pending"
    terminating: bool = False
    exit_code: int | None = None
    """The trainer container's exit code once it has terminated."""
    exit_reason: str = ""
    """The kubelet's word for how it terminated: Completed, Error, OOMKilled..."""
    message: str = ""
    """Its termination message: the program's exit message, or its log's tail (FallbackToLogsOnError)."""
    finished_at: str = ""
    reason: str = ""
    """Why the pod failed when the trainer did not exit by itself (Evicted, an init container...)."""
    ip: str = ""
    node: str = ""
    blocked: str = ""
    """Why a container of the pod cannot start (``CANNOT_START``), as one line; empty when none is stuck."""
    unschedulable: str = ""
    """The scheduler's word for why it cannot place the pod (PodScheduled False, Unschedulable)."""
    topology_gated: bool = False
    """It waits for Kueue's topology assignment (its ``kueue.x-k8s.io/topology`` scheduling gate): not a failure."""
    disruption: Disruption | None = None
    """Why Kubernetes is taking the pod away (its DisruptionTarget condition): not the rank's failure."""
    others_running: bool = False
    """A container other than the trainer still runs (a sidecar that kubelet will not stop by itself)."""
    in_place: bool = False
    """Its trainer has a RestartAllContainers rule: its kubelet restarts the pod in place on a retryable exit."""
    restarts: int = 0
    """Its trainer's restartCount (the kubelet counts each restart in place)."""
    next_count: int = 0
    """In place: the trainer's restartCount once restarted for a new attempt (one more while it lies exited)."""
    restarting: bool = False
    """In place: its trainer's exit was the last attempt's, and its kubelet has not started it again yet."""
    adopted: bool = False
    """Restarted in place into its attempt (made for an earlier one)."""
    avoids: tuple[str, ...] = ()
    """The nodes it was built to avoid (``status.excludedNodes`` when it was made)."""

    @property
    def restarted_by_kubelet(self) -> bool:
        """Its trainer's exit is known only as the kubelet's removal for a restart in place: the code is lost."""
        return self.exit_reason == RESTARTING_ALL_CONTAINERS

    trainer_running: bool = False
    """Its trainer container runs (for a pod waiting to be restarted in place: the last attempt's process)."""

    @property
    def finished(self) -> bool:
        """Nothing in the pod runs any more, or will soon: its phase is terminal, or its trainer has exited and
        no other container runs. kubelet reports the terminal phase only once it has torn the pod down, which
        can take seconds after the trainer's exit; until then the phase stays Running."""
        return self.phase in ("Succeeded", "Failed") or (self.exit_code is not None and not self.others_running)

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 or (self.exit_code is None and self.phase == "Succeeded")

    @property
    def failed(self) -> bool:
        return (self.exit_code is not None and self.exit_code != 0) or (self.phase == "Failed" and not self.succeeded)

    @property
    def running(self) -> bool:
        return self.phase == "Running" and self.exit_code is None and not self.terminating and not self.restarting


def _label_int(labels: Mapping[str, Any], key: str) -> int | None:
    value = labels.get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None


CANNOT_START = frozenset({
    "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})  # fmt: skip
"""The kubelet's waiting reasons that mean a container will not start until someone fixes something."""


def _blocked(status: Mapping[str, Any]) -> str:
    """'container trainer: ErrImagePull: <the kubelet's message>' for the first stuck container, init ones first."""
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            said = one_line(str(waiting.get("message") or ""))
            return f"container {cs.get('name')}: {waiting['reason']}" + (f": {said}" if said else "")
    return ""


def find_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any]:
    """The condition of ``type_`` in an object's ``status.conditions`` (a pod's, a Workload's); {} if none."""
    return next((c for c in conditions or [] if isinstance(c, Mapping) and c.get("type") == type_), {})


def pod_condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    """A pod status's condition of ``type_`` ({} if it has none)."""
    return find_condition(status.get("conditions"), type_)


def is_unschedulable(scheduled: Mapping[str, Any]) -> bool:
    """Whether a PodScheduled condition says the scheduler cannot place the pod."""
    return scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"


def _unschedulable(status: Mapping[str, Any]) -> str:
    scheduled = pod_condition(status, "PodScheduled")
    if is_unschedulable(scheduled):
        return one_line(str(scheduled.get("message") or "")) or "no reason given"
    return ""


TERMINATED_BY_KUEUE = "TerminatedByKueue"
"""The condition Kueue's topology node controller sets on a pod it fails: ungated onto a node it found bad, never
bound there (reason UnschedulableOnAssignedNode). The node's doing, not the rank's: a disruption."""


def _disruption(status: Mapping[str, Any]) -> Disruption | None:
    for type_ in ("DisruptionTarget", TERMINATED_BY_KUEUE):
        target = pod_condition(status, type_)
        if target.get("status") == "True":
            return Disruption(str(target.get("reason") or type_), one_line(str(target.get("message") or "")))
    return None


def _restarts_all(container: Mapping[str, Any]) -> bool:
    return any(r.get("action") == "RestartAllContainers" for r in container.get("restartPolicyRules") or [])


RESTARTING_ALL_CONTAINERS = "RestartingAllContainers"
"""The kubelet's reason in a container's last state when it removed the container to restart its pod in place (the
exit that triggered it is seldom reported: its code shows as 137 with this reason)."""


RESTARTED_IN_PLACE = (
    "exited with a code its restart policy retries, and its kubelet restarted it in place (the code is not kept)"
)


def pod_view(pod: Mapping[str, Any], trainer: str) -> PodView:
    """Read a pod (a dict as the API returns it); the trainer is the container named ``trainer``.

    A pod whose kubelet restarts it in place (``in_place``) counts each restart in its trainer's restartCount: a
    restart past the count its attempt began at (``ANNOTATION_RESTART_COUNT``) is a failure of this attempt, read
    from the last state; an exit below it was the last attempt's."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    in_place = any(c.get("name") == trainer and _restarts_all(c) for c in spec.get("containers") or [])
    began = str(annotations.get(ANNOTATION_RESTART_COUNT) or "")
    statuses = status.get("containerStatuses") or []
    read = _read_trainer(statuses, trainer, in_place=in_place, base=int(began) if began.isdigit() else 0)
    reason = str(status.get("reason") or "")
    if read.exit_code is None and status.get("phase") == "Failed" and not reason:
        reason = _init_container_failure(status.get("initContainerStatuses") or [])
    return PodView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        rank=_label_int(labels, LABEL_RANK),
        attempt=_label_int(labels, LABEL_ATTEMPT),
        spec_hash=str(annotations.get(ANNOTATION_SPEC_HASH, "")),
        phase=str(status.get("phase") or "Pending"),
        terminating=bool(meta.get("deletionTimestamp")),
        exit_code=read.exit_code,
        exit_reason=read.exit_reason,
        message=read.message,
        finished_at=read.finished_at,
        reason=reason,
        ip=str(status.get("podIP") or ""),
        node=str(spec.get("nodeName") or ""),
        blocked=_blocked(status),
        unschedulable=_unschedulable(status),
        topology_gated=any(g.get("name") == kueue.TOPOLOGY_GATE for g in spec.get("schedulingGates") or []),
        disruption=_disruption(status),
        others_running=_others_running(statuses, trainer),
        in_place=in_place,
        restarts=read.restarts,
        next_count=read.next_count,
        restarting=read.restarting,
        trainer_running=read.running,
        adopted=bool(began),
        avoids=tuple(n for n in str(annotations.get(ANNOTATION_EXCLUDED_NODES, "")).split(",") if n),
    )


@dataclass(frozen=True)
class _Trainer:
    """What the trainer container's status says (``pod_view``): whether it runs, its restartCount, and its exit."""

    running: bool = False
    restarts: int = 0
    next_count: int = 0
    restarting: bool = False
    exit_code: int | None = None
    finished_at: str = ""
    exit_reason: str = ""
    message: str = ""


def _read_trainer(statuses: Sequence[Mapping[str, Any]], trainer: str, *, in_place: bool, base: int) -> _Trainer:
    """The trainer's status among the pod's containers' (``base``: the restartCount its attempt began at)."""
    read = _Trainer()
    for cs in statuses:
        if cs.get("name") == trainer:
            read = _trainer_status(read, cs, in_place=in_place, base=base)
    return read


def _trainer_status(read: _Trainer, cs: Mapping[str, Any], *, in_place: bool, base: int) -> _Trainer:
    """One trainer container's status read: in place, an exit below ``base`` is the last attempt's (its kubelet
    restarts it), and a restart past it is this attempt's exit, read from its last state."""
    state = (cs or {}).get("state") or {}
    count = cs.get("restartCount")
    restarts = count if isinstance(count, int) else 0
    now_ended = state.get("terminated")
    terminated = now_ended
    restarting = read.restarting
    if in_place and now_ended and restarts < base:
        restarting, terminated = True, None  # the exit that began this attempt: its kubelet restarts it
    elif in_place and not now_ended and restarts > base:
        terminated = ((cs or {}).get("lastState") or {}).get("terminated")  # restarted in place since
    read = replace(read, running="running" in state, restarts=restarts,
                   next_count=restarts + 1 if now_ended else restarts, restarting=restarting)  # fmt: skip
    if terminated and isinstance(terminated.get("exitCode"), int):
        read = replace(read, exit_code=terminated["exitCode"], finished_at=str(terminated.get("finishedAt") or ""),
                       exit_reason=str(terminated.get("reason") or ""),
                       message=str(terminated.get("message") or ""))  # fmt: skip
    return read


def _others_running(statuses: Sequence[Mapping[str, Any]], trainer: str) -> bool:
    """A container other than the trainer runs."""
    return any(cs.get("name") != trainer and "running" in ((cs or {}).get("state") or {}) for cs in statuses)


def _init_container_failure(statuses: Sequence[Mapping[str, Any]]) -> str:
    """'init container wait exited with code 1 (<kubelet's reason>: <its message>)' for the first that failed;
    empty when none did."""
    for cs in statuses:
        terminated = ((cs or {}).get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode") not in (None, 0):
            reason = f"init container {cs.get('name')} exited with code {terminated['exitCode']}"
            # kubelet's reason, when it has one: StartError (128) is a container that never ran, as when
            # kubelet restarted while it started it (chaos soak 10, run 1:148), with the runtime's error
            why, said = str(terminated.get("reason") or ""), one_line(str(terminated.get("message") or ""))
            if why and why != "Error":
                reason += f" ({why}: {said})" if said else f" ({why})"
            return reason
    return ""


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One rank that stopped the gang."""

    rank: int
    pod: str
    exit_code: int | None = None
    cause: str = ""
    """Without an exit code: deleted, evicted, an init container failed..."""
    exit_reason: str = ""
    message: str = ""
    """What the rank said as it exited (its exit message or its log's last lines), on one line."""
    finished_at: str = ""
    disruption: Disruption | None = None
    """Kubernetes took the pod away (preemption, eviction...): a restart that is not counted."""

    def describe(self) -> str:
        if self.disruption is not None:
            return f"rank {self.rank} (pod {self.pod}) {self.disruption.describe()}"
        if self.exit_code is None:
            return f"rank {self.rank} (pod {self.pod}) {self.cause or 'failed'}"
        text = f"rank {self.rank} (pod {self.pod}) exited with code {self.exit_code}"
        if self.exit_reason == "OOMKilled":
            text += " (OOMKilled: it went over its memory limit)"
        elif self.exit_reason == "StartError":  # never ran: as when kubelet restarted while it started it
            text += " (StartError: the container never ran)"
        return f"{text}: {self.message}" if self.message else text


MESSAGE_LINES = 3
"""A log tail (FallbackToLogsOnError) is cut to its last lines: a traceback's last three name the error."""
MESSAGE_CHARS = 500


def one_line(message: str) -> str:
    """A termination message as one line: a log's last non-empty lines joined with ' | ', cut short."""
    lines = [" ".join(line.split()) for line in message.splitlines()]
    text = " | ".join([line for line in lines if line][-MESSAGE_LINES:])
    return text if len(text) <= MESSAGE_CHARS else "..." + text[-MESSAGE_CHARS:]


@dataclass(frozen=True, kw_only=True)
class Observation:
    """The pods of one attempt, summarised."""

    current: Mapping[int, PodView]
    """Rank -> pod of the current attempt."""
    stale: tuple[PodView, ...]
    """Pods of other attempts (or outside the rank range): always to be deleted."""
    missing: tuple[int, ...]
    failures: tuple[Failure, ...]
    outdated: bool
    """A pod of this attempt was built from another spec (edited while suspended)."""

    @property
    def running(self) -> int:
        return sum(p.running for p in self.current.values())

    @property
    def succeeded(self) -> int:
        return sum(p.succeeded for p in self.current.values())

    @property
    def failed(self) -> int:
        """Ranks whose pod reports a failure; a deleted pod is a failure of the attempt, not a count here."""
        return sum(p.failed for p in self.current.values())

    @property
    def active(self) -> int:
        return sum(not (p.succeeded or p.failed or p.terminating) for p in self.current.values())

    def all_succeeded(self, replicas: int) -> bool:
        return not self.missing and self.succeeded == replicas

    def all_started(self, replicas: int) -> bool:
        """Every rank runs or has finished well; at least one still runs."""
        return not self.missing and self.running > 0 and self.running + self.succeeded == replicas


def observe(
    pods: Iterable[PodView], *, job_name: str, attempt: int, replicas: int, spec_hash: str, launched: bool
) -> Observation:
    """Sort the job's pods into this attempt's ranks and stale ones, and find the failed ranks.

    A rank whose pod is missing or terminating after the attempt was launched was deleted or
    evicted: that counts as a failure. Before launch, a missing rank is simply not created yet.
    """
    current: dict[int, PodView] = {}
    stale: list[PodView] = []
    for pod in pods:
        if pod.attempt == attempt and pod.rank is not None and 0 <= pod.rank < replicas and pod.rank not in current:
            current[pod.rank] = pod
        else:
            stale.append(pod)
    failures: list[Failure] = []
    for rank in range(replicas):
        found = current.get(rank)
        if found is None:
            if launched:
                failures.append(Failure(rank=rank, pod=f"{job_name}-{rank}", cause="was deleted"))
        elif found.failed and found.restarted_by_kubelet:
            failures.append(Failure(rank=rank, pod=found.name, cause=RESTARTED_IN_PLACE))
        elif found.failed:
            cause = found.reason and (found.reason if " " in found.reason else f"failed: {found.reason}")
            failure = Failure(rank=rank, pod=found.name, exit_code=found.exit_code, cause=cause,
                              exit_reason=found.exit_reason, message=one_line(found.message))  # fmt: skip
            failures.append(replace(failure, finished_at=found.finished_at, disruption=found.disruption))
        elif found.terminating and not found.succeeded:
            failures.append(Failure(rank=rank, pod=found.name, cause="was deleted or evicted",
                                    disruption=found.disruption))  # fmt: skip
    missing = tuple(r for r in range(replicas) if r not in current)
    return Observation(
        current=current,
        stale=tuple(stale),
        missing=missing,
        failures=tuple(failures),
        outdated=any(p.spec_hash != spec_hash for p in current.values()),
    )


# ---------------------------------------------------------------------------------------------
# The status the operator writes


@dataclass(frozen=True, kw_only=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str
    last_transition_time: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": "True" if self.status else "False",
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": from_time(self.last_transition_time),
        }


@dataclass(frozen=True)
class ExcludedNode:
    """A node the job's pods avoid (``status.excludedNodes``): its rank there was lost or the node turned sick."""

    name: str
    reason: str
    message: str
    since: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "message": self.message, "since": from_time(self.since)}

    @staticmethod
    def parse(raw: Any) -> tuple[ExcludedNode, ...]:
        """Those written back; an entry a user mangled (no name, no time) is dropped, as a cleared one is."""
        kept: list[ExcludedNode] = []
        for e in raw if isinstance(raw, list) else []:
            since = to_time(e.get("since")) if isinstance(e, Mapping) else None
            if since is not None and isinstance(e.get("name"), str) and e["name"]:
                kept.append(ExcludedNode(e["name"], str(e.get("reason") or ""), str(e.get("message") or ""), since))
        return tuple(kept)


@dataclass(frozen=True)
class MachineFault:
    """The last restart's cause when it pointed at the machine (``policies.node_loss.machine_fault``): which rank,
    on which node, and why. The same again, in a row, excludes the node."""

    node: str
    rank: int
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "why": self.why}

    @staticmethod
    def parse(raw: Any) -> MachineFault | None:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("node"), str) or not isinstance(raw.get("rank"), int):
            return None
        return MachineFault(raw["node"], raw["rank"], str(raw.get("why") or ""))


@dataclass(frozen=True, kw_only=True)
class JobStatus:
    """Everything the operator remembers about a job, plus the counts it last observed."""

    phase: Phase = Phase.NEW
    attempt: int = 0
    restarts: int = 0
    launched_attempt: int = -1
    """The last attempt whose pods were all seen to exist; a rank missing after that was deleted."""
    admitted_replicas: int = 0
    """Under Kueue's partial admission: the ranks this attempt runs (below spec.replicas); 0: all of them."""
    start_time: datetime | None = None
    completion_time: datetime | None = None
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    running: int = 0
    replicas: int = 0
    observed_generation: int = 0
    conditions: tuple[Condition, ...] = field(default_factory=tuple)
    progress: ProgressStatus | None = None
    last_checkpoint: Checkpoint | None = None
    """The newest complete checkpoint any attempt's ranks reported (kept when their pods are gone)."""
    nodes: tuple[str, ...] = ()
    """Each rank's node, rank 0 first ("" for a rank not placed); empty before any rank is placed."""
    spans: str = ""
    """Under Kueue's topology-aware scheduling: the domains the ranks span at the level above the node."""
    excluded_nodes: tuple[ExcludedNode, ...] = ()
    """Nodes the job's pods avoid (``policies.node_loss``), until each entry expires or a user removes it."""
    machine_fault: MachineFault | None = None
    """The last restart's cause, when a rank's exit pointed at its machine (SIGBUS, a CUDA or NCCL error)."""

    @property
    def excluded_names(self) -> tuple[str, ...]:
        """The names of ``excluded_nodes``."""
        return tuple(e.name for e in self.excluded_nodes)

    def condition(self, type_: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def with_condition(self, type_: ConditionType, status: bool, reason: str, message: str, now: datetime) -> JobStatus:
        """Set one condition; its transition time moves only when its status flips."""
        old = self.condition(type_)
        if old and old.status == status and old.reason == reason and old.message == message:
            return self
        when = old.last_transition_time if old and old.status == status else now
        new = Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=when)
        others = tuple(c for c in self.conditions if c.type != type_)
        rank = {t.value: i for i, t in enumerate(ConditionType)}
        ordered = sorted((*others, new), key=lambda c: rank.get(c.type, len(rank)))
        return replace(self, conditions=tuple(ordered))

    def to_dict(self) -> dict[str, Any]:
        """The status fields the operator owns; merged over the old status so others' fields survive."""
        return {
            "phase": self.phase.value or None,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "launchedAttempt": self.launched_attempt,
            "admittedReplicas": self.admitted_replicas or None,
            "startTime": from_time(self.start_time),
            "completionTime": from_time(self.completion_time),
            "replicas": {"active": self.active, "succeeded": self.succeeded, "failed": self.failed},
            "ready": f"{self.running}/{self.replicas}",
            "observedGeneration": self.observed_generation,
            "conditions": [c.to_dict() for c in self.conditions],
            "progress": self.progress.to_dict(running=self.phase is Phase.RUNNING) if self.progress else None,
            "lastCheckpoint": self.last_checkpoint.to_dict() if self.last_checkpoint else None,
            # no null inside: the apiserver prunes it, and the status read back would never equal this one
            "placement": {"nodes": list(self.nodes), **({"spans": self.spans} if self.spans else {})}
            if self.nodes
            else None,
            "excludedNodes": [e.to_dict() for e in self.excluded_nodes] or None,
            "lastMachineFault": self.machine_fault.to_dict() if self.machine_fault else None,
        }


def _nonneg(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def parse_status(status: Mapping[str, Any] | None) -> JobStatus:
    """Read back what ``to_dict`` wrote; tolerant of a missing or partial status."""
    status = status or {}
    try:
        phase = Phase(status.get("phase") or "")
    except ValueError:
        phase = Phase.NEW
    conditions: list[Condition] = []
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and isinstance(c.get("type"), str):
            conditions.append(
                Condition(
                    type=c["type"],
                    status=c.get("status") == "True",
                    reason=str(c.get("reason") or ""),
                    message=str(c.get("message") or ""),
                    last_transition_time=to_time(c.get("lastTransitionTime")),
                )
            )
    counts: Mapping[str, Any] = status["replicas"] if isinstance(status.get("replicas"), Mapping) else {}
    ready = str(status.get("ready") or "0/0").partition("/")
    launched = status.get("launchedAttempt")
    placed: Mapping[str, Any] = status["placement"] if isinstance(status.get("placement"), Mapping) else {}
    return JobStatus(
        phase=phase,
        attempt=_nonneg(status.get("attempt")),
        restarts=_nonneg(status.get("restarts")),
        launched_attempt=launched if isinstance(launched, int) and not isinstance(launched, bool) else -1,
        admitted_replicas=_nonneg(status.get("admittedReplicas")),
        start_time=to_time(status.get("startTime")),
        completion_time=to_time(status.get("completionTime")),
        active=_nonneg(counts.get("active")),
        succeeded=_nonneg(counts.get("succeeded")),
        failed=_nonneg(counts.get("failed")),
        running=_nonneg(int(ready[0]) if ready[0].isdigit() else 0),
        replicas=_nonneg(int(ready[2]) if ready[2].isdigit() else 0),
        observed_generation=_nonneg(status.get("observedGeneration")),
        conditions=tuple(conditions),
        progress=ProgressStatus.parse(status.get("progress")),
        last_checkpoint=Checkpoint.parse(status.get("lastCheckpoint")),
        nodes=tuple(str(n or "") for n in placed.get("nodes") or []),
        spans=str(placed.get("spans") or ""),
        excluded_nodes=ExcludedNode.parse(status.get("excludedNodes")),
        machine_fault=MachineFault.parse(status.get("lastMachineFault")),
    )


def with_counts(status: JobStatus, observation: Observation, replicas: int) -> JobStatus:
    """The status with the observed counts of pods (active, succeeded, failed, running, ready) and each rank's
    node (a finished job keeps the nodes it ran on once its pods are gone; any other job shows only where its
    pods are now)."""
    nodes = tuple(observation.current[r].node if r in observation.current else "" for r in range(replicas))
    kept = status.phase.finished and not any(nodes)
    return replace(
        status,
        nodes=status.nodes if kept else (nodes if any(nodes) else ()),
        spans=status.spans if kept or any(nodes) else "",
        active=observation.active,
        succeeded=observation.succeeded,
        failed=observation.failed,
        running=observation.running,
        replicas=replicas,
    )


def sorted_failures(failures: Sequence[Failure]) -> list[Failure]:
    """Earliest first (by the trainer's finish time; unknown times last), then by rank."""
    return sorted(failures, key=lambda f: (f.finished_at == "", f.finished_at, f.rank))
