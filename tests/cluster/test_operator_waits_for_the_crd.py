"""An operator started before the apiserver lists DDPJobs waits for them, then serves them.

Chaos soak 8 found it: an operator restarted right after kube-apiserver (runs 1:31 to 1:34) found the
apiserver answering but the CRD not yet in its discovery. With scanning off (an explicit namespace
list, as the chart runs it), Kopf looks the resource up once, logged "Unresolved resources cannot be
served", and the live operator never saw a job again. A missing CRD now reads the same way: one line
a try, naming what to install, and the operator serves jobs once the CRD is there.

This module starts a control plane of its own, with no CRD until the test installs it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.operator_process import OperatorProcess

from .helpers import CRD_FILE, Raw, job_body, own_plane, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with own_plane() as the_plane:
        yield the_plane


def test_an_operator_started_before_the_crd_is_served_serves_jobs_once_it_is(
    plane: ControlPlane, tmp_path: Path
) -> None:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    raw = Raw(api)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    raw.post("/api/v1/namespaces", {"metadata": {"name": ns}})
    operator = OperatorProcess(plane.kubeconfig, tmp_path / "operator.log", namespaces=[ns])
    try:
        wait_for(lambda: "Activity 'startup'" in operator.log(), what="the operator's startup to end or wait")
        crd = yaml.safe_load(CRD_FILE.read_text())
        raw.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
        wait_for(
            lambda: any(c["type"] == "Established" and c["status"] == "True"
                        for c in (raw.get(path).get("status") or {}).get("conditions") or []),
            what="the CRD to be established",
        )  # fmt: skip
        raw.create_job(ns, job_body("late"))
        job = wait_for(
            lambda: (found := raw.job(ns, "late")) and (found.get("status") or {}).get("phase") and found,
            timeout=60,
            what="the operator to reconcile a job made after the CRD",
        )
        assert job["status"]["phase"] in ("Pending", "Rendezvous", "Running"), job["status"]
        log = operator.log()
        assert "Traceback" not in log, log
        assert "Unresolved resources" not in log, log
        waited = [line for line in log.splitlines() if "does not serve ddpjobs" in line]
        assert "install the CRD" in waited[0] and "trying again in 2s" in waited[0], waited
    finally:
        operator.stop()
        raw.delete(f"/api/v1/namespaces/{ns}")
        api.close()
