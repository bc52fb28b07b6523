"""The operator's pods, kept current by one list-and-watch: reconciles read it instead of a LIST each.

Like client-go's informer cache. A LIST fills it, then a WATCH from that LIST's resourceVersion
keeps it current; a watch the apiserver ends is resumed from the last version seen, and one
that expired (410 Gone) or failed is replaced by a fresh LIST. So the cache lags the apiserver
but never misses a change for long, deletions during a gap included.

It never leads, but for one thing: the answer to the operator's own write of a pod (its create, the patch that
adopts it) is taken in at once, so the next reconcile, woken before the watch delivers it, does not write it again;
never over a newer version the watch has already delivered (``PodIndex.created``).
The controller reads the apiserver itself before it deletes anything (see ``controller``).

The watch asks for the operator's label only (``managed-by``), per watched namespace, or across
the cluster when the operator watches all of them (or globs, which it matches here).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ddpjob_contract import exits
from ddpjob_contract.pods import LABEL_JOB_NAME
from ddpjob_operator.api import Key
from ddpjob_operator.listwatch import WATCH_SECONDS, ListWatch
from ddpjob_operator.policies import gang
from ddpjob_operator.status import is_unschedulable, pod_condition

log = logging.getLogger("ddpjob_operator")

Pod = dict[str, Any]


def _namespace(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("namespace", ""))


_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "deletionTimestamp")


_KEPT_STATUS = ("phase", "reason", "podIP", "containerStatuses", "initContainerStatuses")


_KEPT_CONDITIONS = ("PodScheduled", "DisruptionTarget")
"""Why the scheduler cannot place the pod; why Kubernetes is taking it away."""


def slim(pod: Mapping[str, Any]) -> Pod:
    """What reconciles read of a pod (``status.pod_view``). The rest of the body (managedFields, the
    containers but for their restart rules, the other conditions and every condition's timestamps) is most of its
    size, and changes of it alone need no reconcile."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    kept = {k: status[k] for k in _KEPT_STATUS if k in status}
    conditions = [
        {k: c[k] for k in ("type", "status", "reason", "message") if k in c}
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") in _KEPT_CONDITIONS
    ]
    if conditions:
        kept["conditions"] = conditions
    spec: Pod = {"nodeName": node} if node else {}
    rules = [
        {"name": c.get("name"), "restartPolicyRules": c["restartPolicyRules"]}
        for c in (pod.get("spec") or {}).get("containers") or []
        if isinstance(c, Mapping) and c.get("restartPolicyRules")
    ]
    if rules:
        spec["containers"] = rules  # whether its kubelet restarts it in place (``status.pod_view``)
    return {"metadata": {k: meta[k] for k in _KEPT_METADATA if k in meta}, "spec": spec, "status": kept}


def _keep_the_schedulers_words(known: Pod | None, fresh: Pod) -> Pod:
    """A gang's pods take turns carrying the scheduler's words ('0/1 nodes are available: 1 Insufficient
    nvidia.com/gpu'), and it may overwrite them with the gang's count ('minCount (2) cannot be satisfied') a moment
    later, before a reconcile reads the pod: while the same pod stays unschedulable, its words are kept."""
    old, new = (pod_condition((p or {}).get("status") or {}, "PodScheduled") for p in (known, fresh))
    kept = uid(known) == uid(fresh) and is_unschedulable(old) and is_unschedulable(new)
    if not kept or gang.says_why(str(new.get("message") or "")) or not gang.says_why(str(old.get("message") or "")):
        return fresh
    conditions = [{**c, "message": old["message"]} if c is new else c for c in fresh["status"]["conditions"]]
    return {**fresh, "status": {**fresh["status"], "conditions": conditions}}


def _same(a: Pod | None, b: Pod) -> bool:
    """Whether two slim pods read the same (their resourceVersions aside)."""
    if a is None:
        return False
    return {**a, "metadata": {**a["metadata"], "resourceVersion": ""}} == {
        **b, "metadata": {**b["metadata"], "resourceVersion": ""}}  # fmt: skip


def job_key(pod: Mapping[str, Any]) -> Key | None:
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_JOB_NAME)
    return (str(meta.get("namespace", "")), str(job)) if job else None


def _stopped_step(pod: Mapping[str, Any]) -> int | None:
    """The step a container of the pod saved as it stopped, by its exit message (``exits.stopped_step``)."""
    steps = [
        exits.stopped_step(str(terminated.get("message") or ""))
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
        if isinstance(terminated := (cs.get("state") or {}).get("terminated"), Mapping)
        and terminated.get("exitCode") == exits.EXIT_SIGTERM
    ]
    return max((step for step in steps if step is not None), default=None)


