"""The box's node topology, as a cloud labels its nodes: ``--topology block=2,rack=2`` over ``--nodes 4`` puts the
nodes in 2 blocks of 2 racks, one node per rack, and labels each with its block and rack. Kueue's topology-aware
scheduling reads those labels through a ``Topology`` (``topology_object``) that a ResourceFlavor names.

Pure: parsing, labels and the objects, nothing talks to a cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ddpjob_box.errors import BoxError

LABEL_PREFIX = "topology.ddpjob.dev/"
"""Each level's node label is this prefix and the level's name: ``topology.ddpjob.dev/rack``."""
HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The innermost level of every Topology the box applies: one node, as Kueue needs to place pods on nodes."""
POOL_LABEL = LABEL_PREFIX + "pool"
"""On every node of a box with a topology: the node label the ResourceFlavor selects (Kueue needs at least one)."""
POOL = "box"
TOPOLOGY_NAME = "box-topology"
"""The Topology the box applies, and the ResourceFlavor that names it."""
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"


@dataclass(frozen=True)
class Level:
    """``count`` domains of ``name`` inside each domain of the level above (the first level: in the box)."""

    name: str
    count: int

    @property
    def label(self) -> str:
        return LABEL_PREFIX + self.name


def parse(text: str) -> tuple[Level, ...]:
    """``block=2,rack=2``, outermost first; empty: no topology."""
    levels: list[Level] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("=")
        if not name.isidentifier() or not count.isdigit() or int(count) < 1:
            raise BoxError(
                f"--topology: {part!r} is not LEVEL=COUNT: write the levels outermost first, "
                "each with how many it holds of itself in the one above, as in block=2,rack=2"
            )
        if name in {level.name for level in levels}:
            raise BoxError(f"--topology: the level {name!r} is named twice: name each level once")
        levels.append(Level(name, int(count)))
    return tuple(levels)


def node_labels(levels: tuple[Level, ...], node_count: int) -> list[dict[str, str]]:
    """Node i's labels: the nodes split evenly over the innermost domains in order, so nodes 0 and 1 share a rack
    when there are two per rack. A level's value numbers its domains across the box (``rack-0``...``rack-3`` for
    2 blocks of 2 racks), so that a value names one domain."""
    if not levels:
        return [{} for _ in range(node_count)]
    domains = math.prod(level.count for level in levels)
    if node_count % domains:
        raise BoxError(
            f"--topology {','.join(f'{lv.name}={lv.count}' for lv in levels)} makes {domains} "
            f"{levels[-1].name}s, which {node_count} nodes do not fill evenly: give --nodes a multiple of {domains}"
        )
    per_domain = node_count // domains
    labels = []
    for node in range(node_count):
        innermost = node // per_domain
        # the domain of each level: how many of its domains lie wholly before this node's innermost one
        inside = [math.prod(lv.count for lv in levels[i + 1 :]) for i in range(len(levels))]
        place = {lv.label: f"{lv.name}-{innermost // n}" for lv, n in zip(levels, inside, strict=True)}
        labels.append({POOL_LABEL: POOL, **place})
    return labels


def topology_object(levels: tuple[Level, ...]) -> dict[str, Any]:
    """Kueue's Topology of the box: each level's label, outermost first, then the node's hostname."""
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY_NAME},
        "spec": {"levels": [{"nodeLabel": lv.label} for lv in levels] + [{"nodeLabel": HOSTNAME_LABEL}]},
    }


def resource_flavor() -> dict[str, Any]:
    """The ResourceFlavor of the box's nodes that names the Topology: a ClusterQueue that grants it places its
    workloads by topology."""
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": TOPOLOGY_NAME},
        "spec": {"nodeLabels": {POOL_LABEL: POOL}, "topologyName": TOPOLOGY_NAME},
    }
