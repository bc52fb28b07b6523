"""Leader election on a real apiserver's Lease (``leadership``): one leader, a standby that writes nothing, a release
that hands over at once, and a leader cut off from the apiserver fenced before anyone else can lead.

Durations are short here (lease 3 s, renew deadline 2 s, retry 0.2 s); the chart's are 15, 10 and 2.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ddpjob_operator.kube import Fenced, Kube, Unreachable
from ddpjob_operator.leadership import Elector, Timing

from .test_podcache import eventually

TIMING = Timing(lease_duration=3.0, renew_deadline=2.0, retry_period=0.2)
LEASE = "ddpjob-operator"


class Cuttable(Kube):
    """The real client, whose Lease requests fail while ``cut`` is set, as if its node's network were cut."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.cut = threading.Event()

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.cut.is_set():
            raise Unreachable(0, "GET lease: the apiserver did not answer (cut)")
        return super().get_lease(namespace, name)


class Replica:
    """One operator replica's election, and the fenced client its writes would go through."""

    def __init__(self, api_client: Any, namespace: str, identity: str) -> None:
        self.leases = Cuttable(api_client)
        self.lost = threading.Event()
        self.lost_at = 0.0
        self.took_at = 0.0
        self.elector = Elector(self.leases, namespace, LEASE, identity, timing=TIMING, lost=self._lost)
        self.kube = Kube(api_client, fence=self.elector)

    def _lost(self) -> None:
        self.lost_at = time.monotonic()
        self.lost.set()

    def _took(self) -> None:
        self.took_at = time.monotonic()

    def start(self) -> None:
        self.elector.start(self._took)


@pytest.fixture
def replicas(api_client: Any, namespace: str) -> Iterator[tuple[Replica, Replica]]:
    pair = (Replica(api_client, namespace, "operator-a"), Replica(api_client, namespace, "operator-b"))
    yield pair
    for replica in pair:
        replica.elector.stop()


def holder(raw_kube: Kube, namespace: str) -> str:
    lease = raw_kube.get_lease(namespace, LEASE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def service(namespace: str, name: str) -> dict[str, Any]:
    """A write the operator makes (a job's headless Service)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": "None", "selector": {"ddpjob.dev/job-name": name}}}  # fmt: skip


def test_exactly_one_replica_leads_and_the_standby_sends_no_write(
    replicas: tuple[Replica, Replica], namespace: str, api_client: Any
) -> None:
    a, b = replicas
    a.start()
    eventually(a.elector.leads, "the first replica to lead")
    b.start()
    time.sleep(TIMING.lease_duration + 1.0)  # longer than a lease: the leader renews, the standby never takes it
    assert a.elector.leads() and not b.elector.leads()
    assert holder(Kube(api_client), namespace) == "operator-a"
    assert a.kube.create(service(namespace, "from-leader"))
    with pytest.raises(Fenced):
        b.kube.create(service(namespace, "from-standby"))
    assert Kube(api_client).get(f"/api/v1/namespaces/{namespace}/services/from-standby") is None
    lease = Kube(api_client).get_lease(namespace, LEASE) or {}
    assert lease["spec"]["leaseDurationSeconds"] == 3 and lease["spec"]["leaseTransitions"] == 0


def test_a_leader_that_stops_releases_the_lease_and_the_standby_takes_it_at_its_next_try(
    replicas: tuple[Replica, Replica], namespace: str, api_client: Any
) -> None:
    a, b = replicas
    a.start()
    eventually(a.elector.leads, "a leads")
    b.start()
    a.elector.stop()
    assert not a.elector.leads()
    with pytest.raises(Fenced):
        a.kube.create(service(namespace, "after-release"))
    eventually(b.elector.leads, "b takes the released Lease")
    lease = Kube(api_client).get_lease(namespace, LEASE) or {}
    assert lease["spec"]["holderIdentity"] == "operator-b" and lease["spec"]["leaseTransitions"] == 1
    assert not a.lost.is_set(), "a clean stop is no loss"


def test_a_leader_cut_off_from_the_apiserver_is_fenced_before_the_standby_can_take_the_lease(
    replicas: tuple[Replica, Replica], namespace: str, api_client: Any
) -> None:
    a, b = replicas
    a.start()
    eventually(a.elector.leads, "a leads")
    b.start()
    a.leases.cut.set()  # a's renewals fail from now on; its writes would still reach the apiserver
    eventually(b.elector.leads, "b takes the Lease once a's has run out", timeout=TIMING.lease_duration * 4)
    assert a.lost.is_set(), "a gave up leading (and its process would exit, to come back as a standby)"
    assert a.lost_at < b.took_at, "a was fenced before b could lead: never two leaders"
    with pytest.raises(Fenced):
        a.kube.create(service(namespace, "from-the-cut-leader"))
    assert Kube(api_client).get(f"/api/v1/namespaces/{namespace}/services/from-the-cut-leader") is None
    assert holder(Kube(api_client), namespace) == "operator-b"
