"""Kueue in one place: every request the operator makes of Kueue's API (``Kueue``), and the one watch of the
Workloads it owns (``WorkloadWatch``), which keeps them in memory and wakes a job when Kueue writes its Workload.

A DDPJob labelled ``kueue.x-k8s.io/queue-name`` has one Workload (``builders.workload``). Kueue's decisions about
it (admission, eviction, requeue) are writes to that Workload: the watch delivers each to ``changed(key)``, which
wakes only its job, so a job asks the apiserver nothing while it waits in a queue. A LIST (at start, after a
watch expired or failed) restores every Workload and wakes each one's job.

Until the watch has listed (Kueue not installed yet, or the operator just started), ``Kueue.workload`` GETs, as
each reconcile did before there was a watch, and the plan looks again every few seconds (``Queueing.watched``).
While the apiserver does not serve Kueue's API, the watch asks discovery again every ``UNSERVED_SECONDS``, quietly.

Like the pod cache, the memory never leads but for the answers to the operator's own writes (the Workload it
created, the status it applied), taken in at once unless the watch has delivered a newer version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ddpjob_contract import kueue
from ddpjob_operator import topology
from ddpjob_operator.api import Key
from ddpjob_operator.listwatch import WATCH_SECONDS, ListWatch, NotYet
from ddpjob_operator.podcache import job_key, newer, uid

Workload = dict[str, Any]

UNSERVED_SECONDS = 30.0
"""How often the watch asks whether the apiserver serves Kueue's Workloads, while it does not."""


