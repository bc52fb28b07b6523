"""The local node's pure parts: image mapping, env resolution, launch command, DNS names and scrape targets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ddpjob_box.node import images, podspec, targets
from ddpjob_box.node.launch import Mount, launch_argv, mount_order

POD: dict[str, Any] = {
    "metadata": {
        "name": "job-1",
        "namespace": "team",
        "uid": "u-1",
        "labels": {"ddpjob.dev/job-name": "job", "ddpjob.dev/rank": "1", "ddpjob.dev/attempt": "0"},
    },
    "spec": {
        "hostname": "job-1",
        "subdomain": "job",
        "nodeName": "box-node",
        "serviceAccountName": "default",
        "containers": [
            {
                "name": "trainer",
                "image": "ghcr.io/ddpjob/trainer:0.1",
                "ports": [{"name": "metrics", "containerPort": 9400}],
            }
        ],
    },
    "status": {"podIP": "10.244.1.5", "hostIP": "10.244.1.1"},
}


def no_config(kind: str, name: str) -> Mapping[str, str] | None:
    return {"greeting": "hello"} if (kind, name) == ("configMap", "cm") else None


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("ghcr.io/ddpjob/trainer:0.1", "ddpjob/trainer"),
        ("ddpjob/operator", "ddpjob/operator"),
        ("localhost:5000/ddpjob/trainer@sha256:ab", "ddpjob/trainer"),
        ("busybox:1.36", "busybox"),
    ],
)
def test_an_image_reference_reduces_to_its_repository(image: str, repository: str) -> None:
    assert images.repository(image) == repository


def test_a_foreign_image_is_refused_with_err_image_never_pull() -> None:
    refused = images.entrypoint("docker.io/library/busybox:1.36")
    assert isinstance(refused, images.ImageRefused)
    assert refused.reason == "ErrImageNeverPull"
    assert "busybox" in refused.message


def test_env_resolves_values_downward_api_config_maps_and_dollar_references() -> None:
    container = {
        "name": "c",
        "image": "ddpjob/trainer",
        "env": [
            {"name": "A", "value": "x"},
            {"name": "B", "value": "$(A)-$(UNKNOWN)-$$(A)"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ddpjob.dev/rank']"}}},
            {"name": "G", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "greeting"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
    }
    env = podspec.resolve_env(POD, container, no_config, host_cpus=2)
    assert env == {
        "A": "x",
        "B": "x-$(UNKNOWN)-$(A)",
        "POD": "job-1",
        "IP": "10.244.1.5",
        "RANK": "1",
        "G": "hello",
        "CPU": "2",
    }


def test_command_defaults_to_the_images_entrypoint_and_args_expand_env() -> None:
    container = {
        "name": "c",
        "image": "ddpjob/trainer:1",
        "args": ["--steps", "$(STEPS)"],
        "env": [{"name": "STEPS", "value": "5"}],
    }
    proc = podspec.process(POD, container, no_config, host_cpus=2)
    assert isinstance(proc, podspec.Process)
    assert proc.argv == ("python", "-m", "ddp_trainer", "--steps", "5")


def test_a_pod_behind_a_subdomain_gets_the_cluster_dns_names() -> None:
    assert podspec.dns_names(POD) == [
        "job-1.job",
        "job-1.job.team",
        "job-1.job.team.svc",
        "job-1.job.team.svc.cluster.local",
    ]
    assert podspec.own_names(POD)[0] == "job-1"


def test_the_launch_command_enters_the_namespace_sets_the_hostname_and_mounts() -> None:
    argv = launch_argv("ns1", "job-1", [Mount("/src", "/ckpt", read_only=True)], "/work", ["python", "-V"])
    assert argv[:4] == ["ip", "netns", "exec", "ns1"]
    script = argv[argv.index("-ec") + 1]
    assert "hostname job-1" in script and "mount --bind /src /ckpt" in script and "remount,bind,ro" in script
    assert "cd /work" in script and script.endswith('exec "$@"')
    assert argv[-3:] == ["job-1", "python", "-V"]


def test_scrape_targets_carry_the_job_and_rank_labels() -> None:
    assert targets.targets([POD]) == [
        {
            "targets": ["10.244.1.5:9400"],
            "labels": {
                "namespace": "team",
                "pod": "job-1",
                "container": "trainer",
                "ddpjob": "job",
                "rank": "1",
                "attempt": "0",
            },
        }
    ]


def test_a_mount_over_tmp_comes_after_the_mounts_whose_sources_live_under_tmp() -> None:
    tmp = Mount("/tmp/box/pod/volumes/tmp", "/tmp")
    ckpt = Mount("/tmp/box/claims/c1", "/checkpoints")
    nested = Mount("/data/x", "/checkpoints/x")
    assert mount_order([tmp, nested, ckpt]) == [ckpt, nested, tmp]


def test_a_kept_directory_hidden_by_a_mount_is_bound_back_through_a_descriptor() -> None:
    argv = launch_argv("ns1", "h", [Mount("/data/tmp", "/tmp")], None, ["python"], keep=["/tmp/checkout", "/opt/py"])
    script = argv[argv.index("-ec") + 1]
    assert script.index("exec 9< /tmp/checkout") < script.index("mount --bind /data/tmp /tmp")
    assert "mount --no-canonicalize --bind /proc/$$/fd/9 /tmp/checkout" in script
    assert "/opt/py" not in script, "a directory no mount hides needs nothing"
