"""How ``make test``'s pytest-xdist workers share one host (``-n 3``).

Most of the suite waits on a box, so it runs as two box groups side by side, each on a worker with a box of its own,
while a third worker takes the tests that need no box:

- ``e2e``: the tests that compare the host before and after a node (``kubelet``-marked), then the e2e tests on
  the box's node, the placement tests (gang scheduling and preemption) among them. None of those uses a ClusterIP
  Service, so that node runs without kube-proxy: a host takes one kube-proxy at a time (its Service rules are
  host-wide), and the other group needs it.
- ``box``: the tests that need only the control plane (no node may run there yet: it would run the pods those
  tests drive by hand), then those that need a node with kube-proxy (the chart's operator pod, the images) and
  the e2e tests in ``BALANCE`` (they need no kube-proxy; here they even out the two groups' times), then the
  Kueue tests, whose own box stops that node first. The control plane's tests come first here on purpose: while
  they run, no node of this group runs, and that is the window the e2e group's ``kubelet`` tests need (below).
  As a third group on the third worker, they left no window, and those tests waited 13 minutes for this group's
  node, until its Kueue tests stopped it.

A node of one group changes the host (iptables chains, network namespaces, CNI files) while the other group's
``kubelet`` tests check that the host is as they found it, so those tests hold ``host_lock(exclusive=True)`` and
every session node holds it shared: a node waits for them, and they wait for the nodes. Without xdist, or with
fewer than two workers, the suite runs in one process in the order ``tests/conftest.py`` gives, with no lock.

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

E2E, BOX = "e2e", "box"
BALANCE = (
    "tests/e2e/test_goodput.py",
    "tests/e2e/test_ddpjob_e2e.py::test_a_killed_rank_restarts_the_gang_which_resumes_from_the_last_checkpoint",
    "tests/e2e/test_ddpjob_e2e.py::test_a_hung_rank_is_restarted_within_the_collective_timeout_plus_30s",
    "tests/e2e/test_ddpjob_e2e.py::test_a_rank_over_its_memory_limit_is_oom_killed_retried_under_exit_code_and_then_failed_naming_it",
)
"""E2E tests that run in the box group. Measured 2026-11-27 (acafe37, a fresh clone's warm ``make test``): the e2e
group's tests took 1167 s with every e2e test in it, the box group's 1051 s; the goodput tests took 50 s of the e2e
group's. (Until then the placement tests ran in the box group, and it was the longer one by about 4 minutes.) At
9f8e424, with the goodput tests in the box group: e2e 1160 s, box 1065 s; the hung-rank test takes 48 s. At 78001da,
with it: e2e 1144 s, box 1085 s; the OOM test takes 26 s. On 2026-11-28 the node tests (tests/e2e/test_nodes.py,
about 11 minutes) joined the e2e group. The progress tests, moved here to even that out, failed here: the straggler
test read a step below the one its slowdown ended at (121 < 150) once the flag had cleared; they stay there. On
2026-11-29 (f60a65f, 48 min with other work beside it) the e2e group's tests took about 2,800 s, the box group's
about 2,400 s: the killed-rank resume test (159 s) moved here."""
BOX_GROUPS = (E2E, BOX)
NODES = {E2E: 3, BOX: 4}
"""The nodes each box group runs at most at once: the e2e group's node tests (tests/e2e/test_nodes.py) add two to
its node, and the box group's Kueue box has 4 (2 racks, tests/kueue/test_topology.py). The setup fills a node
store for each (``prepare.NODES_SIDE_BY_SIDE``)."""
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
    if compares_host(item):
        return E2E
    if "node" in fixtures and item.nodeid.startswith("tests/e2e/") and not item.nodeid.startswith(BALANCE):
        return E2E
    if "node" in fixtures or in_kueue(item) or fixtures & {"cluster", "api_client"}:
        return BOX
    return None


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
