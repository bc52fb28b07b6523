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

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ddpjob_operator import namespaces
from ddpjob_operator.api import Key
from ddpjob_operator.kube import Expired
from ddpjob_operator.podcache import RETRY_SECONDS, WATCH_SECONDS

log = logging.getLogger("ddpjob_operator")

Changed = Callable[[Key, str | None, dict[str, Any] | None], None]


class JobSource(Protocol):
    """What the watch reads of the apiserver (``kube.Kube`` in production)."""

    def list_jobs(self, namespace: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_jobs(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]: ...


def _key(job: Mapping[str, Any]) -> Key:
    meta = job.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class JobWatch:
    """``served``: the operator's namespaces (empty: all; patterns are matched here against a cluster-wide watch)."""

    def __init__(self, kube: JobSource, served: Sequence[str], changed: Changed) -> None:
        self._kube = kube
        self._changed = changed
        patterns = namespaces.any_pattern(served)
        self._patterns = list(served) if patterns else []
        scopes = [""] if not served or patterns else list(dict.fromkeys(served))
        self._known: dict[str, set[Key]] = {scope: set() for scope in scopes}
        """The jobs of each scope seen and not deleted since: a LIST that lacks one says it was deleted."""
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(ns,), name=f"jobs-{ns or 'all'}", daemon=True) for ns in scopes
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """The threads end at their watch's next event or timeout; as daemons they never hold up exit."""
        self._stopped.set()

    def _wanted(self, key: Key) -> bool:
        return namespaces.served(key[0], self._patterns)

    def _run(self, namespace: str) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                version = self._list(namespace)
                failures = 0
                while not self._stopped.is_set():
                    version = self._watch(namespace, version)
            except Expired:
                log.info("DDPJob watch of %s expired; listing again", namespace or "all namespaces")
            except Exception as err:  # the apiserver restarting, the CRD not served yet: list again, with backoff
                if self._stopped.is_set():
                    return
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("DDPJob watch of %s failed (%s); listing again in %.1fs", namespace or "all namespaces",
                            err, delay)  # fmt: skip
                self._stopped.wait(delay)

    def _list(self, namespace: str) -> str:
        items, version = self._kube.list_jobs(namespace)
        listed = {_key(job): job for job in items if self._wanted(_key(job))}
        for gone in self._known[namespace] - listed.keys():
            self._changed(gone, "DELETED", None)
        self._known[namespace] = set(listed)
        for key, job in listed.items():
            self._changed(key, None, job)
        return version

    def _watch(self, namespace: str, version: str) -> str:
        """Follow one watch until the apiserver ends it; returns the version to resume from."""
        started = time.monotonic()
        known = self._known[namespace]
        for kind, job in self._kube.watch_jobs(namespace, version, WATCH_SECONDS):
            version = str((job.get("metadata") or {}).get("resourceVersion") or version)
            key = _key(job)
            if kind == "BOOKMARK" or not self._wanted(key):
                continue
            if kind == "DELETED":
                known.discard(key)
            else:
                known.add(key)
            self._changed(key, kind, job)
            if self._stopped.is_set():
                break
        if time.monotonic() - started < 1.0:
            self._stopped.wait(1.0)  # a watch that ends at once, over and over, must not spin
        return version
