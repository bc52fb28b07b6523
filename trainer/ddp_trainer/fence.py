"""Whether this process is still the rank its gang knows: the fence against ranks of an earlier attempt.

A rank's process can outlive its pod. When a node loses its network, its kubelet cannot hear that the pod was
deleted, and the process trains on; the operator restarts the gang elsewhere, and the new attempt's pods take the
same names (``<job>-<rank>.<job>``, the rank's name through the job's headless Service). Such a process must never
join the new attempt's rendezvous in place of the new rank, and never write the job's checkpoints once the new
attempt runs.

The operator gives each rank its name (``DDPJOB_RANK_ADDR``) and its pod's addresses (``DDPJOB_POD_IPS``, from the
downward API). Cluster DNS answers that name from the Service's EndpointSlices, which list the pod the apiserver
holds for that name: the current attempt's. So a rank is current while its name resolves to its own addresses:

- before it joins a process group (``wait_until_current``): it waits for its name to resolve to it, as a new pod's
  record takes a moment to appear, and gives up, fenced, if it does not;
- before rank 0 writes a checkpoint (``confirm``): a name that resolves to another pod means a newer attempt holds
  the rank, and the write is refused. A name that does not resolve at all (the pod deleted, DNS out of reach) is not
  proof either way, and the write goes on, so that a stop still saves; the new attempt's rank 0 cannot start before
  DNS names it, and from then on DNS names it to every asker.

Launched by torchrun or alone (no DDPJOB_RANK_ADDR), nothing names the rank and there is nothing to check
(``Unfenced``). Torch-free: the supervisor uses it too.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ddp_trainer.errors import PermanentError

log = logging.getLogger(__name__)

ELSEWHERE_SECONDS = 30.0
"""How long a new rank's name may still resolve to another pod (the pod of its name before it, while DNS catches up)
before the rank takes it as another pod holding its rank."""
POLL_SECONDS = 0.5


class Fenced(PermanentError):
    """This process is not its rank any more: another pod holds the rank's name."""


class Fence(Protocol):
    def wait_until_current(self, timeout: float) -> None:
        """Return once this process is its rank; raise ``Fenced`` if it is not within ``timeout`` seconds."""
        ...

    def confirm(self, what: str) -> None:
        """Raise ``Fenced`` if another pod holds the rank now; ``what`` names the act that is refused."""
        ...


class Unfenced:
    """A launch that names no rank (torchrun, a process alone): every check passes."""

    def wait_until_current(self, timeout: float) -> None:
        pass

    def confirm(self, what: str) -> None:
        pass


class Unresolved(Exception):
    """The name does not resolve (no record, or DNS out of reach)."""


def resolve(name: str) -> frozenset[str]:
    """Every address ``name`` resolves to through the system's resolver; ``Unresolved`` when none."""
    try:
        return frozenset(str(a[4][0]) for a in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM))
    except OSError as err:
        raise Unresolved(str(err)) from None


@dataclass
class DnsFence:
    name: str
    """This rank's name through the job's headless Service."""
    own: frozenset[str]
    """This pod's addresses."""
    rank: int
    resolve: Callable[[str], frozenset[str]] = resolve
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def wait_until_current(self, timeout: float) -> None:
        deadline = self.clock() + timeout
        said, elsewhere_since = "", None
        while why := self._why_not_current():
            now = self.clock()
            elsewhere_since = (
                (now if elsewhere_since is None else elsewhere_since) if why.startswith("resolves") else None
            )
            if elsewhere_since is not None and now - elsewhere_since >= ELSEWHERE_SECONDS:
                raise Fenced(self._fenced(why, ELSEWHERE_SECONDS))
            if now >= deadline:
                raise Fenced(self._fenced(why, timeout))
            if why != said:
                log.info("rank %d waits for %s to name this pod: it %s", self.rank, self.name, why)
                said = why
            self.sleep(POLL_SECONDS)

    def confirm(self, what: str) -> None:
        try:
            addresses = self.resolve(self.name)
        except Unresolved as err:
            log.warning("rank %d cannot confirm that %s names this pod (%s); going on to %s", self.rank, self.name,
                        err, what)  # fmt: skip
            return
        if not addresses <= self.own:
            raise Fenced(
                f"fenced: not going to {what}: {self.name} resolves to {', '.join(sorted(addresses))}, not to this pod "
                f"({', '.join(sorted(self.own))}): a newer attempt holds rank {self.rank}, so this process of an "
                "earlier one stops"
            )

    def _why_not_current(self) -> str:
        try:
            addresses = self.resolve(self.name)
        except Unresolved as err:
            return f"does not resolve ({err})"
        if addresses <= self.own:
            return ""
        return f"resolves to {', '.join(sorted(addresses))}"

    def _fenced(self, why: str, seconds: float) -> str:
        return (
            f"fenced: {self.name} {why} after {seconds:.0f} s, while this pod is {', '.join(sorted(self.own))}: "
            f"another pod holds rank {self.rank}, or this pod was deleted; this process does not join the gang"
        )


def for_rank(name: str, own_addresses: str, rank: int) -> Fence:
    """The fence for a rank named ``name`` (DDPJOB_RANK_ADDR) in a pod with ``own_addresses`` (DDPJOB_POD_IPS,
    comma-separated); ``Unfenced`` when either is empty."""
    own = frozenset(a.strip() for a in own_addresses.split(",") if a.strip())
    if not name or not own:
        return Unfenced()
    return DnsFence(name=name, own=own, rank=rank)
