"""The election's rules without an apiserver (``leadership``); tests/cluster/test_leadership.py runs it on a real
one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from ddpjob_operator.cli import main
from ddpjob_operator.kube import Conflict, Fenced
from ddpjob_operator.leadership import Elector, Timing


class Leases:
    """One Lease, written only with the resourceVersion last read (as the apiserver does)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.lease

    def create_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        if self.lease is not None:
            raise Conflict(409, "exists")
        return self._store(lease)

    def replace_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        if self.lease is None or lease["metadata"].get("resourceVersion") != str(self.version):
            raise Conflict(409, "changed")
        return self._store(lease)

    def close(self) -> None:
        pass

    def _store(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = {**lease, "metadata": {**lease["metadata"], "resourceVersion": str(self.version)}}
        return self.lease


def elector(leases: Leases, identity: str, clock: list[float]) -> Elector:
    return Elector(leases, "ops", "lease", identity, timing=Timing(15.0, 10.0, 2.0), lost=lambda: None,
                   clock=lambda: clock[0])  # fmt: skip


def test_a_held_lease_is_taken_only_after_it_went_unrenewed_for_its_duration_by_the_candidates_own_clock() -> None:
    leases, clock = Leases(), [100.0]
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    assert a.try_acquire_or_renew(clock[0])
    assert not b.try_acquire_or_renew(clock[0]), "held and fresh"
    clock[0] = 114.0
    assert not b.try_acquire_or_renew(clock[0]), "14 s since b first saw this record: not yet"
    clock[0] = 115.5
    assert b.try_acquire_or_renew(clock[0]), "unchanged for more than the lease's 15 s, as b has seen it"
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "b"
    assert leases.lease["spec"]["leaseTransitions"] == 1


def test_a_renewal_seen_resets_the_candidates_count_whatever_the_holders_clock_says() -> None:
    leases, clock = Leases(), [0.0]
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a.try_acquire_or_renew(clock[0])
    b.try_acquire_or_renew(clock[0])
    clock[0] = 10.0
    a.try_acquire_or_renew(clock[0])  # renewed
    clock[0] = 16.0
    assert not b.try_acquire_or_renew(clock[0]), "b saw a new renewTime at 16 s: 15 s more from then"


def test_of_two_candidates_that_read_the_same_expired_lease_only_one_takes_it() -> None:
    leases, clock = Leases(), [0.0]
    elector(leases, "a", clock).try_acquire_or_renew(clock[0])
    b, c = elector(leases, "b", clock), elector(leases, "c", clock)
    for candidate in (b, c):
        candidate.try_acquire_or_renew(clock[0])  # each sees a's record now
    clock[0] = 20.0
    read = leases.lease
    assert b.try_acquire_or_renew(clock[0])
    leases.get_lease = lambda namespace, name: read  # type: ignore[method-assign]  # c read it before b wrote
    assert not c.try_acquire_or_renew(clock[0]), "its write names a resourceVersion that is gone"
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "b"


def test_a_replica_that_never_led_is_fenced() -> None:
    replica = elector(Leases(), "a", [0.0])
    assert not replica.leads()
    with pytest.raises(Fenced, match="a is not the leader: the write was not sent"):
        replica.check()


def test_unsafe_durations_are_refused_in_one_line_naming_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["operator", "--leader-elect", "--leader-elect-lease-duration", "10", "--leader-elect-renew-deadline",
              "10"])  # fmt: skip
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("ddpjob operator: --leader-elect-lease-duration (10s) must exceed --leader-elect-renew-deadline "
                   "(10s), which must exceed --leader-elect-retry-period (2s)")  # fmt: skip


class Partitioned(Leases):
    """Leases whose every request hangs once ``cut`` is set (packets dropped), until ``healed``."""

    def __init__(self) -> None:
        super().__init__()
        self.cut, self.healed, self.hanging = threading.Event(), threading.Event(), threading.Event()

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.cut.is_set():
            self.hanging.set()
            self.healed.wait(30)
        return super().get_lease(namespace, name)


def test_a_leader_whose_renewal_hangs_steps_down_at_its_deadline_while_the_request_still_hangs() -> None:
    leases, lost = Partitioned(), threading.Event()
    leader = Elector(leases, "ops", "lease", "a", timing=Timing(3.0, 1.0, 0.2), lost=lost.set)
    leader.start(lambda: None)
    try:
        assert _wait(leader.leads), "it took the Lease"
        leases.cut.set()
        assert leases.hanging.wait(10), "a renewal was sent into the cut"
        assert lost.wait(10), "it stepped down"
        assert not leases.healed.is_set() and not leader.leads(), "at its deadline, while its GET still hung"
        written = leases.version
        leases.healed.set()  # the GET answers: the Lease is still its own, unexpired to the apiserver
        time.sleep(0.5)
        assert leases.version == written, "no renewal after it stepped down"
        with pytest.raises(Fenced):
            leader.check()
    finally:
        leases.healed.set()
        leader.stop()


def _wait(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return check()
