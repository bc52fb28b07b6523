"""A container's first process is PID 1 of its own PID namespace, whatever host PID it has."""

from __future__ import annotations

import subprocess
import time

import pytest

from ddpjob_box import processes
from ddpjob_box.kubenode import node


def test_the_first_process_is_pid_1_of_its_namespace_even_when_a_later_one_has_the_lower_host_pid() -> None:
    """The loop saw it (2026-11-28): after host PIDs wrapped, the lowest PID of a trainer's container was its training
    process (314), taken for the supervisor, whose children were then looked for in vain for 30 s."""
    statuses = {
        314: "Name:\tpython\nNSpid:\t314\t9\n",  # started after the wrap
        32001: "Name:\tpython\nNSpid:\t32001\t1\n",  # the container's first process, started before it
    }
    assert node.first_process(statuses) == 32001
    assert node.first_process({1: "NSpid:\t1\n"}) is None, "the host's own PID 1 is no container's"
    assert node.first_process({}) is None


def test_it_reads_real_processes_in_a_pid_namespace_of_their_own() -> None:
    try:
        outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", "sleep 60 & wait"])
    except FileNotFoundError:
        pytest.fail("unshare (util-linux) is not installed")
    try:
        deadline = time.monotonic() + 10
        while True:
            inner = processes.children(outer.pid)  # sh, PID 1 inside
            grandchildren = {p for pid in inner for p in processes.children(pid)}  # sleep, PID 2 inside
            if inner and grandchildren:
                break
            assert time.monotonic() < deadline, "unshare's processes did not start"
            time.sleep(0.05)
        pids = {outer.pid, *inner, *grandchildren}
        assert node.first_process({pid: node._status(pid) for pid in pids}) == min(inner)
    finally:
        outer.kill()
        outer.wait()
