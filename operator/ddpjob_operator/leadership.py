"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection`` does it, and the fence
that every write of the operator passes.

- A candidate tries the Lease every retry period. It takes it when there is none, when its holder released it
  (``holderIdentity`` empty), or when the Lease has not changed for ``leaseDurationSeconds`` by this candidate's own
  clock: from when it last saw the record change, never from the holder's timestamps (clocks differ).
- The leader renews every retry period; each write names the resourceVersion read, so of two replicas that read the
  same Lease only one can write it.
- Fencing: the leader may write until the start of its last successful renewal plus the renew deadline (a monotonic
  clock). Another replica can take the Lease only a lease duration after it saw that renewal, which it saw after
  the renewal started: later than the deadline, whatever the clocks say. Past the deadline every write is refused
  (``Fenced``), checked as each request is issued, and the replica stops leading: the process exits, to start again
  as a standby. It stops at the deadline even when its renewal hangs unanswered (a partition drops its packets, and
  the request gives up only after its client's timeout and retries): a second thread watches the deadline.
- On a clean shutdown the leader releases the Lease (``holderIdentity`` cleared, ``leaseDurationSeconds`` 1), so a
  standby takes over at its next try instead of after a lease duration.

Only the leader reconciles; a standby keeps its watches and caches warm (``runtime``), so taking over costs one
Lease write. ``Alone`` is the single replica's leadership: it always leads and never fences.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ddpjob_operator import metrics
from ddpjob_operator.kube import Conflict, Fenced, KubeError

log = logging.getLogger("ddpjob_operator")

LEASE_API = "coordination.k8s.io/v1"


class Leadership(Protocol):
    """Whether this replica leads (``runtime``), and the fence its writes pass (``kube.Kube``); ``identity`` names
    the replica (its Lease holder name; "" alone)."""

    identity: str

    def leads(self) -> bool: ...

    def check(self) -> None:
        """Raise ``kube.Fenced`` unless this replica may write now."""
        ...

    def start(self, started_leading: Callable[[], None]) -> None:
        """Begin; ``started_leading`` is called, from the election's thread, each time it takes the Lease."""
        ...

    def stop(self) -> None:
        """Stop, and release the Lease if held."""
        ...


class Alone:
    """One replica, no election: it always leads, and every write may go."""

    identity = ""

    def leads(self) -> bool:
        return True

    def check(self) -> None:
        pass

    def start(self, started_leading: Callable[[], None]) -> None:
        metrics.LEADER.set(1)
        started_leading()

    def stop(self) -> None:
        pass


ALONE = Alone()


class LeaseApi(Protocol):
    """The Lease requests (``kube.Kube``, unfenced: they are the election itself)."""

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]: ...

    def replace_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Timing:
    """client-go's three durations, in seconds: a lease duration longer than the renew deadline, which is longer
    than the retry period."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def problem(self) -> str:
        """Why these durations are unsafe ("" if they are not)."""
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            return (f"--leader-elect-lease-duration ({self.lease_duration:g}s) must exceed --leader-elect-renew-"
                    f"deadline ({self.renew_deadline:g}s), which must exceed --leader-elect-retry-period "
                    f"({self.retry_period:g}s)")  # fmt: skip
        return ""


@dataclass(frozen=True)
class Election:
    """Where and as whom this replica runs for leader (``--leader-elect``)."""

    namespace: str
    name: str
    identity: str
    timing: Timing


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def default_namespace() -> str:
    """The operator pod's namespace (``POD_NAMESPACE``, which the chart sets, else its service account's), else
    ``default``."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def default_identity() -> str:
    """The pod's name (``POD_NAME``, which the chart sets), else the host's name and a random suffix, as client-go
    does: two processes on one host must never share an identity."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _now_text() -> str:
    """Now, as a Lease's MicroTime."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """One replica's part in the election for the Lease ``namespace/name``, as ``identity`` (its pod's name)."""

    def __init__(
        self,
        api: LeaseApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        timing: Timing = Timing(),
        lost: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._namespace, self._name, self.identity = namespace, name, identity
        self._timing = timing
        self._lost = lost
        self._clock = clock
        self._valid_until = float("-inf")
        """Monotonic time until which this replica may write (its last renewal's start + renew deadline)."""
        self._leading = False
        self._observed: tuple[str, str, float] = ("", "", float("-inf"))
        """The Lease's (holder, renewTime) as last seen to change, and the monotonic time it was seen."""
        self._expires = float("inf")
        """When the Lease another replica holds runs out, as this replica has seen it (monotonic)."""
        self._held: dict[str, Any] | None = None
        """The Lease as this replica last wrote it while leading."""
        self._stopped = threading.Event()
        self._down = threading.Event()
        """Set once this replica stopped leading at its deadline: it writes no Lease again (the process exits)."""
        self._down_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._deadline = threading.Thread(target=self._watch_deadline, name="leader-deadline", daemon=True)
        self._started_leading: Callable[[], None] = lambda: None

    def leads(self) -> bool:
        return self._leading and self._clock() < self._valid_until

    def check(self) -> None:
        if not self.leads():
            raise Fenced(self.identity)

    def start(self, started_leading: Callable[[], None]) -> None:
        self._started_leading = started_leading
        metrics.LEADER.set(0)
        self._thread.start()
        self._deadline.start()

    def stop(self) -> None:
        """Stop trying (started or not); a leader releases the Lease, so a standby takes over at its next try. Its
        client is closed."""
        self._stopped.set()
        if self._thread.is_alive() and not self._down.is_set():  # stepped down: its hung request writes nothing
            self._thread.join(timeout=self._timing.retry_period + 5.0)
        releasing = self._held if self.leads() else None
        self._leading = False  # from here on, no write passes its fence
        if releasing is not None:
            released = {**releasing, "spec": {**releasing["spec"], "holderIdentity": "", "leaseDurationSeconds": 1,
                                              "renewTime": _now_text()}}  # fmt: skip
            try:
                self._api.replace_lease(released)
                log.info("released the leader Lease %s/%s", self._namespace, self._name)
            except KubeError as err:
                log.warning("could not release the leader Lease %s/%s (%s): a standby takes over when it expires",
                            self._namespace, self._name, err)  # fmt: skip
        metrics.LEADER.set(0)
        self._api.close()

    def _run(self) -> None:
        while not self._stopped.is_set() and not self._down.is_set():
            started = self._clock()
            try:
                renewed = self.try_acquire_or_renew(started)
            except KubeError as err:
                log.debug("leader election: %s", err)
                renewed, self._expires = False, float("inf")  # unanswered: try again at the retry period
            if renewed and self._down.is_set():
                return  # its renewal came back after the deadline watch stepped it down: it leads no more
            if renewed:
                self._valid_until = started + self._timing.renew_deadline
                if not self._leading:
                    self._leading = True
                    metrics.LEADER.set(1)
                    log.info("%s leads (Lease %s/%s)", self.identity, self._namespace, self._name)
                    self._started_leading()
            elif self._leading and self._clock() >= self._valid_until:
                self._step_down()
                return
            # A standby looks twice per retry period (it sees a renewal within half of one, and its count of the
            # lease duration starts then), and at the moment the Lease it watches runs out.
            period = self._timing.retry_period if self._leading else self._timing.retry_period / 2
            again = min(started + period, self._expires)
            self._stopped.wait(max(0.0, again - self._clock()))

    def _watch_deadline(self) -> None:
        """A leader whose renewal hangs past its deadline steps down then, not when the request gives up: looked at
        ten times per retry period."""
        while not self._stopped.wait(self._timing.retry_period / 10):
            if self._leading and self._clock() >= self._valid_until:
                self._step_down()
                return

    def _step_down(self) -> None:
        """Once: no more leading, no more Lease writes, and the process told to exit (``lost``)."""
        with self._down_lock:
            if self._down.is_set():
                return
            self._down.set()
        self._leading = False
        metrics.LEADER.set(0)
        log.error("%s could not renew the leader Lease %s/%s within %gs: it stops writing, and exits to start "
                  "again as a standby", self.identity, self._namespace, self._name,
                  self._timing.renew_deadline)  # fmt: skip
        self._lost()

    def try_acquire_or_renew(self, now: float) -> bool:
        """One try: True when this replica holds the Lease after it (taken or renewed by a write just made)."""
        lease = self._api.get_lease(self._namespace, self._name)
        if self._down.is_set():
            return False  # stepped down while the GET hung: no write
        if lease is None:
            self._held = self._api.create_lease(self._record(None))
            return True
        spec = lease.get("spec") or {}
        holder, renewed = str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or "")
        if (holder, renewed) != self._observed[:2]:
            self._observed = (holder, renewed, now)
        duration = float(spec.get("leaseDurationSeconds") or self._timing.lease_duration)
        if holder and holder != self.identity and now < self._observed[2] + duration:
            self._expires = self._observed[2] + duration
            return False  # held, and renewed within its duration as this replica has seen it
        self._expires = float("inf")
        if self._down.is_set() or (self._leading and self._clock() >= self._valid_until):
            return False  # past its deadline (frozen since the GET, say): a leader that was fenced writes no renewal
        try:
            self._held = self._api.replace_lease(self._record(lease))
        except Conflict:
            return False  # another replica wrote it first
        return True

    def _record(self, lease: Mapping[str, Any] | None) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        now = _now_text()
        taken = spec.get("holderIdentity") != self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (1 if taken and lease is not None else 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(self._timing.lease_duration),
                    renewTime=now, leaseTransitions=transitions)  # fmt: skip
        if taken:
            spec["acquireTime"] = now
        meta = dict((lease or {}).get("metadata") or {"name": self._name, "namespace": self._namespace})
        return {"apiVersion": LEASE_API, "kind": "Lease", "metadata": meta, "spec": spec}
