"""A node's containerd: started with the node's configuration on a layout, and what brings images into it.

The standard library alone (with ``ddpjob_box``): the setup's store fill runs it on the system's python3.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from ddpjob_box.kubenode.configs import NodeLayout, containerd_toml
from ddpjob_box.processes import Component, wait_until

# Brings an image into the containerd listening on a socket, whose root directory is the third argument
# (ddpjob_box.images.import_into_containerd).
Importer = Callable[[str, Path, Path], object]


def start_containerd(layout: NodeLayout, sandbox_image: str, log_path: Path) -> Component:
    """containerd with a node's configuration on ``layout``, serving when this returns (stopped if it never does)."""
    layout.containerd_config.parent.mkdir(parents=True, exist_ok=True)
    layout.containerd_config.write_text(containerd_toml(layout, sandbox_image))
    layout.socket_dir.mkdir(parents=True, exist_ok=True)
    containerd = Component(
        "containerd",
        [shutil.which("containerd") or "containerd", f"--config={layout.containerd_config}", "--log-level=warn"],
        log_path,
    )
    ctr = shutil.which("ctr") or "ctr"
    containerd.start()
    try:
        wait_until(
            "containerd to serve",
            lambda: (
                subprocess.run(
                    [ctr, "--address", str(layout.containerd_socket), "version"], capture_output=True
                ).returncode
                == 0
            ),
            30,
            watch=[containerd],
        )
    except BaseException:
        containerd.stop()
        raise
    return containerd
