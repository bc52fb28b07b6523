"""The wait-for-master script, run by the real `sh` against real sockets: rank 0 waits for the name to be its
own, the others for every address behind it to answer (soak run 1:64: a name still resolving to the gone
rank 0 of the previous attempt)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpjob_operator import builders
from ddpjob_operator.wait_for_master import ENV_POD_IPS, ENV_WAIT_SECONDS, SCRIPT

from .factories import job


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port nothing listens on (bound, not listening: a connect is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def wait(master: str, port: int, *, pod_ips: str = "", path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": path or os.environ["PATH"],
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        ENV_WAIT_SECONDS: "1",
        **({ENV_POD_IPS: pod_ips} if pod_ips else {}),
    }
    return subprocess.run(["sh", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=30)


def test_rank_0_goes_on_once_the_name_resolves_to_its_own_ip(closed_port: int) -> None:
    assert wait("127.0.0.1", closed_port, pod_ips="127.0.0.1,fd00::1").returncode == 0


def test_rank_0_waits_while_the_name_resolves_to_another_pod_and_says_so(closed_port: int) -> None:
    done = wait("127.0.0.1", closed_port, pod_ips="127.0.0.2")
    assert done.returncode == 1
    assert "spec.waitForMasterSeconds" in done.stderr
    assert "resolves to ['127.0.0.1'], not to this pod ['127.0.0.2']" in done.stderr


def test_another_rank_goes_on_when_rank_0_refuses_before_its_trainer_listens(closed_port: int) -> None:
    assert wait("127.0.0.1", closed_port).returncode == 0


def test_another_rank_waits_while_the_name_resolves_to_an_address_that_does_not_answer(silent_port: int) -> None:
    done = wait("127.0.0.1", silent_port)
    assert done.returncode == 1
    assert f"resolves to ['127.0.0.1'], which does not answer on port {silent_port}" in done.stderr


def test_a_name_that_does_not_resolve_fails_after_the_wait_naming_the_field(closed_port: int) -> None:
    done = wait("no-such-name.invalid", closed_port)
    assert done.returncode == 1
    assert "no-such-name.invalid does not resolve" in done.stderr
    assert "rank 0 not ready at no-such-name.invalid within 1s (spec.waitForMasterSeconds)" in done.stderr


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A local port whose connects get no answer at all, as at a gone pod's address: Linux drops SYNs to a
    listener whose accept queue is full."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        try:
            yield port
        finally:
            for filler in fillers:
                filler.close()


@pytest.fixture
def path_without_python(tmp_path: Path) -> str:
    """A PATH holding the script's tools but not python3, as in an image without it."""
    for tool in ("sh", "date", "getent", "awk", "sort", "tr", "sleep"):
        found = shutil.which(tool)
        assert found, tool
        (tmp_path / tool).symlink_to(found)
    return str(tmp_path)


def test_without_python_rank_0_still_waits_for_its_own_ip_through_getent(
    path_without_python: str, closed_port: int
) -> None:
    assert wait("127.0.0.1", closed_port, pod_ips="127.0.0.1", path=path_without_python).returncode == 0
    other = wait("127.0.0.1", closed_port, pod_ips="127.0.0.2", path=path_without_python)
    assert other.returncode == 1
    assert "resolves to '127.0.0.1,'" in other.stderr


def test_only_rank_0_is_told_its_pod_ips_by_the_downward_api() -> None:
    def wait_env(rank: int) -> list[dict[str, object]]:
        env: list[dict[str, object]] = builders.pod(job(port=23456), rank, 0, gang=False)["spec"]["initContainers"][0][
            "env"
        ]
        return env

    assert {"name": ENV_POD_IPS, "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}} in wait_env(0)
    assert all(e["name"] != ENV_POD_IPS for e in wait_env(1))
    assert {"name": "MASTER_PORT", "value": "23456"} in wait_env(1)