class KueueApi(Protocol):
    """The requests ``Kueue`` makes (``kube.Kube`` in production)."""

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None: ...

    def create(self, obj: Mapping[str, Any]) -> bool: ...

    def apply_workload_status(self, manager: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def release_workload(self, namespace: str, name: str) -> None: ...


class WorkloadSource(Protocol):
    """What the watch reads (``kube.Kube``, on connections of its own)."""

    def serves(self, api_version: str, plural: str) -> bool: ...

    def list_workloads(self, namespace: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_workloads(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]: ...


def _slim(workload: Mapping[str, Any]) -> Workload:
    """What ``queueing.read`` reads (managedFields, most of a Workload's bytes, dropped)."""
    meta = {k: v for k, v in (workload.get("metadata") or {}).items() if k != "managedFields"}
    return {**workload, "metadata": meta}


def _held(workload: Mapping[str, Any]) -> bool:
    """Being deleted, and still held by Kueue's finalizer."""
    meta = workload.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) and kueue.FINALIZER in (meta.get("finalizers") or [])


def _assigned_nodes(workload: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes its admission's topology assignments name (none without one)."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return tuple(n for a in admission.get("podSetAssignments") or [] for n in topology.nodes(a))


def _covers(listed: set[str], namespace: str) -> bool:
    return "" in listed or namespace in listed


def _where(workload: Mapping[str, Any]) -> tuple[str, str]:
    meta = workload.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


FLAVOR_SECONDS = 30.0
"""How long a ResourceFlavor read is kept: read on every reconcile of an admitted job, it was 63 GETs per job
(``bench.scale``, 400 jobs of 8 ranks); an admin's edit of a flavor reaches new pods within this."""


class Kueue:
    """Kueue's API as the operator uses it; thread-safe. Reads come from the watch's memory once it has listed
    the namespace (``listed``), from a GET before."""

    def __init__(self, api: KueueApi, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._clock = clock
        self._flavors: dict[str, tuple[float, dict[str, Any] | None]] = {}
        """Each ResourceFlavor read, with when (``clock``)."""
        self._workloads: dict[tuple[str, str], Workload] = {}
        self._listed: set[str] = set()
        """The scopes the watch has listed ("": every namespace)."""
        self._lock = threading.Lock()

    # Reads

    def watched(self, namespace: str) -> bool:
        """Whether the watch has listed ``namespace``: Kueue's writes to its Workloads wake their jobs."""
        with self._lock:
            return _covers(self._listed, namespace)

    def workload(self, namespace: str, name: str) -> Workload | None:
        """The Workload, or None; ``kube.NotServed`` when Kueue is not installed (known only before a LIST)."""
        with self._lock:
            if _covers(self._listed, namespace):
                return self._workloads.get((namespace, name))
        return self._api.get_workload(namespace, name)

    def flavor(self, name: str) -> dict[str, Any] | None:
        """A ResourceFlavor an admission names (read when the job is admitted, not while it waits), as read in the
        last ``FLAVOR_SECONDS``."""
        now = self._clock()
        with self._lock:
            kept = self._flavors.get(name)
        if kept is not None and now - kept[0] < FLAVOR_SECONDS:
            return kept[1]
        found = self._api.get_kueue_object("resourceflavors", name)
        with self._lock:
            self._flavors[name] = (now, found)
        return found

    def priority_class(self, name: str) -> dict[str, Any] | None:
        """A WorkloadPriorityClass a job names (read before its Workload is made)."""
        return self._api.get_kueue_object("workloadpriorityclasses", name)

    def orphans(self) -> list[tuple[str, str, Key]]:
        """(namespace, name, job) of the Workloads being deleted that still hold Kueue's finalizer, as last seen."""
        with self._lock:
            held = [(where, w) for where, w in self._workloads.items() if _held(w)]
        return [(*where, key) for where, w in held if (key := job_key(w)) is not None]

    def jobs_assigned(self, node: str) -> set[Key]:
        """The jobs whose Workload's topology assignment names ``node``, as last seen. A job held because its
        assignment named a lost node (``lifecycle``) is woken when that node turns Ready again: it may then make its
        pods there, before Kueue replaces the node (which wakes it through its Workload). A namespace the watch has not
        listed (its Workloads read by GET) has none here: its held jobs wait for the resync. Each call reads every
        Workload known (a node's health changes seldom)."""
        with self._lock:
            known = list(self._workloads.values())
        return {key for w in known if node in _assigned_nodes(w) and (key := job_key(w)) is not None}

    # Writes

    def create(self, workload: Mapping[str, Any]) -> bool:
        """Create if absent (True: created). Either way it is known at once, before its watch event: the one created,
        or the one that was there (read)."""
        created = self._api.create(workload)
        found = dict(workload) if created else self._api.get_workload(*_where(workload))
        if found is not None:
            self._took(found)
        return created

    def apply_status(self, manager: str, body: Mapping[str, Any]) -> None:
        """Server-side apply of the Workload's status as ``manager``; its answer is known at once."""
        self._took(self._api.apply_workload_status(manager, body))

    def release(self, namespace: str, name: str) -> None:
        """Drop Kueue's finalizer (``kube.Kube.release_workload``)."""
        self._api.release_workload(namespace, name)

    def _took(self, answer: Mapping[str, Any]) -> None:
        """Our own write's answer, unless the watch has already delivered a newer version."""
        where = _where(answer)
        if not where[1]:
            return
        with self._lock:
            if not _covers(self._listed, where[0]):
                return  # read by GET until listed
            known = self._workloads.get(where)
            if known is None or newer(answer, known):
                self._workloads[where] = _slim(answer)

    # From the watch

    def replace(self, scope: str, workloads: Sequence[Mapping[str, Any]]) -> set[Key]:
        """A LIST of ``scope`` ("": all): it replaces what was known there; returns every job it touched."""
        with self._lock:
            stale = [self._workloads.pop(w) for w in self._in_scope(scope)]
            fresh = {_where(w): _slim(w) for w in workloads}
            self._workloads.update(fresh)
            self._listed.add(scope)
        return {key for w in (*stale, *fresh.values()) if (key := job_key(w)) is not None}

    def unlisted(self, scope: str) -> None:
        """The apiserver no longer serves Workloads: read by GET again, which says so."""
        with self._lock:
            self._listed.discard(scope)
            for where in self._in_scope(scope):
                del self._workloads[where]

    def _in_scope(self, scope: str) -> list[tuple[str, str]]:
        """The Workloads known in ``scope`` ("": all); the caller holds the lock."""
        return [w for w in self._workloads if not scope or w[0] == scope]

    def took(self, kind: str, workload: Mapping[str, Any]) -> Key | None:
        """A watch event; the job it concerns."""
        where = _where(workload)
        with self._lock:
            if kind == "DELETED":
                if where in self._workloads and uid(self._workloads[where]) == uid(workload):  # not a newer one
                    del self._workloads[where]
            else:
                self._workloads[where] = _slim(workload)
        return job_key(workload)


class WorkloadWatch(ListWatch):
    """Keeps ``kueue``'s Workloads current, on one thread per watched scope; ``changed`` is called, from those
    threads, with the job of each Workload that changed."""

    def __init__(self, source: WorkloadSource, served: Sequence[str], kueue_: Kueue, changed: Callable[[Key], None],
                 *, unserved_seconds: float = UNSERVED_SECONDS) -> None:  # fmt: skip
        super().__init__(served, "Workload")
        self._unserved_seconds = unserved_seconds
        self._source = source
        self._kueue = kueue_
        self._changed = changed

    def _list(self, namespace: str) -> str:
        if not self._source.serves(kueue.API_VERSION, "workloads"):
            self._kueue.unlisted(namespace)
            raise NotYet(self._unserved_seconds)
        items, version = self._source.list_workloads(namespace)
        for key in self._kueue.replace(namespace, [w for w in items if self._served(_where(w)[0])]):
            self._changed(key)
        return version

    def _watch_events(self, namespace: str, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._source.watch_workloads(namespace, version, WATCH_SECONDS)

    def _event(self, namespace: str, kind: str, obj: dict[str, Any]) -> None:
        key = self._kueue.took(kind, obj)
        if key is not None:
            self._changed(key)
