"""Pure: Kueue's topology-aware scheduling (TAS) for a job.

A job asks for a placement the way Kueue's built-in kinds do, with its pod template's annotations
(``kueue.x-k8s.io/podset-required-topology: <node label>`` and the others of ``kueue.TOPOLOGY_ANNOTATIONS``);
``request`` turns them into its Workload's ``topologyRequest``, as Kueue's jobframework does, ranks indexed by
``ddpjob.dev/rank`` so that rank i lands in the i-th domain of Kueue's assignment (its domains are sorted, so ring
neighbours share a rack where they can). ``assigned`` reads the domains an admission gave back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpjob_contract import kueue
from ddpjob_contract.pods import LABEL_RANK


def request(annotations: Mapping[str, str]) -> dict[str, Any] | None:
    """The Workload pod set's ``topologyRequest`` the annotations make (required wins over preferred, preferred over
    unconstrained, as in Kueue); None when they ask for no topology."""
    found: dict[str, Any] = {}
    required = annotations.get(kueue.ANNOTATION_REQUIRED_TOPOLOGY, "")
    preferred = annotations.get(kueue.ANNOTATION_PREFERRED_TOPOLOGY, "")
    if required:
        found["required"] = required
    elif preferred:
        found["preferred"] = preferred
    elif annotations.get(kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY, "") in kueue.TRUE_WORDS:  # the CRD allows booleans
        found["unconstrained"] = True
    slice_level = annotations.get(kueue.ANNOTATION_SLICE_REQUIRED_TOPOLOGY, "")
    slice_size = annotations.get(kueue.ANNOTATION_SLICE_SIZE, "")
    if slice_level and slice_size.isdigit():
        found |= {"podSetSliceRequiredTopology": slice_level, "podSetSliceSize": int(slice_size)}
    if not found:
        return None
    return {**found, "podIndexLabel": LABEL_RANK}


def asks(annotations: Mapping[str, str]) -> bool:
    """Whether a pod with these annotations is one Kueue places by topology (its ``IsTAS``)."""
    return any(annotations.get(key) for key in kueue.TOPOLOGY_ANNOTATIONS)


@dataclass(frozen=True)
class Domain:
    """One domain of an assignment: its value at each level (outermost first), and how many pods it holds."""

    values: tuple[str, ...]
    pods: int


def assigned(assignment: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[Domain, ...]]:
    """A pod set assignment's ``topologyAssignment``: its levels and its domains, in Kueue's order (rank i is in
    the i-th pod's domain). Empty when the admission placed no topology."""
    topology = assignment.get("topologyAssignment") or {}
    levels = tuple(str(level) for level in topology.get("levels") or [])
    domains: list[Domain] = []
    for piece in topology.get("slices") or []:
        count = int(piece.get("domainCount") or 0)
        per_level: Sequence[Mapping[str, Any]] = piece.get("valuesPerLevel") or []
        pods: Mapping[str, Any] = piece.get("podCounts") or {}
        for i in range(count):
            values = tuple(_value(level, i) for level in per_level)
            domains.append(Domain(values, _count(pods, i)))
    return levels, tuple(domains)


def _value(level: Mapping[str, Any], i: int) -> str:
    if "universal" in level:
        return str(level["universal"])
    individual = level.get("individual") or {}
    roots = individual.get("roots") or []
    root = str(roots[i]) if i < len(roots) else ""
    return f"{individual.get('prefix') or ''}{root}{individual.get('suffix') or ''}"


def _count(pods: Mapping[str, Any], i: int) -> int:
    if "universal" in pods:
        return int(pods["universal"] or 0)
    individual = pods.get("individual") or []
    return int(individual[i]) if i < len(individual) else 0


HOSTNAME_LABEL = "kubernetes.io/hostname"


def nodes(assignment: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes a topology assignment names, in its order, when its last level is the node; else none."""
    levels, domains = assigned(assignment)
    if not levels or levels[-1] != HOSTNAME_LABEL:
        return ()
    return tuple(d.values[-1] for d in domains if d.values)


def level(annotations: Mapping[str, str]) -> str:
    """The node label a job's placement is about (its required, preferred or slice level); empty: none."""
    for key in (kueue.ANNOTATION_REQUIRED_TOPOLOGY, kueue.ANNOTATION_PREFERRED_TOPOLOGY,
                kueue.ANNOTATION_SLICE_REQUIRED_TOPOLOGY):  # fmt: skip
        if annotations.get(key):
            return annotations[key]
    return ""


def spanned(template: Mapping[str, Any], nodes: Sequence[str], labels: Mapping[str, Mapping[str, str]]) -> str:
    """``spans`` at the level the pod ``template``'s topology annotations name; empty without a topology request."""
    found = level((template.get("metadata") or {}).get("annotations") or {})
    return spans(found, nodes, labels) if found else ""


def spans(level_label: str, nodes: Sequence[str], labels: Mapping[str, Mapping[str, str]]) -> str:
    """What ``kubectl get ddpj -o wide`` shows of a placement by topology: the values of the job's level on its ranks'
    nodes, in rank order, as ``rack-0,rack-1`` (Kueue's assignment names only the nodes when the Topology's last level
    is the hostname, so the nodes' own labels say the racks); empty when none is known."""
    found = (labels.get(node, {}).get(level_label, "") for node in nodes if node)
    return ",".join(dict.fromkeys(v for v in found if v))
