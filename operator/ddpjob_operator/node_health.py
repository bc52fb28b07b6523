"""The nodes the operator knows to be lost or sick (``nodewatch``), as ``policies.node_loss`` reads them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

EXCLUSION_SECONDS = 3600.0
"""How long a node stays in ``status.excludedNodes`` by default."""


@dataclass(frozen=True)
class NodeHealth:
    """The nodes the operator knows to be bad (name -> why), and how long a job avoids one after leaving it."""

    lost: Mapping[str, str] = field(default_factory=dict)
    sick: Mapping[str, str] = field(default_factory=dict)
    repelling: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)
    """Each sick node's unhealthy taints that keep pods off it (``NoSchedule`` or ``NoExecute``): Kueue's topology
    assignment replaces such a node unless the pods tolerate the taint."""
    exclusion_seconds: float = EXCLUSION_SECONDS
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Each node's labels (its place in racks and blocks, for ``status.placement.spans``)."""

    def why(self, node: str) -> str:
        return self.lost.get(node) or self.sick.get(node) or ""


ALL_HEALTHY = NodeHealth()
