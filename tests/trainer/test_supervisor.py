"""``--max-restarts``: the gang's processes restarted in place by each rank's supervisor, with real gloo ranks."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddp_trainer import gang, supervisor
from ddpjob_contract import exits
from ddpjob_contract import metrics as names

from .procs import TINY, clean_env, explain, free_ports, processes, rank_env, read_until, trainer

# Rank 1 kills itself after step 4 and its checkpoint, once: a resumed process starts past step 4.
CRASH = ("--checkpoint-interval", "2", "--crash-at-step", "4", "--crash-rank", "1", "--pg-timeout-seconds", "60")


@pytest.mark.parametrize(
    ("exitcode", "retried"),
    [
        (-signal.SIGKILL, True),  # the OOM killer, a kill by hand
        (-signal.SIGSEGV, True),
        (exits.EXIT_RETRYABLE, True),  # a lost peer, a collective timeout
        (-signal.SIGTERM, False),  # a stop
        (exits.EXIT_SIGTERM, False),  # a stop, after saving
        (exits.EXIT_OK, False),
        (exits.EXIT_BUG, False),
        (exits.EXIT_PERMANENT, False),
    ],
)
def test_only_a_lost_peer_a_timeout_or_a_kill_restarts_the_gang_in_place(exitcode: int, retried: bool) -> None:
    assert supervisor.retryable(exitcode) is retried


def test_a_child_killed_by_a_signal_makes_the_supervisor_exit_as_a_shell_reports_it() -> None:
    assert supervisor.exit_status(-signal.SIGKILL) == 137
    assert supervisor.exit_status(exits.EXIT_RETRYABLE) == exits.EXIT_RETRYABLE


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_rank_killed_mid_run_restarts_the_gang_in_place_and_both_ranks_finish_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    ports = free_ports(2)  # MASTER_PORT, and the supervisors' on the next one
    metrics = free_ports(2)
    args = trainer(
        *TINY, "--steps", "10", "--checkpoint-dir", str(tmp_path), *CRASH, "--max-restarts", "2",
        "--metrics-port", str(metrics), "--metrics-linger-seconds", "5",
    )  # fmt: skip
    with processes() as procs:
        ranks = [procs.start(args, rank_env(r, 2, ports)) for r in range(2)]
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 120
        while seen.get(names.STEP) != 10 and time.monotonic() < deadline and ranks[0].poll() is None:
            time.sleep(0.5)
            try:
                seen = _scrape(metrics)
            except OSError:
                continue
        done = procs.wait_all(timeout=120)
    # The processes the launcher started are the ones that finished: no new process from outside.
    assert [d.returncode for d in done] == [exits.EXIT_OK, exits.EXIT_OK], explain(done)
    assert seen.get(names.STEP) == 10 and seen.get(names.RESTART_COUNT) == 1, seen
    said = "ddp_trainer: rank 1's training process was killed by SIGKILL: restarting the gang in place (1 of 2)"
    assert said in done[0].stderr and said in done[1].stderr, explain(done)
    assert "resumed from step 4" in done[0].stdout, explain(done)
    assert "Traceback" not in done[0].stderr + done[1].stderr


def test_after_its_last_restart_a_supervisor_exits_as_its_child_did(tmp_path: Path) -> None:
    # No checkpoint: every new child starts over and dies at step 4 again. One restart in place, then the
    # supervisors exit as their children did, for the operator (or whoever started them) to decide.
    ports = free_ports(2)
    args = trainer(*TINY, "--steps", "10", *CRASH, "--max-restarts", "1")
    with processes() as procs:
        for r in range(2):
            procs.start(args, rank_env(r, 2, ports))
        done = procs.wait_all(timeout=120)
    assert done[1].returncode == exits.SIGNAL_EXIT_BASE + signal.SIGKILL, explain(done)
    assert done[0].returncode == exits.EXIT_RETRYABLE, explain(done)
    assert done[1].stderr.count("restarting the gang in place") == 1, explain(done)
    assert "debug: --crash-at-step 4" in done[1].stdout
    assert done[1].stdout.count("debug: --crash-at-step 4") == 2, explain(done)


def test_sigterm_to_a_supervisor_stops_the_gang_at_one_step_with_its_checkpoint_and_restarts_nothing(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    args = trainer(
        *TINY, "--steps", "100000", "--checkpoint-dir", str(ckpt), "--stop-grace-seconds", "60",
        "--max-restarts", "3",
    )  # fmt: skip
    ports = free_ports(2)
    with processes() as procs:
        rank0 = procs.start(args, rank_env(0, 2, ports))
        procs.start(args, rank_env(1, 2, ports))
        read_until(rank0, "step=5/")
        rank0.send_signal(signal.SIGTERM)
        done = procs.wait_all(timeout=60)
    assert [d.returncode for d in done] == [exits.EXIT_SIGTERM, exits.EXIT_SIGTERM], explain(done)
    stopped = re.search(r"stopped on SIGTERM at step (\d+), after saving its checkpoint", done[0].stderr)
    assert stopped, explain(done)
    assert [p.name for p in ckpt.iterdir()] == [f"step-{int(stopped.group(1)):09d}.pt"]
    assert "restarting the gang in place" not in done[0].stderr + done[1].stderr


def test_a_permanent_error_in_the_child_ends_the_supervisor_with_its_code_and_message(tmp_path: Path) -> None:
    message = tmp_path / "message"
    message.touch()
    empty = tmp_path / "images"
    empty.mkdir()
    args = trainer(
        *TINY, "--data", "imagefolder", "--data-dir", str(empty), "--max-restarts", "3",
        "--termination-message-path", str(message),
    )  # fmt: skip
    with processes() as procs:
        done = procs.wait(procs.start(args, rank_env(0, 1, free_ports(2))), timeout=120)
    assert done.returncode == exits.EXIT_PERMANENT, done.stdout + done.stderr
    assert str(empty) in message.read_text()
    assert "restarting" not in done.stderr and "Traceback" not in done.stderr


def _until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "not heard within 10 s"
        time.sleep(0.01)


def test_each_restart_is_heard_by_every_member_with_its_first_reason_and_by_a_late_one_too() -> None:
    port = free_ports(1)
    gang.Server(port)
    first, second = gang.Member("127.0.0.1", port, 0, 10), gang.Member("127.0.0.1", port, 1, 10)
    assert first.announce(1, "rank 1's training process was killed by SIGKILL")
    _until(lambda: second.heard() == 1)
    assert second.announce(1, "rank 0's training process exited 200")  # the same restart, said again later
    _until(lambda: first.heard() == 1)
    late = gang.Member("127.0.0.1", port, 2, 10)
    _until(lambda: late.heard() == 1)
    for member in (first, second, late):
        assert member.why(1) == "rank 1's training process was killed by SIGKILL"


def test_a_member_that_cannot_reach_rank_0_announces_nothing() -> None:
    lonely = gang.Member("127.0.0.1", free_ports(1), 1, 0.5)
    assert not lonely.announce(1, "a lost peer")
    _until(lambda: bool(lonely.stopped()))
    assert lonely.stopped() == "cannot reach rank 0's supervisor"


def test_a_stop_reaches_every_member_and_a_member_that_is_gone_stops_the_gang() -> None:
    port = free_ports(1)
    gang.Server(port)
    first, second = gang.Member("127.0.0.1", port, 0, 10), gang.Member("127.0.0.1", port, 1, 10)
    second.stop("rank 1's training process was killed by the OOM killer (over its memory limit)")
    _until(lambda: bool(first.stopped()))
    assert first.stopped() == "rank 1's training process was killed by the OOM killer (over its memory limit)"
    assert not first.announce(1, "too late") or first.heard() == 0, "no restart after a stop"

    port = free_ports(1)
    gang.Server(port)
    staying = gang.Member("127.0.0.1", port, 0, 10)
    leaving = socket.create_connection(("127.0.0.1", port))
    leaving.sendall(b"hello 1\n")
    _until(lambda: staying.heard() == 0 and staying.wakeup_fd() > 0)
    leaving.close()
    _until(lambda: bool(staying.stopped()))
    assert staying.stopped() == "the supervisor of rank 1 is gone"


def test_the_oom_kills_are_read_from_the_containers_memory_cgroup_v2_or_v1(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.events", tmp_path / "memory.oom_control"
    assert supervisor.oom_kills((v2, v1)) == 0, "no counter: none seen"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert supervisor.oom_kills((v2, v1)) == 3
    v2.write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n")
    assert supervisor.oom_kills((v2, v1)) == 2


def test_a_rank_whose_supervisor_is_gone_makes_its_peers_exit_as_their_children_did(tmp_path: Path) -> None:
    args = trainer(*TINY, "--steps", "100000", "--max-restarts", "3", "--pg-timeout-seconds", "60")
    ports = free_ports(2)
    with processes() as procs:
        rank0 = procs.start(args, rank_env(0, 2, ports))
        rank1 = procs.start(args, rank_env(1, 2, ports))
        read_until(rank0, "step=5/")
        rank1.kill()  # the supervisor alone, as when its container's main process dies: its child goes with it
        done = procs.wait(rank0, timeout=120)
    assert done.returncode == exits.EXIT_RETRYABLE, done.stdout + done.stderr
    assert "restarting the gang in place" not in done.stderr, done.stderr


def test_the_fork_server_imports_without_touching_cuda_so_each_child_can_start_it() -> None:
    # CUDA cannot be initialized again in a forked child: the fork server must not start it (nor ask about it).
    probe = f"""
import torch, torch.cuda
calls = []
for name in ("_lazy_init", "is_available", "device_count", "init"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
for module in {list(supervisor.PRELOAD)!r}:
    __import__(module)
print(calls, torch.cuda.is_initialized())
"""
    done = subprocess.run([sys.executable, "-c", probe], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[] False", done.stdout + done.stderr
