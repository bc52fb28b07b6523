"""Child processes that cannot outlive the box.

Each component runs in its own session, so a Ctrl-C in the terminal reaches only
the box, which then stops its children in order. PR_SET_PDEATHSIG makes the
kernel kill a child if the box itself dies (SIGKILL, a crashed test run), so no
process is ever left behind. The box only ever signals processes it started.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddpjob_box.errors import BoxError

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGKILL when the thread that started it exits."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def exited(pid: int) -> bool:
    """No such process, or a zombie its parent has not reaped yet (``kill(pid, 0)`` still finds those)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


class Component:
    """One long-running child process with its log file."""

    @classmethod
    def box_module(cls, name: str, module: str, args: Sequence[str], log_path: Path) -> Component:
        """``python -m <module> args`` of this package, importable whether or not the project is installed."""
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        return cls(name, [sys.executable, "-m", module, *args], log_path, env=env)

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self, when: str = "during startup") -> None:
        """Raise a one-line error, followed by the log tail, if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise BoxError(
                f"{self.name} exited with code {self.proc.returncode} {when}; "
                f"its log ({self.log_path}) ends with:\n{tail(self.log_path)}"
            )

    def stop(self, grace: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(predicate_desc: str, predicate: object, timeout: float, *, watch: Sequence[Component] = ()) -> None:
    """Poll ``predicate`` until true; fail early if a watched component dies."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while True:
        for component in watch:
            component.check_alive()
        if predicate():
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {c.name} ({c.log_path}):\n{tail(c.log_path)}" for c in watch)
            raise BoxError(f"timed out after {timeout:.0f}s waiting for {predicate_desc}\n{logs}")
        time.sleep(0.2)
