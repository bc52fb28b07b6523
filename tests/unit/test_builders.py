"""The Service and the Pods are data: built from a parsed job, checked field by field."""

from __future__ import annotations

from typing import Any

import pytest

from ddpjob_contract.pods import LABEL_ATTEMPT, LABEL_JOB_NAME, LABEL_MANAGED_BY, LABEL_RANK, MANAGED_BY
from ddpjob_operator import api, builders

from .factories import job


def env_of(pod: dict[str, Any], container: int = 0) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][container].get("env", [])}


def test_the_service_is_headless_publishes_unready_pods_and_selects_the_job() -> None:
    svc = builders.service(job("bert", 4, port=23456, metricsPort=9100))
    assert svc["metadata"]["name"] == "bert"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {LABEL_JOB_NAME: "bert", LABEL_MANAGED_BY: MANAGED_BY}
    assert [p["port"] for p in svc["spec"]["ports"]] == [23456, 9100]


def test_children_are_owned_by_the_job_as_controller() -> None:
    j = job()
    for obj in (builders.service(j), builders.pod(j, 0, 0, gang=False)):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob", "name": "train", "uid": j.uid,
            "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip


def test_a_pod_has_its_rank_identity_and_the_operator_restart_policy() -> None:
    pod = builders.pod(job("train", 3), 2, 5, gang=False)
    assert pod["metadata"]["name"] == "train-2"
    assert pod["metadata"]["labels"] == {
        LABEL_JOB_NAME: "train", LABEL_RANK: "2", LABEL_ATTEMPT: "5", LABEL_MANAGED_BY: "ddpjob",
    }  # fmt: skip
    assert pod["spec"]["hostname"] == "train-2"
    assert pod["spec"]["subdomain"] == "train"
    assert pod["spec"]["restartPolicy"] == "Never"


# One process per pod: torch.distributed reads RANK etc. directly.
SINGLE = {
    "MASTER_ADDR": "train-0.train", "MASTER_PORT": "29500", "WORLD_SIZE": "3", "RANK": "1", "LOCAL_RANK": "0",
    "PET_NNODES": "3", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "train-0.train",
    "PET_MASTER_PORT": "29500", "DDPJOB_NAME": "train", "DDPJOB_ATTEMPT": "4", "METRICS_PORT": "9090",
    "PYTHONUNBUFFERED": "1", "TERMINATION_MESSAGE_PATH": "/dev/termination-log", "TERMINATION_GRACE_SECONDS": "30",
    "MAX_RESTARTS": "0", "DDPJOB_RANK_ADDR": "train-1.train", "DDPJOB_POD_IPS": "",
}  # fmt: skip
# Four processes per pod: torchrun sets RANK/LOCAL_RANK; WORLD_SIZE counts processes.
MULTI = {k: v for k, v in SINGLE.items() if k not in ("RANK", "LOCAL_RANK")} | {
    "WORLD_SIZE": "12", "PET_NPROC_PER_NODE": "4",
}  # fmt: skip


