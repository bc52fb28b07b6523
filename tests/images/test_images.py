"""The images the chart and the examples name, run by the box's kubelet as pods: entrypoint, user, read-only root.

The box's node holds them under the names the chart uses (``ghcr.io/ddpjob/<target>:<version>``), built
from the Dockerfile (cached by their inputs) and imported into its containerd.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from kubernetes import client

from ddpjob_box import images
from ddpjob_box.kubenode.node import KubeletNode
from tests.e2e.kube import wait_pod_phase

# A cold session builds both images (about 8 minutes here, torch downloaded once) before the first test.
pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

TINY = (
    "--model", "tinycnn", "--image-size", "16", "--batch-size", "4", "--synthetic-samples", "64",
    "--num-workers", "0", "--log-interval", "1",
)  # fmt: skip


def _run(
    api_client: Any, namespace: str, image: str, container: dict[str, Any], timeout: float = 300
) -> tuple[str, str]:
    """Run one container of ``image`` to completion as the image's user, on a read-only root filesystem with
    a writable /tmp; returns the pod's phase and the container's log."""
    core = client.CoreV1Api(api_client)
    name = f"img-{time.monotonic_ns()}"
    body = {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",  # the box's own build, never a registry's
                    "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    **container,
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }
    core.create_namespaced_pod(namespace, body)
    pod = wait_pod_phase(core, namespace, name, {"Succeeded", "Failed"}, timeout)
    return pod.status.phase, str(core.read_namespaced_pod_log(name, namespace) or "")


def test_the_operator_image_runs_ddpjob_operator_help(api_client: Any, namespace: str, node: KubeletNode) -> None:
    image = images.image_name("operator")
    assert images.image_entrypoint(image) == ["ddpjob", "operator"]
    phase, log = _run(api_client, namespace, image, {"args": ["--help"]})
    assert phase == "Succeeded", f"`ddpjob operator --help` in {image} failed:\n{log[-3000:]}"
    assert "--liveness" in log and "--metrics-port" in log


def test_the_operator_image_imports_every_module_the_operator_runs(
    api_client: Any, namespace: str, node: KubeletNode
) -> None:
    """`--help` imports only the CLI; the handlers import the rest (a package left out of the install
    crashed the chart's pod, while --help passed)."""
    code = "import ddpjob_operator.handlers, ddpjob_operator.report; print('imported')"
    phase, log = _run(api_client, namespace, images.image_name("operator"), {"command": ["python", "-c", code]})
    assert (phase, log.split()[-1:]) == ("Succeeded", ["imported"]), log[-3000:]


@pytest.mark.parametrize("target", ["operator", "trainer"])
def test_each_image_runs_as_uid_10001_without_the_box_on_a_read_only_root(
    api_client: Any, namespace: str, node: KubeletNode, target: str
) -> None:
    probe = (
        "import importlib.util as u, os;"
        "print(os.getuid(), os.getgid(), u.find_spec('ddpjob_box'), os.access('/', os.W_OK))"
    )
    phase, log = _run(api_client, namespace, images.image_name(target), {"command": ["python", "-c", probe]})
    assert (phase, log.split()) == ("Succeeded", ["10001", "10001", "None", "False"]), log


def test_the_trainer_image_trains_two_steps(api_client: Any, namespace: str, node: KubeletNode) -> None:
    image = images.image_name("trainer")
    assert images.image_entrypoint(image) == ["python", "-m", "ddp_trainer"]
    phase, log = _run(api_client, namespace, image, {"args": [*TINY, "--steps", "2"]})
    assert phase == "Succeeded", f"the trainer in {image} failed:\n{log[-4000:]}"
    assert re.findall(r"step=\S+", log)[-1:] == ["step=2/2"], log
