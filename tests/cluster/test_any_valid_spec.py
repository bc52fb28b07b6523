"""Whatever the apiserver admits, the operator reconciles without an error and without looping."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from ddpjob_contract.pods import LABEL_JOB_NAME
from ddpjob_operator import api

from ..unit.test_properties import specs
from .conftest import Operator
from .helpers import TRAINER, Raw, job_body, wait_for

pytestmark = pytest.mark.cluster

_names = (f"h{i}" for i in itertools.count())


# The operator under test runs in a thread of this process and draws on `random` (backoff jitter),
# which Hypothesis would otherwise blame on the strategy.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(spec=specs().filter(lambda s: s["template"]["spec"]["containers"][0]["name"] != "sidecar"))
def test_hypothesis_generated_valid_specs_reconcile_with_no_operator_error(
    raw: Raw, namespace: str, operator: Operator, spec: dict[str, Any]
) -> None:
    name = next(_names)
    raw.create_job(namespace, {**job_body(name), "spec": spec})
    suspended = spec.get("runPolicy", {}).get("suspend", False)

    def settled() -> bool:
        status = raw.status(namespace, name)
        if suspended:
            return status.get("phase") == "Suspended"
        return status.get("launchedAttempt") == 0 and len(raw.pods(namespace, name)) == spec["replicas"]

    wait_for(settled, what=f"{name} to settle")
    status = raw.status(namespace, name)
    assert status["phase"] in ("Pending", "Suspended") and status["restarts"] == 0
    for pod in raw.pods(namespace, name):
        assert pod["metadata"]["labels"][LABEL_JOB_NAME] == name
    raw.delete(f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.PLURAL}/{name}")


def test_a_template_the_apiserver_refuses_as_a_pod_fails_the_job_once(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    bad = {"spec": {"containers": [TRAINER], "dnsPolicy": "Sometimes"}}  # passes through; the pod is invalid
    raw.create_job(namespace, job_body("bad", 2, template=bad))
    status = wait_for(lambda: raw.status(namespace, "bad").get("phase") == "Failed" and raw.status(namespace, "bad"),
                      what="phase Failed")  # fmt: skip
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidPodTemplate" and "spec.dnsPolicy" in failed["message"]
    assert raw.pods(namespace, "bad") == []
    # the failed job stays failed; a later edit is observed, not retried
    raw.patch_job(namespace, "bad", {"spec": {"runPolicy": {"backoffLimit": 5}}})
    wait_for(lambda: raw.status(namespace, "bad").get("observedGeneration") == 2, what="observed generation 2")
    assert raw.status(namespace, "bad")["phase"] == "Failed"
    assert raw.pods(namespace, "bad") == []
