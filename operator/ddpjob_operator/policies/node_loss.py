"""A rank on a lost or sick node: the gang restarts off it at once, and the job avoids that node for a while.

- **Lost**: the node's ``Ready`` condition is ``Unknown`` or ``False`` (its kubelet stopped renewing its Lease for
  the controller-manager's ``--node-monitor-grace-period``), the node object is gone, or it carries
  ``node.kubernetes.io/out-of-service``. Its kubelet cannot confirm a deletion, so a pod there would stay
  ``Terminating`` for as long as the node is away, and its name (``<job>-<rank>``) would block the rank's next pod:
  such pods are deleted with no grace period. Only there: a pod on a node whose kubelet answers is never
  force-deleted.
- **Sick**: the node is Ready but carries a taint a health checker sets (``UNHEALTHY_TAINTS`` by default, a
  flag of the operator). Its kubelet answers, so its pods stop as usual (SIGTERM, save on stop).

Either way the restart is counted once (reason ``NodeLost`` or ``NodeUnhealthy``), and the node goes into
``status.excludedNodes`` with why and since when: the next attempt's pods carry a node affinity that keeps them off
it until the entry expires or the user removes it.

Why force deletion is safe there: the pod's name is freed in the apiserver at once, but its processes may still run
on a node that is partitioned, not dead. They cannot train beside the next attempt: the gang restart deleted every
rank, so their peers are gone, and rank 0's Service name points at the next attempt's rank 0; a collective with
a missing peer fails at the process group's timeout. When the node's kubelet comes back, it finds the pod's uid
gone from the apiserver and kills its containers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ddpjob_contract.status import Reason
from ddpjob_operator.actions import Plan
from ddpjob_operator.node_health import NodeHealth
from ddpjob_operator.policies.restart import no_restarts_left
from ddpjob_operator.status import ExcludedNode, PodView
from ddpjob_operator.transitions import Finish, NodeLostUnder, Restart, Transition
from ddpjob_operator.view import View

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
UNHEALTHY_TAINTS = (
    "nvidia.com/gpu-unhealthy",
    "node.kubernetes.io/gpu-unhealthy",
    "ddpjob.dev/unhealthy",
)
"""Taints that say a Ready node is bad for training, honoured by default: NVIDIA's GPU health checks, as the GPU
operator's node-problem-detector plugins name them, and our own, for an admin or a script to set by hand."""


def read(node: Mapping[str, Any] | None, unhealthy_taints: Iterable[str] = UNHEALTHY_TAINTS) -> tuple[str, str]:
    """(why it is lost, why it is sick) from a Node object ("" for no; None: the node is gone)."""
    if node is None:
        return "the node was deleted", ""
    taints = {str(t.get("key")): t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, Mapping)}
    if OUT_OF_SERVICE in taints:
        return f"the node carries the taint {OUT_OF_SERVICE}", ""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") != "True":
        said = str(ready.get("reason") or "") or str(ready.get("message") or "")
        since = str(ready.get("lastTransitionTime") or "")
        return (f"its Ready condition is {ready.get('status')}" + (f" ({said})" if said else "")
                + (f" since {since}" if since else "")), ""  # fmt: skip
    for key in unhealthy_taints:
        if key in taints:
            value = str(taints[key].get("value") or "")
            return "", f"the node carries the taint {key}" + (f"={value}" if value else "")
    return "", ""


@dataclass(frozen=True)
class Left:
    """The attempt's first rank found on a bad node."""

    pod: PodView
    node: str
    why: str
    lost: bool


def decide(pods: Sequence[PodView], health: NodeHealth) -> Left | None:
    """The first pod of the attempt still at work (not finished) on a lost or sick node, lost ones first."""
    live = sorted((p for p in pods if not p.finished and p.node), key=lambda p: (p.rank is None, p.rank or 0))
    for bad, lost in ((health.lost, True), (health.sick, False)):
        for pod in live:
            if pod.node in bad:
                return Left(pod, pod.node, bad[pod.node], lost)
    return None


