"""A control plane that does not serve PodGroups (GenericWorkload off, as on Kubernetes before 1.37 or
with the beta left disabled): ``Required`` refuses to start, ``Auto`` places pods one by one and says so.

This module starts a control plane of its own with ``pod_groups=False``, and the operator as its own
process, which reads at startup what the apiserver serves.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.operator_process import OperatorProcess

from .helpers import CRD_FILE, Raw, job_body, own_plane, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with own_plane(pod_groups=False) as the_plane:
        yield the_plane


@pytest.fixture(scope="module")
def raw(plane: ControlPlane) -> Iterator[Raw]:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    client = Raw(api)
    crd = yaml.safe_load(CRD_FILE.read_text())
    client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    wait_for(
        lambda: any(c["type"] == "Established" and c["status"] == "True"
                    for c in (client.get(path).get("status") or {}).get("conditions") or []),
        what="the CRD to be established",
    )  # fmt: skip
    yield client
    api.close()


def condition(job: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), None)


def test_required_fails_clearly_and_auto_places_pods_one_by_one_saying_so(
    plane: ControlPlane, raw: Raw, tmp_path: Path
) -> None:
    with pytest.raises(Exception, match="404"):
        raw.get("/apis/scheduling.k8s.io/v1beta1")
    ns = f"t-{uuid.uuid4().hex[:8]}"
    raw.post("/api/v1/namespaces", {"metadata": {"name": ns}})
    operator = OperatorProcess(plane.kubeconfig, tmp_path / "operator.log", namespaces=[ns])
    try:
        raw.create_job(ns, job_body("strict", gangScheduling="Required"))
        raw.create_job(ns, job_body("lenient"))  # Auto, the default
        strict = wait_for(
            lambda: (job := raw.job(ns, "strict")) and (job.get("status") or {}).get("phase") == "Failed" and job,
            what="the Required job to fail",
        )
        failed = condition(strict, "Failed")
        assert failed and failed["reason"] == "GangSchedulingUnavailable", strict["status"]
        assert "spec.gangScheduling is Required" in failed["message"] and "GenericWorkload" in failed["message"]
        assert "Set spec.gangScheduling to Auto" in failed["message"]

        def lenient_launched() -> dict[str, Any] | None:
            job = raw.job(ns, "lenient")
            return job if job and (job.get("status") or {}).get("launchedAttempt") == 0 else None

        def what_the_operator_saw() -> str:  # this wait failed once in a cold run and not since
            status = (raw.job(ns, "lenient") or {}).get("status")
            return f"its status: {status}\nthe operator's log:\n{operator.log_tail(60)}"

        lenient = wait_for(
            lenient_launched, timeout=60, what="the Auto job to create its pods", seen=what_the_operator_saw
        )
        gang = condition(lenient, "GangScheduling")
        assert gang and gang["status"] == "False" and gang["reason"] == "PodGroupNotServed", lenient["status"]
        assert "placed one by one" in gang["message"]
        pods = raw.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        names = sorted(p["metadata"]["name"] for p in pods)
        assert names == ["lenient-0", "lenient-1"], "none of the Required job's"
        assert all("schedulingGroup" not in p["spec"] for p in pods)
        assert "Traceback" not in operator.log()
    finally:
        operator.stop()
        raw.delete(f"/api/v1/namespaces/{ns}")
