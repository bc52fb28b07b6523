"""The cluster's nodes, from one list-and-watch: which are lost or sick (``policies.node_loss``), for every plan.

A node whose health changes wakes the jobs with a pod on it (``changed(node)``); no job polls a node. Nodes are
cluster-scoped: an operator without the right to list them (a namespaced install whose chart was told not to grant
it) logs that once per failed LIST and plans as if every node were healthy, as it did before it read nodes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, Protocol

from ddpjob_operator.listwatch import WATCH_SECONDS, ListWatch
from ddpjob_operator.node_health import ALL_HEALTHY, EXCLUSION_SECONDS, NodeHealth
from ddpjob_operator.policies import node_loss


class NodeSource(Protocol):
    """What the watch reads of the apiserver (``kube.Kube`` in production)."""

    def list_nodes(self) -> tuple[list[dict[str, Any]], str]: ...

    def watch_nodes(self, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]: ...


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


class NodeWatch(ListWatch):
    """``unhealthy_taints``: the taints that make a Ready node sick; ``exclusion_seconds``: how long a job avoids a
    node it left (both flags of the operator)."""

    def __init__(
        self,
        kube: NodeSource,
        changed: Callable[[str], None],
        *,
        unhealthy_taints: Iterable[str] = node_loss.UNHEALTHY_TAINTS,
        exclusion_seconds: float = EXCLUSION_SECONDS,
    ) -> None:
        super().__init__([], "node")
        self._kube = kube
        self._changed = changed
        self._taints = tuple(unhealthy_taints)
        self._exclusion = exclusion_seconds
        self._verdicts: dict[str, tuple[str, str, tuple[Mapping[str, str], ...]]] = {}
        """Each known node's (why lost, why sick, its taints that keep pods off it when sick); a node deleted is lost
        until its name is seen again."""
        self._health = NodeHealth(exclusion_seconds=exclusion_seconds)
        self._labels: dict[str, Mapping[str, str]] = {}
        """Each node's labels, copied anew when one changes (read without the lock)."""
        self._lock = threading.Lock()

    def health(self) -> NodeHealth:
        return replace(self._health, labels=self._labels)

    def _list(self, namespace: str) -> str:
        items, version = self._kube.list_nodes()
        listed = {_name(n): n for n in items}
        gone = [name for name in self._verdicts if name not in listed]
        for name in gone:
            self._take(name, None)
        for name, node in listed.items():
            self._take(name, node)
        return version

    def _watch_events(self, namespace: str, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._kube.watch_nodes(version, WATCH_SECONDS)

    def _event(self, namespace: str, kind: str, obj: dict[str, Any]) -> None:
        self._take(_name(obj), None if kind == "DELETED" else obj)

    def _take(self, name: str, node: Mapping[str, Any] | None) -> None:
        lost, sick = node_loss.read(node, self._taints)
        verdict = (lost, sick, node_loss.repelling(node, self._taints) if sick else ())
        labels = dict(((node or {}).get("metadata") or {}).get("labels") or {})
        with self._lock:
            if node is None and name in self._labels:
                self._labels = {n: v for n, v in self._labels.items() if n != name}
            elif node is not None and self._labels.get(name) != labels:
                self._labels = {**self._labels, name: labels}
            if self._verdicts.get(name) == verdict:
                return
            self._verdicts[name] = verdict
            self._health = NodeHealth(
                lost={n: v[0] for n, v in self._verdicts.items() if v[0]},
                sick={n: v[1] for n, v in self._verdicts.items() if v[1] and not v[0]},
                repelling={n: v[2] for n, v in self._verdicts.items() if v[2]},
                exclusion_seconds=self._exclusion,
            )
        self._changed(name)


class Unwatched:
    """Nodes not watched (``--no-node-watch``, the chart's ``nodeHealth.enabled: false``): every node is healthy."""

    def health(self) -> NodeHealth:
        return ALL_HEALTHY

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
