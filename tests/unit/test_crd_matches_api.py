"""The CRD (the source of truth at admission) and api.py state the same contract."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddpjob_contract.pods import RESERVED_ENV
from ddpjob_operator import api

CRD = Path(__file__).resolve().parents[2] / "helm" / "ddpjob" / "crds" / "ddpjob.yaml"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["group"] == api.GROUP
    assert crd["spec"]["names"]["kind"] == api.KIND
    assert crd["spec"]["names"]["plural"] == api.PLURAL
    assert api.SHORT_NAME in crd["spec"]["names"]["shortNames"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == api.VERSION
    assert version["subresources"] == {"status": {}}
    return dict(version["schema"]["openAPIV3Schema"])


def test_limits_and_defaults_are_the_same_numbers(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    assert spec["replicas"]["maximum"] == api.MAX_REPLICAS
    assert spec["port"]["default"] == api.DEFAULT_PORT
    assert spec["metricsPort"]["default"] == api.DEFAULT_METRICS_PORT
    assert spec["waitForMasterSeconds"]["default"] == api.DEFAULT_WAIT_FOR_MASTER_SECONDS
    assert str(api.MAX_NPROC_PER_NODE) in spec["nprocPerNode"]["x-kubernetes-validations"][0]["rule"]
    run_policy = spec["runPolicy"]["properties"]
    assert run_policy["backoffLimit"]["maximum"] == api.MAX_BACKOFF_LIMIT
    assert run_policy["backoffLimit"]["default"] == api.DEFAULT_BACKOFF_LIMIT
    assert run_policy["restartPolicy"]["enum"] == [p.value for p in api.RestartPolicy]
    assert run_policy["cleanPodPolicy"]["enum"] == [p.value for p in api.CleanPodPolicy]
    assert spec["checkpoint"]["properties"]["mountPath"]["default"] == api.DEFAULT_CHECKPOINT_MOUNT


def test_the_reserved_env_names_are_the_same_list(schema: dict[str, Any]) -> None:
    pod = schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"]
    containers = pod["containers"]
    (check,) = [c for c in containers["x-kubernetes-validations"] if "MASTER_ADDR" in c["rule"]]
    for text in (check["rule"], check["messageExpression"]):
        listed = re.search(r"\[('[A-Z_]+'(?:,\s*'[A-Z_]+')*)\]", text)
        assert listed is not None
        assert tuple(n.strip(" '") for n in listed.group(1).split(",")) == RESERVED_ENV


def test_the_names_the_operator_adds_are_refused_in_the_template(schema: dict[str, Any]) -> None:
    pod = schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"]
    assert api.WAIT_CONTAINER in pod["initContainers"]["x-kubernetes-validations"][0]["rule"]
    assert any(api.WAIT_CONTAINER in c["rule"] for c in pod["containers"]["x-kubernetes-validations"])
    assert api.CHECKPOINT_VOLUME in pod["volumes"]["x-kubernetes-validations"][0]["rule"]


def test_every_status_field_the_operator_writes_is_in_the_schema(schema: dict[str, Any]) -> None:
    from ddpjob_contract.status import Phase
    from ddpjob_operator.status import JobStatus

    status = schema["properties"]["status"]["properties"]
    assert set(JobStatus().to_dict()) <= set(status)
    assert sorted(status["phase"]["enum"]) == sorted(p.value for p in Phase if p.value)
