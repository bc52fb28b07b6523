"""Spec parsing: defaults, nprocPerNode auto, and one-line errors naming the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ddpjob_operator import api
from ddpjob_operator.api import CleanPodPolicy, RestartPolicy, SpecError, parse_job

from .factories import body, job


def test_defaults_fill_every_optional_field() -> None:
    j = job()
    assert (j.spec.replicas, j.spec.nproc_per_node, j.spec.port, j.spec.metrics_port) == (2, 1, 29500, 9090)
    assert j.spec.wait_for_master_seconds == api.DEFAULT_WAIT_FOR_MASTER_SECONDS
    rp = j.spec.run_policy
    assert (rp.backoff_limit, rp.restart_policy, rp.clean_pod_policy, rp.suspend) == (
        3, RestartPolicy.EXIT_CODE, CleanPodPolicy.RUNNING, False,
    )  # fmt: skip
    assert j.spec.checkpoint is None
    assert j.spec.world_size == 2
    assert j.spec.trainer_container == "trainer"


def _gpu_template(limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"spec": {"containers": [{"name": "t", "image": "i", "resources": resources}]}}


@pytest.mark.parametrize(
    ("template", "nproc"),
    [
        (_gpu_template(limits={"nvidia.com/gpu": 4}), 4),
        (_gpu_template(limits={"nvidia.com/gpu": "8"}), 8),
        (_gpu_template(requests={"nvidia.com/gpu": 2}), 2),
        (_gpu_template(limits={"cpu": "4"}), 1),
        (_gpu_template(), 1),
        (_gpu_template(limits={"nvidia.com/gpu": "0"}), 1),
        (_gpu_template(limits={"nvidia.com/gpu": "lots"}), 1),
    ],
)
def test_nproc_auto_is_the_gpu_count_of_the_trainer_or_one(template: dict[str, Any], nproc: int) -> None:
    j = job(template=template, nprocPerNode="auto", replicas=3)
    assert j.spec.nproc_per_node == nproc
    assert j.spec.world_size == 3 * nproc


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"replicas": 0}, "spec.replicas"),
        ({"replicas": api.MAX_REPLICAS + 1}, "spec.replicas"),
        ({"replicas": "2"}, "spec.replicas"),
        ({"nprocPerNode": 0}, "spec.nprocPerNode"),
        ({"nprocPerNode": "many"}, "spec.nprocPerNode"),
        ({"port": 70000}, "spec.port"),
        ({"metricsPort": 0}, "spec.metricsPort"),
        ({"template": {"spec": {"containers": []}}}, "spec.template.spec.containers"),
        ({"template": {"spec": {"containers": [{"name": "t", "image": " "}]}}}, "containers[0].image"),
        ({"template": {"spec": {"containers": [{"name": "t", "image": "i", "env": [{"name": "RANK", "value": "3"}]}]}}},
         "containers[0].env"),
        ({"runPolicy": {"restartPolicy": "Sometimes"}}, "spec.runPolicy"),
        ({"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit"),
        ({"runPolicy": {"retryableExitCodes": [0]}}, "spec.runPolicy.retryableExitCodes"),
        ({"checkpoint": {"claimName": "c", "emptyDir": {}}}, "spec.checkpoint"),
        ({"checkpoint": {"emptyDir": {}, "mountPath": "relative"}}, "spec.checkpoint.mountPath"),
    ],
)  # fmt: skip
def test_a_bad_spec_raises_a_spec_error_naming_the_field(change: dict[str, Any], field: str) -> None:
    b = body()
    b["spec"].update(change)
    with pytest.raises(SpecError, match=re.escape(field)):
        parse_job(b)


@pytest.mark.parametrize(
    ("name", "replicas", "ok"),
    [
        ("a" * 61, 10, True),
        ("a" * 62, 10, False),
        ("a" * 60, 100, True),
        ("a" * 61, 100, False),
        ("a" * 58, 1024, True),
        ("a" * 59, 1024, False),
        ("Upper", 1, False),
        ("9lives", 1, False),
        ("dotted.name", 1, False),
    ],
)
def test_the_name_must_leave_room_for_the_highest_rank_in_a_dns_label(name: str, replicas: int, ok: bool) -> None:
    if ok:
        assert len(f"{job(name, replicas).name}-{replicas - 1}") <= 63
    else:
        with pytest.raises(SpecError, match=r"metadata\.name"):
            job(name, replicas)


def test_the_spec_hash_ignores_run_policy_but_not_the_template() -> None:
    base = job()
    assert job(runPolicy={"backoffLimit": 9, "suspend": True}).spec.spec_hash == base.spec.spec_hash
    assert job(port=1234).spec.spec_hash != base.spec.spec_hash
    template = {"spec": {"containers": [{"name": "trainer", "image": "registry.example/trainer:2"}]}}
    assert job(template=template).spec.spec_hash != base.spec.spec_hash


def test_parsing_does_not_alias_the_body() -> None:
    b = body()
    j = parse_job(b)
    b["spec"]["template"]["spec"]["containers"][0]["image"] = "changed"
    assert j.spec.template["spec"]["containers"][0]["image"] == "registry.example/trainer:1"
