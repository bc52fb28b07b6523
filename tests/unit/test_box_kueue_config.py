"""Kueue's Configuration as the box writes it: DDPJob as an external framework and waitForPodsReady."""

from __future__ import annotations

import yaml

from ddpjob_box.kueue import EXTERNAL_FRAMEWORK, WAIT_FOR_PODS_READY, chart_values, manager_config

SHIPPED = yaml.safe_dump({"integrations": {"frameworks": ["batch/job", "kubeflow.org/pytorchjob"]}})


def test_the_box_keeps_the_shipped_frameworks_and_adds_ddpjob_and_its_short_pods_ready_timeout() -> None:
    config = manager_config(SHIPPED)
    assert config["integrations"] == {"frameworks": ["batch/job", "kubeflow.org/pytorchjob"],
                                      "externalFrameworks": [EXTERNAL_FRAMEWORK]}  # fmt: skip
    assert config["waitForPodsReady"] == WAIT_FOR_PODS_READY and WAIT_FOR_PODS_READY["timeout"] == "60s"


def test_a_pods_ready_timeout_given_replaces_the_boxs_and_keeps_the_rest() -> None:
    values = chart_values("kueue:v0.17.0-x", SHIPPED, "box-node", "5m")
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["waitForPodsReady"] == {**WAIT_FOR_PODS_READY, "timeout": "5m"}
