"""The DDPJobs, from one list-and-watch per watched namespace (or across the cluster), as the pod cache's pods.

Each event goes to ``changed(key, type, body)`` as Kopf's watch delivered it (type None for a listed job), on the
watch's thread. Kopf's per-event machinery (a task per object, loggers, causes, handler invocation) cost more
CPU than the reconcile it woke, a third of the operator's under load (bench.peer_operator), and two of the three
events of a new job are the echoes of our own status writes, which ``Runtime.job_event`` drops at once.

A watch the apiserver ends is resumed from the last version seen; one that expired (410 Gone) or failed is
replaced by a fresh LIST, which also says DELETED for the jobs listed before and missing now (deleted during the
gap). An apiserver that does not serve DDPJobs yet (just restarted, or the CRD not installed) is asked again,
with backoff, for as long as the operator runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ddpjob_operator.api import Key
from ddpjob_operator.listwatch import WATCH_SECONDS, ListWatch

Changed = Callable[[Key, str | None, dict[str, Any] | None], None]


class JobSource(Protocol):
    """What the watch reads of the apiserver (``kube.Kube`` in production)."""

    def list_jobs(self, namespace: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_jobs(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]: ...


def _key(job: Mapping[str, Any]) -> Key:
    meta = job.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class JobWatch(ListWatch):
    """``served``: the operator's namespaces (empty: all; patterns are matched here against a cluster-wide watch)."""

    def __init__(self, kube: JobSource, served: Sequence[str], changed: Changed) -> None:
        super().__init__(served, "DDPJob")
        self._kube = kube
        self._changed = changed
        self._known: dict[str, set[Key]] = {scope: set() for scope in self._scopes}
        """The jobs of each scope seen and not deleted since: a LIST that lacks one says it was deleted."""

    def _list(self, namespace: str) -> str:
        items, version = self._kube.list_jobs(namespace)
        listed = {_key(job): job for job in items if self._served(_key(job)[0])}
        for gone in self._known[namespace] - listed.keys():
            self._changed(gone, "DELETED", None)
        self._known[namespace] = set(listed)
        for key, job in listed.items():
            self._changed(key, None, job)
        return version

    def _watch_events(self, namespace: str, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._kube.watch_jobs(namespace, version, WATCH_SECONDS)

    def _event(self, namespace: str, kind: str, job: dict[str, Any]) -> None:
        key = _key(job)
        if kind == "DELETED":
            self._known[namespace].discard(key)
        else:
            self._known[namespace].add(key)
        self._changed(key, kind, job)
