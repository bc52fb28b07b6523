"""How ``make test``'s pytest-xdist workers share one host (``-n 3``).

Most of the suite waits on a box, so it runs as three box groups side by side, each on a worker with a box of its
own; the tests that need no box go to whichever worker is free once its group is done:

- ``e2e``: the tests that compare the host before and after a node (``kubelet``-marked), then the e2e tests on
  the box's node, the placement tests (gang scheduling and preemption) among them. None of those uses a ClusterIP
  Service, so that node runs without kube-proxy: a host takes one kube-proxy at a time (its Service rules are
  host-wide), and the box group needs it.
- ``box``: a few tests that need only the control plane (``CONTROL_PLANE_FIRST``: while they run, no node of this
  group runs, the window the ``kubelet`` tests need, below), then those that need a node with kube-proxy (the
  chart's operator pod, the images), then the Kueue tests, whose own box (4 nodes with kube-proxy) stops that node
  first.
- ``faults``: the other control-plane tests (tests/cluster/: the operator against restarts, compactions, deleted
  namespaces), then the node tests (tests/e2e/test_nodes.py, 3 nodes without kube-proxy) and the short chaos soak:
  the suite's longest waits on cut nodes and restarted components, on a box of their own.

A node of one group changes the host (iptables chains, network namespaces, CNI files) while the ``kubelet`` tests
check that the host is as they found it, so those tests hold ``host_lock(exclusive=True)`` from the first of them
to the last (they run first in their group, one after the other: ``tests/conftest.py``'s ``pytest_runtest_setup``)
and every session node holds it shared: a node waits for them, and they wait for the nodes. Without xdist, or
with fewer than two workers, the suite runs in one process in the order ``tests/conftest.py`` gives, with no lock.

Each group is one unit of work for xdist's scope scheduler (``GroupScheduling``): the workers write which group
each test is in when they collect, as only they see the tests' markers and fixtures, and the controlling
process reads it. (xdist's own ``--dist loadgroup`` renames the tests, which pytest 9.2's node ids ignore.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

E2E, BOX, FAULTS = "e2e", "box", "faults"
CONTROL_PLANE_FIRST = (
    "tests/box/test_control_plane.py",
    "tests/cluster/test_lifecycle.py",
    "tests/cluster/test_progress.py",
)
"""The box group's control-plane tests (about 130 s), which it runs before its node starts: the ``kubelet`` tests
(about 120 s) hold the host then. The other tests of tests/cluster/ run in the faults group, before its nodes."""
FAULTS_TESTS = ("tests/e2e/test_nodes.py", "tests/e2e/test_chaos.py", "tests/cluster/")
"""Measured 2026-11-29 (cc2d194, the suite's test times summed per group from a warm ``make test``'s JUnit report):
with two box groups, e2e 1326 s (the node tests 369 s and the chaos set 220 s among them) and box 1344 s (Kueue 784
s, the chart and images 156 s, the control plane 250 s, and 161 s of e2e tests moved there to even the two out), the
third worker 434 s of box-less tests, then idle: the run took 22 min 37 s. The faults group takes the node tests, the
chaos set and most control-plane tests off the two, and the e2e tests go back to the e2e group."""
BOX_GROUPS = (E2E, BOX, FAULTS)
NODES = {E2E: 2, BOX: 4, FAULTS: 3}
"""The nodes each box group runs at most at once: the e2e group's two-node ``kubelet`` test, the box group's Kueue
box (4 nodes in 2 racks, tests/kueue/test_topology.py), the faults group's node tests (3 nodes). The setup fills a
node store for each (``prepare.NODES_SIDE_BY_SIDE``)."""
RUN_ENV = "DDPJOB_TEST_RUN"
"""Set by the controlling pytest process: the lock file its workers share."""


def split(config: pytest.Config) -> bool:
    """Whether the box groups run on workers of their own (xdist, two workers or more)."""
    workers = getattr(config, "workerinput", {}).get("workercount", 0)
    return int(workers) >= 2


def in_kueue(node: pytest.Item | pytest.Collector) -> bool:
    """A Kueue test (tests/kueue/): its box, with a node of its own, starts after the session's node stops."""
    return "/kueue/" in f"/{node.nodeid}"


def compares_host(node: pytest.Item | pytest.Collector | None) -> bool:
    """A test (or module) that starts nodes of its own and checks the host is left as it found it."""
    return node is not None and bool(node.get_closest_marker("kubelet")) and not in_kueue(node)


def box_group(item: pytest.Item) -> str | None:
    """The box group a test runs in, or None for a test that needs no box of the session's."""
    fixtures = set(getattr(item, "fixturenames", ()))
    needs_box = "node" in fixtures or in_kueue(item) or bool(fixtures & {"cluster", "api_client"})
    if compares_host(item):
        return E2E
    if needs_box and item.nodeid.startswith(FAULTS_TESTS) and not item.nodeid.startswith(CONTROL_PLANE_FIRST):
        return FAULTS
    if "node" in fixtures and item.nodeid.startswith("tests/e2e/"):
        return E2E
    return BOX if needs_box else None


def start_order(item: pytest.Item) -> tuple[bool, bool]:
    """Within a worker: what needs no node first, then the session node's tests, then Kueue's."""
    return in_kueue(item), "node" in getattr(item, "fixturenames", ())


def run_file(suffix: str) -> Path | None:
    """A file of this run's, shared by its workers; None outside ``make test``'s controlling process' run."""
    run = os.environ.get(RUN_ENV)
    return Path("/tmp") / f"ddpjob-tests-{run}.{suffix}" if run else None


def lock_path() -> Path | None:
    return run_file("host.lock")


def write_groups(items: Sequence[pytest.Item]) -> None:
    """The box group of each test that has one, for the controlling process's scheduler (every worker writes
    the same)."""
    path = run_file("groups.json")
    if path is None:
        return
    groups = {item.nodeid: group for item in items if (group := box_group(item))}
    partial = path.with_suffix(f".{os.getpid()}")
    partial.write_text(json.dumps(groups))
    partial.replace(path)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler, with a box group as the scope of its tests and each other test a scope alone.
    Scopes go out in collection order, the first to each worker; a worker gets another only when nearly done."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                path = run_file("groups.json")
                self.groups = json.loads(path.read_text()) if path and path.exists() else {}
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


@contextlib.contextmanager
def host_lock(config: pytest.Config, *, exclusive: bool) -> Iterator[None]:
    """Held while a node runs (shared) or while a test compares the host (exclusive); a no-op unless split."""
    path = lock_path()
    if not split(config) or path is None:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
