"""The apiserver refuses invalid DDPJobs at admission, naming the field (CRD schema + CEL rules)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from .helpers import TRAINER, ApiError, Raw, job_body

pytestmark = pytest.mark.cluster

Spec = dict[str, Any]


def trainer(**fields: Any) -> Spec:
    return {"spec": {"containers": [{**copy.deepcopy(TRAINER), **fields}]}}


def pod_spec(**fields: Any) -> Spec:
    return {"spec": {"containers": [copy.deepcopy(TRAINER)], **fields}}


KUEUE = "kueue.x-k8s.io/"


def annotated(annotations: dict[str, str]) -> Spec:
    """A template whose pods carry ``annotations`` (Kueue's topology requests among them)."""
    return {"metadata": {"annotations": annotations}, "spec": {"containers": [copy.deepcopy(TRAINER)]}}


def without(key: str) -> Callable[[Spec], None]:
    return lambda body: body["spec"].pop(key)


# (case, name, spec changes or a function of the body, text the refusal must contain)
INVALID: list[tuple[str, str, Any, str]] = [
    ("replicas zero", "j", {"replicas": 0}, "spec.replicas"),
    ("replicas above the limit", "j", {"replicas": 1025}, "spec.replicas"),
    ("replicas missing", "j", without("replicas"), "spec.replicas"),
    ("replicas not a number", "j", {"replicas": "two"}, "spec.replicas"),
    ("nprocPerNode zero", "j", {"nprocPerNode": 0}, "spec.nprocPerNode"),
    ("nprocPerNode above 64", "j", {"nprocPerNode": 65}, "spec.nprocPerNode"),
    ("nprocPerNode a word other than auto", "j", {"nprocPerNode": "all"}, "spec.nprocPerNode"),
    ("port zero", "j", {"port": 0}, "spec.port"),
    ("port above 65535", "j", {"port": 65536}, "spec.port"),
    ("metricsPort above 65535", "j", {"metricsPort": 70000}, "spec.metricsPort"),
    ("port equal to metricsPort", "j", {"port": 9090, "metricsPort": 9090}, "spec.port"),
    ("port inside the per-process metrics ports", "j", {"nprocPerNode": 4, "metricsPort": 9000, "port": 9002},
     "spec.port"),
    ("metrics ports past 65535", "j", {"nprocPerNode": 2, "metricsPort": 65535, "port": 29500}, "spec.metricsPort"),
    ("waitForMasterSeconds negative", "j", {"waitForMasterSeconds": -1}, "spec.waitForMasterSeconds"),
    ("empty image", "j", {"template": trainer(image="")}, "spec.template.spec.containers[0].image"),
    ("blank image", "j", {"template": trainer(image="  ")}, "spec.template.spec.containers[0].image"),
    ("missing image", "j", {"template": {"spec": {"containers": [{"name": "t"}]}}},
     "spec.template.spec.containers[0].image"),
    ("no containers", "j", {"template": {"spec": {"containers": []}}}, "spec.template.spec.containers"),
    ("no template", "j", without("template"), "spec.template"),
    ("name too long for 10 ranks", "a" * 62, {"replicas": 10}, "metadata.name"),
    ("name too long for 1000 ranks", "a" * 60, {"replicas": 1000}, "metadata.name"),
    ("name not a DNS-1035 label", "my.job", {}, "metadata.name"),
    ("name starting with a digit", "1job", {}, "metadata.name"),
    ("reserved env RANK", "j", {"template": trainer(env=[{"name": "RANK", "value": "0"}])},
     "spec.template.spec.containers[0].env: RANK is reserved"),
    ("reserved env among others", "j",
     {"template": trainer(env=[{"name": "LR", "value": "1"}, {"name": "MASTER_ADDR", "value": "x"}])},
     "spec.template.spec.containers[0].env: MASTER_ADDR is reserved"),
    ("reserved env PYTHONUNBUFFERED", "j", {"template": trainer(env=[{"name": "PYTHONUNBUFFERED", "value": "0"}])},
     "PYTHONUNBUFFERED is reserved"),
    ("pod restartPolicy Always", "j", {"template": pod_spec(restartPolicy="Always")},
     "spec.template.spec.restartPolicy"),
    ("hostname in the template", "j", {"template": pod_spec(hostname="h")}, "spec.template.spec.hostname"),
    ("subdomain in the template", "j", {"template": pod_spec(subdomain="s")}, "spec.template.spec.subdomain"),
    ("the operator's volume name", "j", {"template": pod_spec(volumes=[{"name": "ddpjob-checkpoint", "emptyDir": {}}])},
     "spec.template.spec.volumes"),
    ("the operator's init container name", "j",
     {"template": pod_spec(initContainers=[{"name": "ddpjob-wait-for-master", "image": "x"}])},
     "spec.template.spec.initContainers"),
    ("two containers with one name", "j",
     {"template": {"spec": {"containers": [copy.deepcopy(TRAINER), copy.deepcopy(TRAINER)]}}},
     "spec.template.spec.containers[1]"),
    ("a container with the operator's init container name", "j",
     {"template": {"spec": {"containers": [{**TRAINER, "name": "ddpjob-wait-for-master"}]}}},
     "spec.template.spec.containers"),
    ("unknown restartPolicy", "j", {"runPolicy": {"restartPolicy": "Sometimes"}}, "spec.runPolicy.restartPolicy"),
    ("gangScheduling Off (YAML reads it as false)", "k", {"gangScheduling": False}, "spec.gangScheduling"),
    ("unknown gangScheduling", "l", {"gangScheduling": "Sometimes"}, "spec.gangScheduling"),
    ("negative backoffLimit", "j", {"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit"),
    ("backoffLimit above 100", "j", {"runPolicy": {"backoffLimit": 101}}, "spec.runPolicy.backoffLimit"),
    ("zero activeDeadlineSeconds", "j", {"runPolicy": {"activeDeadlineSeconds": 0}},
     "spec.runPolicy.activeDeadlineSeconds"),
    ("negative ttlSecondsAfterFinished", "j", {"runPolicy": {"ttlSecondsAfterFinished": -5}},
     "spec.runPolicy.ttlSecondsAfterFinished"),
    ("unknown cleanPodPolicy", "j", {"runPolicy": {"cleanPodPolicy": "Some"}}, "spec.runPolicy.cleanPodPolicy"),
    ("exit code zero listed as retryable", "j", {"runPolicy": {"retryableExitCodes": [0]}},
     "spec.runPolicy.retryableExitCodes[0]"),
    ("retryable codes without the ExitCode policy", "j",
     {"runPolicy": {"restartPolicy": "OnFailure", "retryableExitCodes": [3]}}, "spec.runPolicy.retryableExitCodes"),
    ("checkpoint with both sources", "j", {"checkpoint": {"claimName": "c", "emptyDir": {}}}, "spec.checkpoint"),
    ("checkpoint with no source", "j", {"checkpoint": {"mountPath": "/c"}}, "spec.checkpoint"),
    ("relative checkpoint mountPath", "j", {"checkpoint": {"emptyDir": {}, "mountPath": "ckpt"}},
     "spec.checkpoint.mountPath"),
    ("required and preferred topology at once", "j",
     {"template": annotated({f"{KUEUE}podset-required-topology": "rack", f"{KUEUE}podset-preferred-topology": "rack"})},
     "spec.template.metadata.annotations may set only one of"),
    ("unconstrained topology neither true nor false", "j",
     {"template": annotated({f"{KUEUE}podset-unconstrained-topology": "yes"})},
     "spec.template.metadata.annotations['kueue.x-k8s.io/podset-unconstrained-topology']"),
    ("a slice level without its size", "j", {"template": annotated({f"{KUEUE}podset-slice-required-topology": "rack"})},
     "spec.template.metadata.annotations: kueue.x-k8s.io/podset-slice-required-topology and"),
    ("a slice size that is no number", "j",
     {"template": annotated({f"{KUEUE}podset-slice-required-topology": "rack", f"{KUEUE}podset-slice-size": "two"})},
     "spec.template.metadata.annotations['kueue.x-k8s.io/podset-slice-size']"),
    ("a topology level that is no label name", "j",
     {"template": annotated({f"{KUEUE}podset-required-topology": "rack level"})},
     "spec.template.metadata.annotations['kueue.x-k8s.io/podset-required-topology'] must be a node label name"),
    ("a topology level whose prefix is too long for a label", "j",
     {"template": annotated({f"{KUEUE}podset-preferred-topology": "a" * 254 + "/rack"})},
     "spec.template.metadata.annotations['kueue.x-k8s.io/podset-preferred-topology'] must be a node label name"),
    ("a slice of more ranks than the job has", "j",
     {"template": annotated({f"{KUEUE}podset-slice-required-topology": "rack", f"{KUEUE}podset-slice-size": "3"})},
     "spec.template.metadata.annotations['kueue.x-k8s.io/podset-slice-size'] must be at most spec.replicas"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "change", "field"), [case[1:] for case in INVALID], ids=[c[0] for c in INVALID])
def test_the_apiserver_refuses_an_invalid_spec_naming_the_field(
    raw: Raw, crd: Any, module_namespace: str, name: str, change: Any, field: str
) -> None:
    body = job_body(name)
    if callable(change):
        change(body)
    else:
        body["spec"].update(change)
    with pytest.raises(ApiError) as refused:
        raw.create_job(module_namespace, body)
    assert refused.value.status == 422, refused.value.message
    assert field in refused.value.message


def test_the_table_has_at_least_twenty_cases() -> None:
    assert len(INVALID) >= 20


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("longest-for-ten-" + "a" * 45, {"replicas": 10}),  # 61 characters + "-9" = 63
        ("gpus", {"nprocPerNode": "auto", "template": trainer(resources={"limits": {"nvidia.com/gpu": 8}})}),
        ("unconstrained-as-kueue-reads-it", {"template": annotated({f"{KUEUE}podset-unconstrained-topology": "True"})}),
        ("everything", {
            "replicas": 3, "nprocPerNode": 2, "port": 23456, "metricsPort": 9100, "waitForMasterSeconds": 0,
            "runPolicy": {"backoffLimit": 0, "restartPolicy": "ExitCode", "retryableExitCodes": [1, 3],
                          "activeDeadlineSeconds": 60, "ttlSecondsAfterFinished": 0, "cleanPodPolicy": "All",
                          "suspend": True},
            "checkpoint": {"emptyDir": {"sizeLimit": "1Gi"}, "mountPath": "/ckpt"},
            "template": {"metadata": {"labels": {"team": "a"}, "annotations": {
                f"{KUEUE}podset-required-topology": "rack", f"{KUEUE}podset-slice-required-topology": "host",
                f"{KUEUE}podset-slice-size": "1"}}, "spec": {
                "containers": [{**TRAINER, "env": [{"name": "LR", "value": "0.1"}], "futureField": 1},
                               {"name": "sidecar", "image": "busybox", "env": [{"name": "RANK", "value": "x"}]}],
                "nodeSelector": {"pool": "gpu"}, "tolerations": [{"operator": "Exists"}], "priorityClassName": "p",
                "restartPolicy": "Never"}},
        }),
    ],
)  # fmt: skip
def test_the_apiserver_accepts_valid_specs_and_keeps_unknown_template_fields(
    raw: Raw, crd: Any, module_namespace: str, name: str, spec: Spec
) -> None:
    body = job_body(name)
    body["spec"].update(spec)
    created = raw.create_job(module_namespace, body)
    assert created["spec"]["template"] == body["spec"]["template"]
    raw.delete(f"/apis/ddpjob.dev/v1alpha1/namespaces/{module_namespace}/ddpjobs/{name}")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"spec": {"replicas": 3}}, "spec.replicas"),
        ({"spec": {"template": trainer(image="registry.example/ddp-trainer:2")}}, "spec.template"),
        ({"spec": {"template": trainer(args=["--lr", "0.2"])}}, "spec.template"),
        ({"spec": {"port": 12345}}, "spec.port"),
        ({"spec": {"nprocPerNode": 2}}, "spec.nprocPerNode"),
        ({"spec": {"checkpoint": {"claimName": "c"}}}, "spec.checkpoint"),
        ({"spec": {"gangScheduling": "Disabled"}}, "spec.gangScheduling"),
        # suspending in the same change does not count: the stored job was not suspended
        ({"spec": {"replicas": 3, "runPolicy": {"suspend": True}}}, "spec.replicas"),
    ],
)
def test_a_job_that_is_not_suspended_refuses_changes_to_what_its_pods_are_built_from(
    raw: Raw, crd: Any, module_namespace: str, patch: Spec, field: str
) -> None:
    raw.create_job(module_namespace, job_body("immutable"))
    try:
        with pytest.raises(ApiError) as refused:
            raw.patch_job(module_namespace, "immutable", patch)
        assert refused.value.status == 422
        assert field in refused.value.message and "suspend" in refused.value.message
        # run policy stays editable
        raw.patch_job(module_namespace, "immutable", {"spec": {"runPolicy": {"backoffLimit": 7}}})
    finally:
        raw.delete(f"/apis/ddpjob.dev/v1alpha1/namespaces/{module_namespace}/ddpjobs/immutable")


def test_a_suspended_job_accepts_a_new_template_and_replicas(raw: Raw, crd: Any, module_namespace: str) -> None:
    raw.create_job(module_namespace, job_body("editable"))
    try:
        raw.patch_job(module_namespace, "editable", {"spec": {"runPolicy": {"suspend": True}}})
        edited = raw.patch_job(module_namespace, "editable", {
            "spec": {"replicas": 4, "port": 23456, "template": trainer(image="registry.example/ddp-trainer:2")}
        })  # fmt: skip
        assert edited["spec"]["replicas"] == 4
        assert edited["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/ddp-trainer:2"
    finally:
        raw.delete(f"/apis/ddpjob.dev/v1alpha1/namespaces/{module_namespace}/ddpjobs/editable")
