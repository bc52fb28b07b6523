"""The shipped images, built once (cached by their inputs across sessions) and run by a real containerd.

The containerd here is the test's own: its socket and state live under a temporary directory and it
serves only its own namespace, with no CRI plugin. Its content store and snapshots persist under
``$DDPJOB_CACHE/images/test-containerd`` so a warm session neither builds nor imports anything.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpjob_box import images
from ddpjob_box.processes import Component, wait_until

NAMESPACE = "ddpjob-images-test"
# Where ctr and the runc shim put their state whatever the daemon's config says (containerd 1.6).
SHIM_DIRS = (Path("/run/containerd/s"), Path("/run/containerd/fifo"), Path("/run/containerd"))


@dataclass(frozen=True)
class Containerd:
    socket: Path
    state: Path

    def entrypoint(
        self, image: str, args: Sequence[str], *, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``image``'s entrypoint with ``args``, as the chart runs it."""
        return self.run(image, [*images.image_entrypoint(image), *args], timeout=timeout)

    def run(self, image: str, argv: Sequence[str], *, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``image`` as the image's user, on a read-only root filesystem with a tmpfs /tmp."""
        name = f"t{time.monotonic_ns()}"
        argv = [
            shutil.which("ctr") or "ctr",
            "--address",
            str(self.socket),
            "-n",
            NAMESPACE,
            "run",
            "--rm",
            "--cgroup",
            "",
            "--runc-root",
            str(self.state / "runc"),
            "--fifo-dir",
            str(self.state / "fifo"),
            "--read-only",
            "--mount",
            "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev",
            image,
            name,
            *argv,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _containerd_config(tmp: Path, root: Path) -> str:
    return f"""version = 2
root = "{root}"
state = "{tmp / "state"}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{tmp / "containerd.sock"}"
[ttrpc]
  address = "{tmp / "containerd.sock.ttrpc"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{tmp / "opt"}"
"""


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    binary = shutil.which("containerd")
    if binary is None or shutil.which("buildah") is None:
        pytest.fail("containerd or buildah is missing: run 'make system-packages'", pytrace=False)
    existed = {path for path in SHIM_DIRS if path.exists()}
    root = images.images_dir() / "test-containerd"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ddpjob-ctd-") as name:
        tmp = Path(name)
        (tmp / "config.toml").write_text(_containerd_config(tmp, root))
        daemon = Component("containerd", [binary, "--config", str(tmp / "config.toml")], tmp / "containerd.log")
        daemon.start()
        try:
            wait_until("containerd's socket", (tmp / "containerd.sock").is_socket, 30, watch=[daemon])
            yield Containerd(tmp / "containerd.sock", tmp / "state")
        finally:
            daemon.stop()
            # every container ran with --rm, so nothing is mounted under the state any more
            subprocess.run(["umount", "--recursive", "--quiet", str(tmp)], check=False, capture_output=True)
            for path in SHIM_DIRS:
                if path not in existed:
                    try:
                        path.rmdir()
                    except OSError:
                        pass


def _imported(target: str, containerd: Containerd) -> str:
    name = images.ensure_target(target, quiet=True)
    images.import_into_containerd(name, containerd.socket, NAMESPACE)
    return name


@pytest.fixture(scope="session")
def operator_image(containerd: Containerd) -> str:
    return _imported("operator", containerd)


@pytest.fixture(scope="session")
def trainer_image(containerd: Containerd) -> str:
    return _imported("trainer", containerd)
