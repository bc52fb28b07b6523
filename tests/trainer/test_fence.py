"""The fence: a rank joins its gang and writes checkpoints only while its name resolves to its own pod.

The pure half with a scripted resolver and clock; then real trainer processes, through the system's resolver, with
``localhost`` as the rank's name: a rank whose name resolves to another address never joins (its supervisor never
reaches rank 0's), and one whose name resolves to it trains and saves as before.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_trainer.fence import ELSEWHERE_SECONDS, DnsFence, Fenced, Unfenced, Unresolved, for_rank
from ddp_trainer.launch import read_launch
from ddpjob_contract import exits
from ddpjob_contract.pods import ENV_POD_IPS, ENV_RANK_ADDR

from .procs import TINY, free_ports, processes, rank_env, trainer

OWN = frozenset({"10.0.1.5"})


class Script:
    """A resolver that answers from a list, one answer per call (the last one from then on), and a clock that each
    sleep moves on."""

    def __init__(self, *answers: frozenset[str] | None) -> None:
        self.answers: Iterator[frozenset[str] | None] = iter(answers)
        self.last: frozenset[str] | None = None
        self.now = 0.0
        self.calls = 0

    def resolve(self, name: str) -> frozenset[str]:
        self.calls += 1
        self.last = next(self.answers, self.last)
        if self.last is None:
            raise Unresolved("Name or service not known")
        return self.last

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def fence(self) -> DnsFence:
        return DnsFence(name="train-1.train", own=OWN, rank=1, resolve=self.resolve, clock=lambda: self.now,
                        sleep=self.sleep)  # fmt: skip


def test_a_new_rank_waits_while_its_name_is_unpublished_or_still_names_the_pod_before_it() -> None:
    script = Script(None, None, frozenset({"10.0.2.9"}), frozenset({"10.0.2.9"}), OWN)
    script.fence().wait_until_current(timeout=60)
    assert script.calls == 5


def test_a_rank_whose_name_goes_on_naming_another_pod_is_fenced_and_never_joins() -> None:
    script = Script(frozenset({"10.0.2.9"}))
    with pytest.raises(Fenced) as fenced:
        script.fence().wait_until_current(timeout=600)
    assert script.now == pytest.approx(ELSEWHERE_SECONDS, abs=1)
    assert "train-1.train resolves to 10.0.2.9" in str(fenced.value) and "another pod holds rank 1" in str(fenced.value)


def test_a_rank_whose_name_never_resolves_gives_up_at_its_timeout() -> None:
    script = Script(None)
    with pytest.raises(Fenced, match="does not resolve"):
        script.fence().wait_until_current(timeout=90)
    assert script.now == pytest.approx(90, abs=1)


def test_a_write_is_refused_once_a_newer_pod_holds_the_name_and_allowed_while_it_cannot_be_told() -> None:
    script = Script(OWN, None, frozenset({"10.0.2.9"}))
    fence = script.fence()
    fence.confirm("write the checkpoint of step 10")  # this pod's
    fence.confirm("write the checkpoint of step 20")  # gone from DNS (a stop of a deleted job): no proof either way
    with pytest.raises(Fenced, match=r"not going to write the checkpoint of step 30: .* newer attempt holds rank 1"):
        fence.confirm("write the checkpoint of step 30")


def test_a_launch_that_names_no_rank_is_not_fenced() -> None:
    assert isinstance(for_rank("", "10.0.1.5", 0), Unfenced)
    assert isinstance(for_rank("train-0.train", "", 0), Unfenced)
    launch = read_launch({**rank_env(1, 2, 29500), ENV_RANK_ADDR: "train-1.train", ENV_POD_IPS: "10.0.1.5,fd00::5"})
    fence = for_rank(launch.rank_addr, launch.pod_ips, launch.rank)
    assert isinstance(fence, DnsFence) and fence.own == {"10.0.1.5", "fd00::5"} and fence.rank == 1


def _localhost() -> str:
    return ",".join(sorted({str(a[4][0]) for a in socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)}))


def test_a_supervised_rank_whose_name_names_another_pod_exits_fenced_without_reaching_its_gang() -> None:
    port = free_ports(2)
    gang_port = port + 1
    with socket.create_server(("127.0.0.1", gang_port)) as rank0_supervisor, processes() as procs:
        rank0_supervisor.settimeout(0.1)
        args = trainer(*TINY, "--max-restarts", "2", "--pg-timeout-seconds", "3")
        env = rank_env(1, 2, port, **{ENV_RANK_ADDR: "localhost", ENV_POD_IPS: "10.255.255.1"})
        started = time.monotonic()
        done = procs.wait(procs.start(args, env), timeout=120)
        with pytest.raises(TimeoutError):
            rank0_supervisor.accept()
    assert done.returncode == exits.EXIT_PERMANENT, done.stdout + done.stderr
    assert "localhost resolves to" in done.stderr and "another pod holds rank 1" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


def test_a_rank_whose_name_is_its_own_trains_and_saves(tmp_path: Path) -> None:
    with processes() as procs:
        args = trainer(*TINY, "--checkpoint-dir", str(tmp_path), "--checkpoint-interval", "2")
        env = rank_env(0, 1, free_ports(2), **{ENV_RANK_ADDR: "localhost", ENV_POD_IPS: _localhost()})
        done = procs.wait(procs.start(args, env), timeout=300)
    assert done.returncode == exits.EXIT_OK, done.stdout + done.stderr
    assert any(p.name.startswith("step-") for p in tmp_path.iterdir())
