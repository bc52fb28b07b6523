"""Start trainer processes for tests: free ports, a clean environment, and cleanup on every path."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DUMP = Path(__file__).with_name("run_and_dump.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
TIMEOUT = 240.0
# Tiny and fast on a 2-core CPU: the shape every multi-process test trains.
TINY = (
    "--model", "tinycnn", "--image-size", "16", "--batch-size", "4", "--synthetic-samples", "64",
    "--num-workers", "0", "--log-interval", "1",
)  # fmt: skip


def free_ports(n: int) -> int:
    """A port p such that p..p+n-1 were all free a moment ago."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no run of free ports found")


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without anything a launcher or the trainer would read."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CHECKPOINT_DIR", "METRICS_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("TRAIN_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "contract"), str(REPO / "trainer"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"  # two ranks share two cores
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """What the operator injects for one rank."""
    return clean_env(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra,
    )  # fmt: skip


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


class Procs:
    """Processes started in their own session, so each can be killed with whatever it started."""

    def __init__(self, scratch: Path) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        # their TMPDIR: torchrun leaves its log directory (torchelastic_*) there
        self.scratch = scratch

    def start(self, args: Sequence[str], env: Mapping[str, str], cwd: Path = REPO) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            list(args), env={**env, "TMPDIR": str(self.scratch)}, cwd=cwd, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self.procs.append(p)
        return p

    def wait(self, p: subprocess.Popen[str], timeout: float = TIMEOUT) -> Done:
        out, err = p.communicate(timeout=timeout)
        return Done(p.returncode, out, err)

    def wait_all(self, timeout: float = TIMEOUT) -> list[Done]:
        deadline = time.monotonic() + timeout
        return [self.wait(p, max(1.0, deadline - time.monotonic())) for p in self.procs]

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the group this test started, by its id
                except ProcessLookupError:
                    pass
                p.wait()
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()


@contextmanager
def processes() -> Iterator[Procs]:
    with tempfile.TemporaryDirectory(prefix="ddpjob-procs-") as scratch:
        procs = Procs(Path(scratch))
        try:
            yield procs
        finally:
            procs.kill_all()


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddp_trainer", *args]


def dumper(out: Path, *args: str) -> list[str]:
    """The trainer as a library: trains, then saves this rank's parameters to out/rank<R>.pt."""
    return [sys.executable, str(DUMP), str(out), *args]


def run_ranks(procs: Procs, command: Sequence[str], world: int = 2, **extra: str) -> list[Done]:
    """Start ``world`` ranks of ``command`` as the operator would, wait, and return them by rank."""
    port = free_ports(1)
    for rank in range(world):
        procs.start(command, rank_env(rank, world, port, **extra))
    done = procs.wait_all()
    procs.procs.clear()
    return done


def read_until(p: subprocess.Popen[str], text: str) -> None:
    """Read ``p``'s stdout up to the first line with ``text`` in it (a step the test waits for); fails if its
    output ends first."""
    assert p.stdout is not None
    while text not in (line := p.stdout.readline()):
        assert line, f"its output ended before a line with {text!r}"


def explain(done: Sequence[Done]) -> str:
    return "\n".join(
        f"--- rank {i} rc={d.returncode}\n{d.stdout[-3000:]}\n{d.stderr[-3000:]}" for i, d in enumerate(done)
    )
