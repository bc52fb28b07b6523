"""The chaos soak's short seeded set (``bench/chaos.py``; ``make soak`` runs 200 of them).

Each run restarts parts of the session's box (kubelet, kube-apiserver, etcd) and kills the operator
and ranks; the box comes back whole after each, as the soak's invariants check. The runs go one
after the other here; ``make soak`` runs 4 side by side, so that box faults land on every job alive
(its results: docs/benchmarks.md#chaos-soak).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.chaos import Stack, soak
from ddpjob_box.kubenode.node import KubeletNode
from tests.conftest import Cluster
from tests.e2e.conftest import Kubectl

pytestmark = pytest.mark.e2e

SEED = 1
RUNS = 3


def test_a_short_seeded_chaos_soak_breaks_no_promise(
    cluster: Cluster, node: KubeletNode, kubectl: Kubectl, namespace: str, api_client: Any, tmp_path: Path
) -> None:
    assert cluster.box is not None
    stack = Stack(cluster.box, [namespace], tmp_path)
    try:
        results = soak(stack, SEED, range(RUNS), tmp_path / "chaos.jsonl")
    finally:
        stack.close()
    bad = [r for r in results if r.violations]
    report = "\n".join(f"{r.replay} {r.faults}: {r.violations}\n  " + "\n  ".join(r.timeline) for r in bad)
    assert not bad, report
    assert {f for r in results for f in r.faults}, "faults were injected"
