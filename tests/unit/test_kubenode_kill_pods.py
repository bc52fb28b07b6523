"""A node that stops kills its own pods' processes, never those of another node on the host."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpjob_box.kubenode import hoststate, leftovers
from ddpjob_box.processes import exited


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(["sleep", "60"]))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _pod_cgroup(root: Path, top: str, pid: int) -> None:
    """``<root>/memory/<top>/kubepods/pod-x`` holding ``pid``, as a kubelet with cgroup root ``/<top>`` makes it."""
    path = root / "memory" / top / "kubepods" / f"pod-{pid}"
    path.mkdir(parents=True)
    (path / "cgroup.procs").write_text(f"{pid}\n")


def test_stopping_a_node_kills_its_pods_processes_and_leaves_another_nodes_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    monkeypatch.setattr(hoststate, "CGROUP_ROOT", tmp_path)
    before = hoststate.HostState(sysctls={}, chains={}, cgroups=[], files={}, mounts=[], interfaces=[])
    ours, theirs = sleeper(), sleeper()
    _pod_cgroup(tmp_path, "ddpjob-kubelet-ours", ours.pid)
    _pod_cgroup(tmp_path, "ddpjob-kubelet-theirs", theirs.pid)  # a node started after ours: new since before
    leftovers.kill_pods(before, tmp_path / "containerd.sock", "/ddpjob-kubelet-ours")
    assert ours.wait(timeout=10) == -9, "its own pod's process is SIGKILLed"
    assert theirs.poll() is None and not exited(theirs.pid), "the other node's pod runs on"


def test_a_node_under_the_cgroups_own_root_only() -> None:
    cgroups = {"memory/ddpjob-kubelet-a/kubepods/p1", "cpu/ddpjob-kubelet-b/kubepods/p2", "memory/kubepods/p3"}
    assert hoststate.under(cgroups, "/ddpjob-kubelet-a") == {"memory/ddpjob-kubelet-a/kubepods/p1"}
    assert hoststate.under(cgroups, "") == cgroups, "a record from before nodes had roots of their own: all"