@pytest.mark.parametrize(("nproc", "expected"), [(1, SINGLE), (4, MULTI)])
def test_the_trainer_gets_the_rendezvous_environment(nproc: int, expected: dict[str, str]) -> None:
    pod = builders.pod(job("train", 3, nprocPerNode=nproc), rank=1, attempt=4, gang=False)
    assert env_of(pod) == expected
    pod_ips = {"name": "DDPJOB_POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}}
    assert pod_ips in pod["spec"]["containers"][0]["env"], "the trainer's fence: its own addresses"


def test_the_grace_period_is_kubernetes_default_until_a_save_is_measured_then_fits_a_step_and_two_saves() -> None:
    j = job()
    assert builders.termination_grace(j, None, None) == 30
    assert builders.termination_grace(j, 2.0, 0.5) == 30, "a short save fits the default"
    assert builders.termination_grace(j, 40.0, 3.2) == 97, "ceil(2 x 3.2 + 2 x 40) + 10: the vote is read a step late"
    pod = builders.pod(j, 0, 0, gang=False, grace=94)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 94
    assert env_of(pod)["TERMINATION_GRACE_SECONDS"] == "94", "the trainer's deadline is the pod's"


def test_a_template_that_sets_its_grace_period_keeps_it_whatever_was_measured() -> None:
    j = job(template={"spec": {"terminationGracePeriodSeconds": 7, "containers": [{"name": "t", "image": "i"}]}})
    assert builders.termination_grace(j, 40.0, 3.0) == 7


def test_the_trainer_leaves_its_exit_message_where_the_kubelet_reads_it_and_falls_back_to_its_log() -> None:
    trainer = builders.pod(job(), 0, 0, gang=False)["spec"]["containers"][0]
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert trainer["terminationMessagePath"] == "/dev/termination-log"
    custom = {"spec": {"containers": [{"name": "t", "image": "i", "terminationMessagePath": "/tmp/said",
                                       "terminationMessagePolicy": "File"}]}}  # fmt: skip
    trainer = builders.pod(job(template=custom), 0, 0, gang=False)["spec"]["containers"][0]
    assert trainer["terminationMessagePolicy"] == "File"  # the user's choice stands
    assert {"name": "TERMINATION_MESSAGE_PATH", "value": "/tmp/said"} in trainer["env"]


def test_injected_env_comes_first_so_user_env_can_refer_to_it() -> None:
    template = {"spec": {"containers": [
        {"name": "t", "image": "i", "env": [{"name": "OUT", "value": "/out/$(DDPJOB_NAME)-$(RANK)"}]},
        {"name": "sidecar", "image": "s", "env": [{"name": "X", "value": "1"}]},
    ]}}  # fmt: skip
    pod = builders.pod(job(template=template), 0, 0, gang=False)
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names[-1] == "OUT" and names[: len(SINGLE)] == list(SINGLE)
    assert env_of(pod, 1) == {"X": "1"}, "only the first container is the trainer"


def test_everything_in_the_template_passes_through() -> None:
    spec = {
        "containers": [{"name": "t", "image": "i", "command": ["python"], "args": ["-m", "x"],
                        "resources": {"limits": {"nvidia.com/gpu": 8}}, "securityContext": {"runAsNonRoot": True},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}], "futureField": {"a": 1}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
        "nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}}, "priorityClassName": "high", "securityContext": {"fsGroup": 1000},
        "serviceAccountName": "trainer",
    }  # fmt: skip
    template = {"metadata": {"labels": {"team": "vision"}, "annotations": {"a": "b"}}, "spec": spec}
    pod = builders.pod(job(template=template, waitForMasterSeconds=0), 0, 0, gang=False)
    for key in ("volumes", "nodeSelector", "tolerations", "affinity", "priorityClassName", "securityContext",
                "serviceAccountName"):  # fmt: skip
        assert pod["spec"][key] == spec[key], key
    trainer = pod["spec"]["containers"][0]
    for key in ("command", "args", "resources", "securityContext", "volumeMounts", "futureField"):
        assert trainer[key] == spec["containers"][0][key], key
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["annotations"]["a"] == "b"


def test_template_labels_cannot_override_the_operator_labels() -> None:
    template = {
        "metadata": {"labels": {LABEL_JOB_NAME: "other", LABEL_RANK: "9"}},
        "spec": {"containers": [{"name": "t", "image": "i"}]},
    }
    labels = builders.pod(job(template=template), 1, 0, gang=False)["metadata"]["labels"]
    assert (labels[LABEL_JOB_NAME], labels[LABEL_RANK]) == ("train", "1")


@pytest.mark.parametrize(
    ("checkpoint", "volume"),
    [
        ({"claimName": "ckpt"}, {"name": api.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": "ckpt"}}),
        ({"emptyDir": {"sizeLimit": "1Gi"}, "mountPath": "/ckpt"},
         {"name": api.CHECKPOINT_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}}),
    ],
)  # fmt: skip
def test_the_checkpoint_volume_is_mounted_in_every_rank_and_named_in_env(
    checkpoint: dict[str, Any], volume: dict[str, Any]
) -> None:
    j = job(checkpoint=checkpoint)
    for rank in range(2):
        pod = builders.pod(j, rank, 0, gang=False)
        assert volume in pod["spec"]["volumes"]
        mount = {"name": api.CHECKPOINT_VOLUME, "mountPath": checkpoint.get("mountPath", "/checkpoints")}
        assert mount in pod["spec"]["containers"][0]["volumeMounts"]
        assert env_of(pod)["CHECKPOINT_DIR"] == mount["mountPath"]


def test_without_a_checkpoint_there_is_no_volume_and_no_checkpoint_dir() -> None:
    pod = builders.pod(job(), 0, 0, gang=False)
    assert "volumes" not in pod["spec"]
    assert "CHECKPOINT_DIR" not in env_of(pod)


def test_each_rank_waits_for_the_master_name_in_the_trainer_image_with_its_constraints() -> None:
    template = {"spec": {"containers": [{
        "name": "t", "image": "reg/trainer:7", "imagePullPolicy": "IfNotPresent",
        "securityContext": {"runAsNonRoot": True},
        "resources": {"limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": 1}},
    }], "initContainers": [{"name": "fetch", "image": "fetcher"}]}}  # fmt: skip
    pod = builders.pod(job(template=template, waitForMasterSeconds=42), 1, 0, gang=False)
    wait, user = pod["spec"]["initContainers"]
    assert user["name"] == "fetch"
    assert wait["name"] == api.WAIT_CONTAINER
    assert (wait["image"], wait["imagePullPolicy"]) == ("reg/trainer:7", "IfNotPresent")
    assert wait["securityContext"] == {"runAsNonRoot": True}
    assert wait["resources"] == {"limits": {"cpu": "2", "memory": "1Gi"}}, "no GPU for a DNS lookup"
    assert {"name": "MASTER_ADDR", "value": "train-0.train"} in wait["env"]
    assert {"name": "DDPJOB_WAIT_SECONDS", "value": "42"} in wait["env"]


def test_waiting_for_the_master_can_be_turned_off() -> None:
    assert "initContainers" not in builders.pod(job(waitForMasterSeconds=0), 1, 0, gang=False)["spec"]


def test_building_a_pod_does_not_modify_the_job() -> None:
    j = job(checkpoint={"claimName": "c"})
    before = repr(j)
    builders.pod(j, 0, 0, gang=False)
    builders.pod(j, 1, 3, gang=False)
    assert repr(j) == before


@pytest.mark.parametrize(
    ("ports", "expected"),
    [
        ([], [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"},
              {"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"}]),
        ([{"name": "metrics", "containerPort": 8000}],
         [{"name": "metrics", "containerPort": 8000},
          {"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"}]),
        ([{"name": "prom", "containerPort": 9100}, {"name": "rdzv", "containerPort": 29500}],
         [{"name": "prom", "containerPort": 9100}, {"name": "rdzv", "containerPort": 29500}]),
    ],
)  # fmt: skip
def test_the_trainer_declares_named_metrics_and_rendezvous_ports_unless_the_template_does(
    ports: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    template = {"spec": {"containers": [{"name": "t", "image": "i", "ports": ports}, {"name": "s", "image": "s"}]}}
    pod = builders.pod(job(template=template, metricsPort=9100), 0, 0, gang=False)
    assert pod["spec"]["containers"][0]["ports"] == expected
    assert "ports" not in pod["spec"]["containers"][1]


def test_an_attempts_podgroup_is_a_gang_of_every_rank_at_the_pods_priority_owned_by_the_job() -> None:
    template = {"spec": {"priorityClassName": "high", "containers": [{"name": "trainer", "image": "img"}]}}
    j = job("train", 4, template=template)
    group = builders.pod_group(j, 2)
    assert group["metadata"]["name"] == "train-attempt-2"
    assert group["metadata"]["labels"][LABEL_ATTEMPT] == "2"
    assert group["spec"] == {
        "schedulingPolicy": {"gang": {"minCount": 4}},
        "disruptionMode": {"all": {}},
        "priorityClassName": "high",
    }
    assert group["metadata"]["ownerReferences"][0]["uid"] == j.uid
    pod = builders.pod(j, 1, 2, gang=True)
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "train-attempt-2"}
    assert "schedulingGroup" not in builders.pod(j, 1, 2, gang=False)["spec"]