def under_last_attempt(
    stale: Sequence[PodView], attempt: int, health: NodeHealth, excluded: Iterable[str]
) -> Left | None:
    """A pod of the attempt just before ``attempt`` on a lost node not yet excluded: the node was lost under that
    attempt, whose restart came first. A power cut kills a rank's processes at once, and its peers' collectives fail
    at once (a connection reset), while the node is marked NotReady only after the controller-manager's grace
    period: the restart is then already counted, as a rank's failure, and the node's loss is its cause."""
    known = set(excluded)
    for pod in sorted(stale, key=lambda p: (p.rank is None, p.rank or 0)):
        if pod.attempt == attempt - 1 and pod.node in health.lost and pod.node not in known:
            return Left(pod, pod.node, health.lost[pod.node], True)
    return None


MACHINE_EXITS = {135: "SIGBUS (exit code 135): memory the machine could not read"}
"""Exit codes that point at the machine rather than the program."""
MACHINE_WORDS = ("CUDA error", "NCCL error", "uncorrectable ECC", "Xid", "DeviceError")
"""Words of a rank's exit message that point at the machine: a CUDA or NCCL error, a GPU's ECC error or Xid."""


def machine_fault(exit_code: int | None, message: str) -> str:
    """Why a rank's exit points at its machine ("" when it does not)."""
    if exit_code in MACHINE_EXITS:
        return MACHINE_EXITS[exit_code]
    said = next((w for w in MACHINE_WORDS if w.lower() in message.lower()), "")
    return f"its exit message names a {said}" if said else ""


def twice_on(last: tuple[str, int] | None, node: str, rank: int) -> bool:
    """Whether the rank's machine fault on ``node`` is its second in a row there."""
    return bool(node) and last == (node, rank)


def force_delete(pods: Iterable[PodView], health: NodeHealth) -> tuple[PodView, ...]:
    """Of the pods to delete, or already being deleted, those on a lost node: with no grace period."""
    return tuple(p for p in pods if p.node and p.node in health.lost)


def still_excluded(since: datetime | None, now: datetime, seconds: float) -> bool:
    return since is not None and (now - since).total_seconds() < seconds


def rule(v: View) -> Transition | None:
    """A rank of the attempt on a lost or sick node restarts the gang off it at once."""
    left = decide(tuple(v.obs.current.values()), v.nodes)
    if left is None:
        return _lost_under_last_attempt(v)
    reason = Reason.NODE_LOST if left.lost else Reason.NODE_UNHEALTHY
    state = "is lost" if left.lost else "is unhealthy"
    cause = f"node {left.node} {state} ({left.why}): rank {left.pod.rank}'s pod {left.pod.name} ran there"
    rp = v.job.spec.run_policy
    if v.status.restarts >= rp.backoff_limit:
        return Finish(False, Reason.BACKOFF, f"{cause}; {no_restarts_left(rp.backoff_limit)}")
    excluded = ExcludedNode(left.node, reason.value, left.why, v.now)
    return Restart(reason, f"{cause}; the next attempt avoids the node", rp.backoff_limit, exclude=excluded)


def _lost_under_last_attempt(v: View) -> Transition | None:
    """The restart under way came from a node lost under the last attempt (``under_last_attempt``)."""
    left = under_last_attempt(v.obs.stale, v.status.attempt, v.nodes, v.status.excluded_names)
    if left is None:
        return None
    message = (f"node {left.node} is lost ({left.why}): rank {left.pod.rank}'s pod {left.pod.name} ran there, and the "
               f"gang's restart as attempt {v.status.attempt} (restart {v.status.restarts}, already counted) came from "
               f"it; the next attempts avoid the node")  # fmt: skip
    return NodeLostUnder(message, ExcludedNode(left.node, Reason.NODE_LOST.value, left.why, v.now))


