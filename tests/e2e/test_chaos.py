"""The chaos soak's short seeded set (``bench/chaos/``; ``make soak`` runs 200 of them).

Each run restarts parts of the session's box (kubelet, kube-apiserver, etcd), kills or arms the
operator, kills, hangs and deletes ranks, edits, suspends and deletes its job, or deletes the test's
namespace (made again after); the box comes back whole after each, as the soak's invariants check. The runs go one
after the other here; ``make soak`` runs 4 side by side, so that box faults land on every job alive
(its results: docs/benchmarks.md#chaos-soak).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.chaos.faults import FAULTS, RESTARTING, drawn
from bench.chaos.job import backoff_limit
from bench.chaos.runner import soak
from bench.chaos.stack import Stack
from ddpjob_box.kubenode.node import KubeletNode
from tests.conftest import Cluster
from tests.e2e.conftest import Kubectl

pytestmark = pytest.mark.e2e

SEED = 1
RUNS = (6, 31, 41, 96)
"""Four runs of seed 1 that draw every kind of fault between them (make soak draws 200); in run 31 a killed
rank finds no restart to spare (backoffLimit 0), so it must end Failed with BackoffLimitExceeded."""


def test_the_short_set_draws_every_kind_of_fault_and_exceeds_a_backoff_limit() -> None:
    assert {f for run in RUNS for f in drawn(SEED, run)[1]} == set(FAULTS), "choose RUNS again"
    assert any(backoff_limit(run) == 0 and drawn(SEED, run)[1][0] in RESTARTING for run in RUNS), "choose RUNS again"


def test_a_short_seeded_chaos_soak_breaks_no_promise(
    cluster: Cluster, node: KubeletNode, kubectl: Kubectl, namespace: str, api_client: Any, tmp_path: Path
) -> None:
    assert cluster.box is not None
    stack = Stack(cluster.box, [namespace], tmp_path)
    try:
        results = soak(stack, SEED, RUNS, tmp_path / "chaos.jsonl")
    finally:
        stack.close()
    bad = [r for r in results if r.violations]
    report = "\n".join(f"{r.replay} {r.faults}: {r.violations}\n  " + "\n  ".join(r.timeline) for r in bad)
    assert not bad, report
    injected = {f for r in results for f in r.faults if f not in r.skipped}
    assert injected, "faults were injected"
