"""What the controller remembers of each job between reconciles, beside the job's status: its newest body, what
went wrong creating its pods and its Workload, its Workload's name, whether its first pods went out before its first
status, and the namespaces being deleted. One object (``Remembered``), so that forgetting a job is one call."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ddpjob_operator.api import Key


class Bodies:
    """The newest body of each job seen (watch events, our own status writes): saves a GET per reconcile.

    It may lag, never lead: watch events arrive in order, each wakes the job's worker, and our own
    write is kept only if no event came in since the body it was based on. A lagging body is
    harmless: the status write carries its resourceVersion and fails, and a plan that would act
    without writing the status reads the job again first.
    """

    def __init__(self) -> None:
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Key) -> dict[str, Any] | None:
        return self._bodies.get(key)

    def put(self, key: Key, body: dict[str, Any]) -> bool:
        """From the watch: the newest by definition. False when it is the echo of the body we hold
        (our own status write coming back): the reconcile that wrote it has already acted on it."""
        version = resource_version(body)
        with self._lock:
            held = self._bodies.get(key)
            self._bodies[key] = body
        return version is None or held is None or resource_version(held) != version

    def wrote(self, key: Key, seen: dict[str, Any] | None, written: dict[str, Any]) -> None:
        """Our write of ``seen`` (None: read with a GET) answered ``written``."""
        with self._lock:
            if self._bodies.get(key) is seen:
                self._bodies[key] = written

    def read(self, key: Key, body: dict[str, Any]) -> None:
        """A body just read with a GET: kept unless the watch delivered one meanwhile."""
        self.wrote(key, None, body)

    def drop(self, key: Key) -> None:
        with self._lock:
            self._bodies.pop(key, None)

    def __len__(self) -> int:
        return len(self._bodies)


def resource_version(body: Mapping[str, Any]) -> str | None:
    """The body's resourceVersion."""
    found: str | None = (body.get("metadata") or {}).get("resourceVersion")
    return found


class Remembered:
    """Every job's memory: ``bodies`` and the maps below, all keyed by the job (``terminating`` by namespace)."""

    def __init__(self) -> None:
        self.bodies = Bodies()
        self.refused: dict[Key, str] = {}
        """Jobs whose pod the apiserver refused as invalid, and why: the next plan fails the job."""
        self.failed_creates: dict[Key, str] = {}
        """Jobs whose last pod creation failed for another reason (a webhook down, a quota), and why: said in
        the next status, and retried."""
        self.workloads: dict[Key, str] = {}
        """Queued jobs' Workloads by name: a job deleted unfinished has its Workload's finalizer dropped."""
        self.workload_failures: dict[Key, str] = {}
        """Jobs whose last try to create their Workload failed, and why: said in the next status, and retried."""
        self.launching: set[Key] = set()
        """New jobs whose first pods went out before their first status write (``Controller._launches_unwritten``)."""
        self.written: dict[Key, datetime] = {}
        """When each job's status was last written (``write_pace``)."""
        self.terminating: dict[str, datetime] = {}
        """Namespaces being deleted, and since when: their jobs made before that are left alone.
        A job made later is in a namespace of the same name made anew, which clears the entry."""

    def forget(self, key: Key) -> None:
        """The job is gone: all it left but its Workload's name, kept until the Workload is released."""
        self.bodies.drop(key)
        self.refused.pop(key, None)
        self.failed_creates.pop(key, None)
        self.workload_failures.pop(key, None)
        self.launching.discard(key)
        self.written.pop(key, None)