def leave_bad_nodes(the_plan: Plan, pods: Sequence[PodView], nodes: NodeHealth) -> dict[str, Any]:
    """Pods on a lost node go with no grace period: those this plan deletes, those deleted before and stuck there,
    and those of an earlier attempt that would wait to be restarted in place (their kubelet cannot). Every pod made
    avoids the nodes the job excludes."""
    attempt = the_plan.status.attempt
    earlier = (p for p in pods if p.terminating or (p.attempt is not None and p.attempt < attempt))
    forced = force_delete(dict.fromkeys([*the_plan.delete_pods, *earlier]), nodes)
    names = {p.name for p in forced}
    return {
        "delete_pods": tuple(p for p in the_plan.delete_pods if p.name not in names),
        "adopt_pods": tuple(p for p in the_plan.adopt_pods if p.name not in names),
        "force_delete_pods": forced,
        "avoid_nodes": the_plan.status.excluded_names,
    }


REPELLING_EFFECTS = ("NoSchedule", "NoExecute")
"""The taint effects for which Kueue (v0.17, ``TASReplaceNodeOnNodeTaints``) replaces a Ready node in a topology
assignment, as its node controller's ``classifyTaints`` reads them."""


def repelling(node: Mapping[str, Any] | None, unhealthy_taints: Iterable[str] = UNHEALTHY_TAINTS) -> tuple[
        Mapping[str, str], ...]:  # fmt: skip
    """The node's unhealthy taints that keep pods off it (key, value, effect)."""
    taints = [t for t in ((node or {}).get("spec") or {}).get("taints") or [] if isinstance(t, Mapping)]
    keys = set(unhealthy_taints)
    return tuple({"key": str(t.get("key")), "value": str(t.get("value") or ""), "effect": str(t.get("effect"))}
                 for t in taints if t.get("key") in keys and t.get("effect") in REPELLING_EFFECTS)  # fmt: skip


def tolerated(taint: Mapping[str, str], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a toleration with no ``tolerationSeconds`` matches ``taint``, as Kubernetes matches one (Kueue keeps
    a node whose taint the pods tolerate for good; a toleration for a while does not keep it)."""
    for t in tolerations:
        if t.get("tolerationSeconds") is not None or (t.get("effect") or taint["effect"]) != taint["effect"]:
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint["key"]:
                return True
        elif t.get("operator") in (None, "", "Equal") and t.get("key") == taint["key"] and str(
                t.get("value") or "") == taint["value"]:  # fmt: skip
            return True  # (Lt and Gt compare numbers, and never tolerate a taint)
    return False


def awaiting_replacement(the_plan: Plan, nodes: NodeHealth, tolerations: Iterable[Mapping[str, Any]] = ()) -> Plan:
    """Under Kueue's topology assignment, no new pod while the assignment still names a node known lost, or a sick
    one the job has just left whose taint the pods (``tolerations``: the template's) do not tolerate: Kueue replaces
    it (or evicts the job) first, and writes the Workload, which wakes the job. A pod made sooner could be ungated
    onto that node, never bound, and failed by Kueue: a second restart.

    For a sick node, only one in ``status.excludedNodes``: the job's own pods leaving it are what has Kueue's node
    controller look at it again (it replaces a Ready node once no pod of the job runs there). A sick node Kueue placed
    the job on, with no pod of the job ever there, Kueue may never look at again: waiting for it could last as long
    as the taint. So could one whose taint the pods tolerate, or that only prefers no pods, which Kueue keeps."""
    kept = tuple(tolerations)
    left = set(the_plan.status.excluded_names)
    sick = {n for n, taints in nodes.repelling.items() if n in left and any(not tolerated(t, kept) for t in taints)}
    bad = [n for n in the_plan.placement.assigned_nodes if n in nodes.lost or n in sick]
    if not bad or not the_plan.create_ranks:
        return the_plan
    return replace(the_plan, create_ranks=(), create_pod_group=False, create_service=False)
