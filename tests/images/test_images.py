"""The images the chart and the examples name, run as containerd runs them: entrypoint, user, read-only root."""

from __future__ import annotations

import re

import pytest

from ddpjob_box import images

from .conftest import Containerd

pytestmark = pytest.mark.images

TINY = (
    "--model", "tinycnn", "--image-size", "16", "--batch-size", "4", "--synthetic-samples", "64",
    "--num-workers", "0", "--log-interval", "1",
)  # fmt: skip


def test_the_operator_image_runs_ddpjob_operator_help(containerd: Containerd, operator_image: str) -> None:
    assert images.image_entrypoint(operator_image) == ["ddpjob", "operator"]
    done = containerd.entrypoint(operator_image, ["--help"])
    assert done.returncode == 0, f"`ddpjob operator --help` in {operator_image} failed:\n{done.stderr[-3000:]}"
    assert "--liveness" in done.stdout and "--metrics-port" in done.stdout


@pytest.mark.parametrize("target", ["operator", "trainer"])
def test_each_image_runs_as_uid_10001_without_the_box_on_a_read_only_root(
    containerd: Containerd, target: str, request: pytest.FixtureRequest
) -> None:
    image = request.getfixturevalue(f"{target}_image")
    probe = (
        "import importlib.util as u, os;"
        "print(os.getuid(), os.getgid(), u.find_spec('ddpjob_box'), os.access('/', os.W_OK))"
    )
    done = containerd.run(image, ["python", "-c", probe], timeout=60)
    assert (done.returncode, done.stdout.split()) == (0, ["10001", "10001", "None", "False"]), done.stderr


def test_the_trainer_image_trains_two_steps(containerd: Containerd, trainer_image: str) -> None:
    assert images.image_entrypoint(trainer_image) == ["python", "-m", "ddp_trainer"]
    done = containerd.entrypoint(trainer_image, [*TINY, "--steps", "2"])
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the trainer in {trainer_image} failed:\n{output[-4000:]}"
    assert re.findall(r"step=\S+", output)[-1:] == ["step=2/2"], output