class PodIndex:
    """Each job's pods by name, slimmed (``slim``), and the last words of the newest pod that stopped after
    saving a checkpoint (``stopped``). Thread-safe; no I/O."""

    def __init__(self) -> None:
        self._jobs: dict[Key, dict[str, Pod]] = {}
        self._stopped: dict[Key, tuple[int, Pod]] = {}
        self._lock = threading.Lock()

    def pods(self, key: Key) -> list[Pod]:
        with self._lock:
            return list(self._jobs.get(key, {}).values())

    def stopped(self, key: Key) -> list[Pod]:
        """The final state of the job's deleted pod that stopped at the newest step after saving it (none: []).

        A gang asked to stop (a suspend, a preemption) saves, then exits at once, and its pods are deleted a
        moment later: the status can name that checkpoint only from the pod's final state, which the watch
        delivers with its deletion."""
        with self._lock:
            return [self._stopped[key][1]] if key in self._stopped else []

    def jobs_on(self, node: str) -> set[Key]:
        """The jobs with a pod bound to ``node`` (woken when the node is lost or turns sick)."""
        with self._lock:
            return {k for k, pods in self._jobs.items() if any(p.get("spec", {}).get("nodeName") == node
                                                                for p in pods.values())}  # fmt: skip

    def forget(self, key: Key) -> None:
        """The job is gone."""
        with self._lock:
            self._stopped.pop(key, None)

    def apply(self, kind: str, pod: Pod) -> Key | None:
        """A watch event (ADDED, MODIFIED or DELETED); returns the job it concerns if what reconciles
        read of the pod changed (not, say, for the ADDED of a pod we created, or a new condition)."""
        key = job_key(pod)
        if key is None:
            return None
        meta = pod["metadata"]
        with self._lock:
            pods = self._jobs.setdefault(key, {})
            known = pods.get(meta["name"])
            changed = True
            if kind != "DELETED":
                fresh = _keep_the_schedulers_words(known, slim(pod))
                changed = not _same(known, fresh)
                pods[meta["name"]] = fresh
            else:
                if uid(known) == meta.get("uid"):  # not a newer pod of the same name
                    del pods[meta["name"]]
                step = _stopped_step(pod)
                if step is not None and step >= self._stopped.get(key, (-1, {}))[0]:
                    self._stopped[key] = (step, slim(pod))
            if not pods:
                del self._jobs[key]
        return key if changed else None

    def created(self, pod: Pod) -> None:
        """The answer to our own write of the pod (its create, or the patch that adopts it into an attempt): taken in
        at once, so that the next reconcile, woken before the watch delivers it, does not write it again. Unless the
        watch has already delivered a newer version of the same pod (same uid): a kubelet or a scheduler that wrote
        to the pod before this thread took in its answer is not undone. A create's answer is the pod's first
        version; for the rest, resourceVersions are compared (``newer``)."""
        key = job_key(pod)
        if key is None:
            return
        name = pod["metadata"]["name"]
        with self._lock:
            pods = self._jobs.setdefault(key, {})
            known = pods.get(name)
            if uid(known) != pod["metadata"].get("uid") or newer(pod, known):
                pods[name] = slim(pod)

    def replace(self, namespace: str, pods: Iterable[Pod]) -> set[Key]:
        """A LIST of ``namespace`` ("": all): it replaces what was there; returns every job it touched."""
        fresh: dict[Key, dict[str, Pod]] = {}
        for pod in pods:
            key = job_key(pod)
            if key is not None:
                fresh.setdefault(key, {})[pod["metadata"]["name"]] = slim(pod)
        with self._lock:
            stale = {k for k in self._jobs if not namespace or k[0] == namespace}
            for k in stale:
                del self._jobs[k]
            self._jobs.update(fresh)
        return stale | set(fresh)


def newer(pod: Mapping[str, Any], than: Mapping[str, Any] | None) -> bool:
    """Whether ``pod`` is a later version than ``than`` of the same object, by their resourceVersions: decimal
    integers that grow with each write, comparable between versions of one object since Kubernetes 1.35 (KEP-5504,
    ``resourceversion.CompareResourceVersion``). False where either is missing or not such an integer."""
    versions = [str(((p or {}).get("metadata") or {}).get("resourceVersion") or "") for p in (pod, than)]
    if not all(v.isdigit() and not v.startswith("0") for v in versions):
        return False
    return (len(versions[0]), versions[0]) > (len(versions[1]), versions[1])


def uid(pod: Mapping[str, Any] | None) -> str | None:
    """An object's uid (None for no object)."""
    return (pod.get("metadata") or {}).get("uid") if pod is not None else None


class PodSource(Protocol):
    """What the cache reads of the apiserver (``kube.Kube`` in production)."""

    def list_managed_pods(self, namespace: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_managed_pods(
        self, namespace: str, version: str, seconds: int
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...


class PodCache(ListWatch):
    """Keeps a ``PodIndex`` current from the apiserver, on one thread per watched namespace.

    ``served``: the operator's namespaces (empty: all; patterns, see ``namespaces``, are matched
    here against a cluster-wide watch). ``changed`` is called, from those threads, with each job whose pods changed.
    """

    def __init__(self, kube: PodSource, served: Sequence[str], changed: Callable[[Key], None]) -> None:
        super().__init__(served, "pod")
        self.index = PodIndex()
        self._kube = kube
        self._changed = changed
        self._unsynced = set(self._scopes)
        self._lock = threading.Lock()

    @property
    def synced(self) -> bool:
        """Whether every watched namespace has been listed once."""
        return not self._unsynced

    def pods(self, key: Key) -> list[Pod] | None:
        """The job's pods as last seen; None until synced (the caller then lists them itself)."""
        return self.index.pods(key) if self.synced else None

    def created(self, pod: Pod) -> None:
        """The answer to our own write of the pod (``PodIndex.created``)."""
        self.index.created(pod)

    def stopped(self, key: Key) -> list[Pod]:
        """``PodIndex.stopped``."""
        return self.index.stopped(key)

    def forget(self, key: Key) -> None:
        self.index.forget(key)

    def jobs_on(self, node: str) -> set[Key]:
        """``PodIndex.jobs_on``."""
        return self.index.jobs_on(node)

    def _list(self, namespace: str) -> str:
        items, version = self._kube.list_managed_pods(namespace)
        touched = self.index.replace(namespace, [p for p in items if self._served(_namespace(p))])
        with self._lock:
            self._unsynced.discard(namespace)
        for key in touched:
            self._changed(key)
        return version

    def _watch_events(self, namespace: str, version: str) -> Iterator[tuple[str, Pod]]:
        return self._kube.watch_managed_pods(namespace, version, WATCH_SECONDS)

    def _event(self, namespace: str, kind: str, pod: Pod) -> None:
        key = self.index.apply(kind, pod)
        if key is not None:
            self._changed(key)
