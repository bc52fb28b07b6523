"""Deleting a namespace full of DDPJobs, or one job: the operator stands aside and lets it go.

The namespace controller deletes the pods (no node here: at once) while the DDPJobs still exist,
so the operator sees launched ranks vanish. In a terminating namespace that is no rank failure:
no restart, no create attempt (they would only be refused with 403), no traceback. Nor is a pod
the garbage collector removes because its job is being deleted.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from prometheus_client import REGISTRY

from .conftest import Operator
from .helpers import JOBS, ApiError, Raw, job_body, wait_for

pytestmark = pytest.mark.cluster

JOBS_IN_NAMESPACE = 30
REPLICAS = 4


def counter(name: str, **labels: str) -> float:
    """The in-process operator's counter, summed over the label values not given."""
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def creates() -> float:
    return counter("ddpjob_operator_api_requests_total", verb="POST")


def settled() -> None:
    """Until the operator's POSTs stop: the Events of the creates trail them, posted in the background."""
    last = -1.0
    while creates() != last:
        last = creates()
        time.sleep(2.0)


def all_launched(raw: Raw, ns: str) -> bool:
    jobs = raw.get(JOBS.format(ns=ns))["items"]
    launched = [j for j in jobs if (j.get("status") or {}).get("launchedAttempt") == 0]
    return len(launched) == JOBS_IN_NAMESPACE


def gone(raw: Raw, ns: str) -> bool:
    try:
        raw.get(f"/api/v1/namespaces/{ns}")
    except ApiError as err:
        return err.status == 404
    return False


def test_deleting_a_namespace_of_launched_jobs_restarts_nothing_creates_nothing_and_logs_no_error(
    raw: Raw, crd: dict[str, Any], kubeconfig: str
) -> None:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    raw.post("/api/v1/namespaces", {"metadata": {"name": ns, "labels": {"ddpjob.dev/test": "true"}}})
    try:
        with Operator(ns) as op:
            for i in range(JOBS_IN_NAMESPACE):
                raw.create_job(ns, job_body(f"idle-{i}", REPLICAS))
            wait_for(lambda: all_launched(raw, ns), timeout=120, what=f"{JOBS_IN_NAMESPACE} jobs launched")
            settled()
            restarts, posts = counter("ddpjob_operator_jobs_restarted_total"), creates()
            raw.delete(f"/api/v1/namespaces/{ns}", {"propagationPolicy": "Background"})
            wait_for(lambda: gone(raw, ns), timeout=120, what=f"namespace {ns} to be gone")
            assert counter("ddpjob_operator_jobs_restarted_total") == restarts
            assert creates() == posts, "the operator tried to create in a terminating namespace"
        log = op.runner.output
        assert "-> Restarting" not in log
        assert op.errors() == [], "\n".join(op.errors()[:20])
        assert "Traceback" not in log
        quiet = [line for line in log.splitlines() if ns in line and "being deleted" in line]
        assert len(quiet) <= JOBS_IN_NAMESPACE, "more than one line per job"
    finally:
        try:
            raw.delete(f"/api/v1/namespaces/{ns}")
        except ApiError as err:
            if err.status not in (404, 409):
                raise


@pytest.mark.parametrize("propagation", ["Foreground", "Background"])
def test_pods_the_garbage_collector_removes_with_their_job_are_no_rank_failure(
    raw: Raw, namespace: str, operator: Operator, propagation: str
) -> None:
    raw.create_job(namespace, job_body("doomed", 3))
    wait_for(lambda: raw.status(namespace, "doomed").get("launchedAttempt") == 0, what="the attempt launched")
    settled()
    restarts, posts = counter("ddpjob_operator_jobs_restarted_total"), creates()
    raw.delete(f"{JOBS.format(ns=namespace)}/doomed", {"propagationPolicy": propagation})
    wait_for(lambda: raw.job(namespace, "doomed") is None and not raw.pods(namespace, "doomed"), what="all gone")
    time.sleep(1.0)  # reconciles the pods' deletions woke
    assert counter("ddpjob_operator_jobs_restarted_total") == restarts
    assert creates() == posts  # and the operator fixture fails the test on any error it logged
