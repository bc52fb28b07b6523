"""A DDPJob labelled for a Kueue queue on a cluster without Kueue: it does not silently run unqueued.

The shared control plane serves no kueue.x-k8s.io API (Kueue is not installed), as a user's cluster would before
Kueue is. The job stays Queued, says why and what to do, and no pod, Service or PodGroup is made.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from ddpjob_contract.kueue import LABEL_QUEUE_NAME

from .conftest import Operator
from .helpers import Raw, job_body, wait_for

pytestmark = pytest.mark.cluster


def test_a_labelled_job_without_kueue_says_kueue_is_not_installed_and_makes_no_pod(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    assert "kueue.x-k8s.io" not in {g["name"] for g in raw.get("/apis")["groups"]}
    body = job_body("queued")
    body["metadata"]["labels"] = {LABEL_QUEUE_NAME: "team-a"}
    raw.create_job(namespace, body)

    def queued() -> dict[str, Any] | None:
        job = raw.job(namespace, "queued")
        return job if job and (job.get("status") or {}).get("phase") == "Queued" else None

    job = wait_for(queued, what="the labelled job to be Queued")
    said = next(c for c in job["status"]["conditions"] if c["type"] == "Queued")
    assert said["status"] == "True" and said["reason"] == "KueueNotInstalled", said
    assert "kueue.x-k8s.io/queue-name=team-a" in said["message"] and "install Kueue" in said["message"]
    assert "remove the label" in said["message"]
    time.sleep(5)  # several of its 2 s looks at the Workload API
    assert raw.pods(namespace, "queued") == []
    services = raw.get(f"/api/v1/namespaces/{namespace}/services")["items"]
    assert [s["metadata"]["name"] for s in services] == []
    assert (raw.job(namespace, "queued") or {})["status"]["phase"] == "Queued"
    # the same job without the label runs as before
    raw.create_job(namespace, job_body("plain"))
    wait_for(lambda: len(raw.pods(namespace, "plain")) == 2, what="the unlabelled job's pods")
