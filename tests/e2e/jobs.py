"""DDPJob bodies for end-to-end runs: CPU-sized, gloo, a tiny model."""

from __future__ import annotations

import copy
from typing import Any

from ddpjob_box import images

# The name the manifests use, under which the box's node holds the image built from the Dockerfile.
TRAINER_IMAGE = images.image_name("trainer")


def cpu_job(name: str, *, args: list[str] | None = None, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    """A small DDPJob; ``args`` are trainer flags, ``spec`` merges into the DDPJob spec."""
    trainer_args = [
        "--model",
        "tinycnn",
        "--image-size",
        "32",
        "--batch-size",
        "16",
        "--num-workers",
        "0",
        "--log-interval",
        "5",
        "--metrics-linger-seconds",
        "8",
        *(args or []),
    ]
    body: dict[str, Any] = {
        "apiVersion": "ddpjob.dev/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "trainer", "image": TRAINER_IMAGE, "args": trainer_args}]}},
        },
    }
    body["spec"].update(copy.deepcopy(spec))
    return body
